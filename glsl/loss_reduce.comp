#version 450
// Add one micro-batch's per-row loss outputs (cross_entropy.comp) to the step's `stats`:
//   stats[ST_LOSS_SUM] += sum of row_loss over valid rows (float bits)
//   stats[ST_TOP1] / [ST_TOP5] / [ST_N_VALID] += rows with flag bit1 / bit2 / bit0
// ONE workgroup: thread j sums rows j, j + WG, ... in order, then a fixed tree; no atomics, so the
// float total is bitwise reproducible (and no other workgroup touches stats concurrently).
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0) in;  // power of two

layout(push_constant) uniform Push { uint n_rows, loss_off, flags_off; } pc;

layout(set = 0, binding = 0) readonly buffer Loss_ { float row_loss[]; };   // [n_rows]
layout(set = 0, binding = 1) readonly buffer Flags_ { uint row_flags[]; };  // [n_rows]
layout(set = 0, binding = 2) buffer Stats_ { uint stats[]; };               // [ST_WORDS]

shared float s_loss[gl_WorkGroupSize.x];
shared uvec3 s_count[gl_WorkGroupSize.x];  // (top1, top5, valid)

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint lx = gl_LocalInvocationID.x;
    float loss = 0.0;
    uvec3 count = uvec3(0u);
    for (uint i = lx; i < pc.n_rows; i += WG) {
        uint f = row_flags[pc.flags_off + i];
        if ((f & 1u) != 0u) loss += row_loss[pc.loss_off + i];
        count += uvec3((f >> 1) & 1u, (f >> 2) & 1u, f & 1u);
    }
    s_loss[lx] = loss;
    s_count[lx] = count;
    barrier();
    for (uint h = WG / 2; h > 0; h >>= 1) {
        if (lx < h) {
            s_loss[lx] += s_loss[lx + h];
            s_count[lx] += s_count[lx + h];
        }
        barrier();
    }
    if (lx == 0u) {
        stats[ST_LOSS_SUM] = floatBitsToUint(uintBitsToFloat(stats[ST_LOSS_SUM]) + s_loss[0]);
        stats[ST_TOP1] += s_count[0].x;
        stats[ST_TOP5] += s_count[0].y;
        stats[ST_N_VALID] += s_count[0].z;
    }
}
