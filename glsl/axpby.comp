#version 450
// y[i] = a * x[i] + b * y[i] + c   for i < n.
// The smallest real kernel: gradient zeroing (a=b=c=0), scaling, copying, accumulation; `catchat
// doctor` and the chained-dispatch ordering test run it. As in BLAS, a zero coefficient means its
// operand is not read: fresh device memory may hold NaN bit patterns, and 0 * NaN is NaN.
// HALF: x and y are float16 (two to a 32-bit word of the kp tensor) and the arithmetic is float16:
// the device's half-precision check (shaderFloat16 + storageBuffer16BitAccess, kp patch 0005).
// HYPER_A=slot: a is the float in word `slot` of the hyper buffer (binding 2) instead of the push
// constant: a factor that changes every step in a sequence recorded once (the fp16 loss scale's 1/S).
// VEC4 (float32, n a multiple of 4): a thread per 4 elements, one 16-byte load and store each (the fp16
// program's unscale of v5's 76 M gradients took 0.91 ms as a thread per element on an H100).
#ifdef HALF
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#define REAL float16_t
#define SCALAR float16_t
#elif defined(VEC4)
#define REAL vec4
#define SCALAR float
#else
#define REAL float
#define SCALAR float
#endif
#include "common.glsl"

layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer X { REAL x[]; };
layout(set = 0, binding = 1) buffer Y { REAL y[]; };
layout(push_constant) uniform Push { uint n; float a; float b; float c; } pc;
#ifdef HYPER_A
layout(set = 0, binding = 2) readonly buffer Hyper { uint hyper[]; };
#define A uintBitsToFloat(hyper[HYPER_A])
#else
#define A pc.a
#endif

void main() {
    uint i = gl_GlobalInvocationID.x;
#ifdef VEC4
    if (i >= pc.n / 4u) return;
#else
    if (i >= pc.n) return;
#endif
    REAL r = REAL(0.0);
    if (A != 0.0) r = SCALAR(A) * x[i];
    if (pc.b != 0.0) r += SCALAR(pc.b) * y[i];
    y[i] = r + SCALAR(pc.c);
}
