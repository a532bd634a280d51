#version 450
// y[i] = a * x[i] + b * y[i] + c   for i < n.
// The smallest real kernel: gradient zeroing (a=b=c=0), scaling, copying, accumulation; `catchat
// doctor` and the chained-dispatch ordering test run it. As in BLAS, a zero coefficient means its
// operand is not read: fresh device memory may hold NaN bit patterns, and 0 * NaN is NaN.
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; float a; float b; float c; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) return;
    float r = 0.0;
    if (pc.a != 0.0) r = pc.a * x[i];
    if (pc.b != 0.0) r += pc.b * y[i];
    y[i] = r + pc.c;
}
