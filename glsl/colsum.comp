#version 450
// Column sums: out[s*N + n] (+)= sum over rows r in split s of A[a_off + r*lda + n].
//   A [M,N] row-major at a_off with leading dim lda; rows split into chunks of rows_per_split.
//   accumulate = 1: out += sum (bias gradients into `grads`); 0: out = sum (split partials).
// Deterministic: thread (x, y) sums rows y, y + WY, ... of its chunk in order, then a fixed tree
// over y. Split-K over rows is two dispatches of this shader: partials [S,N] into a workspace
// (accumulate 0), then the same kernel over those S rows (accumulate 1).
#include "common.glsl"

layout(local_size_x_id = 0, local_size_y_id = 1) in;  // x: columns, y: row lanes (power of two)

layout(set = 0, binding = 0) readonly buffer A_ { float A[]; };  // [M,N]
layout(set = 0, binding = 1) buffer Out_ { float outv[]; };      // [S,N] at out_off

layout(push_constant) uniform Push {
    uint M, N, a_off, lda, out_off, rows_per_split, accumulate;
} pc;

shared float part[gl_WorkGroupSize.x * gl_WorkGroupSize.y];  // [WY][WX]

void main() {
    const uint WX = gl_WorkGroupSize.x, WY = gl_WorkGroupSize.y;
    uint lx = gl_LocalInvocationID.x, ly = gl_LocalInvocationID.y;
    uint n = gl_WorkGroupID.x * WX + lx;
    uint s = gl_WorkGroupID.y;
    uint r_begin = s * pc.rows_per_split;
    uint r_end = min(pc.M, r_begin + pc.rows_per_split);

    float sum = 0.0;
    if (n < pc.N)
        for (uint r = r_begin + ly; r < r_end; r += WY) sum += A[pc.a_off + r * pc.lda + n];
    part[ly * WX + lx] = sum;
    barrier();
    for (uint h = WY / 2; h > 0; h /= 2) {
        if (ly < h) part[ly * WX + lx] += part[(ly + h) * WX + lx];
        barrier();
    }
    if (ly == 0 && n < pc.N) {
        uint idx = pc.out_off + s * pc.N + n;
        outv[idx] = pc.accumulate != 0 ? outv[idx] + part[lx] : part[lx];
    }
}
