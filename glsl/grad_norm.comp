#version 450
// Global gradient norm: stats[ST_GRAD_NORM_SQ] = sum(g^2) over g = grads[offset : offset + n].
// Deterministic two-pass reduction, no float atomics:
//   pass 1 (default):            workgroup w sums its ITEMS*WG contiguous elements into partials[w]
//   pass 2 (-DGRAD_NORM_FINAL):  one workgroup sums partials[0 .. n_partials) in a fixed order.
// Each thread sums ITEMS elements (pass 1, strided by WG: coalesced) or a strided run of partials
// (pass 2, Kahan-compensated), then a shared-memory tree combines the WG thread sums.
//
// Non-finite values are tracked with integer bit tests, not float arithmetic: Vulkan lets a
// driver assume floats are never NaN/Inf unless SignedZeroInfNanPreserve is declared, so
// isnan()/isinf() or NaN propagation through sums may be optimised away. A NaN anywhere makes
// the result NaN; otherwise an Inf anywhere makes it +Inf (as float64 numpy would give).
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0) in;                 // WG threads, a power of two
layout(constant_id = 1) const uint ITEMS = 8u;  // pass 1: elements per thread

// VEC4 (pass 1; n and offset multiples of 4): each of a thread's ITEMS is a vec4 of 4 consecutive
// elements, one 16-byte load (v5's 76 M gradients: 9,300 partials instead of 37,000, and a quarter of the
// loads), its squares added in element order.
#ifdef VEC4
layout(set = 0, binding = 0) readonly buffer Grads { vec4 grads4[]; };  // [>= (offset + n) / 4]
const uint LANE = 4u;  // elements per item
#else
layout(set = 0, binding = 0) readonly buffer Grads { float grads[]; };  // [>= offset + n]
const uint LANE = 1u;
#endif
layout(set = 0, binding = 1) buffer Partials { uint partials[]; };      // [n_partials] float bits
layout(set = 0, binding = 2) buffer Stats { uint stats[]; };            // [ST_WORDS]
layout(push_constant) uniform Push {
    uint n;           // elements to reduce
    uint offset;      // first element in grads
    uint n_partials;  // pass-1 workgroups = ceil(n / (WG * ITEMS * LANE))
} pc;

#define WG gl_WorkGroupSize.x
#define FLAG_INF 1u
#define FLAG_NAN 2u
#define BITS_INF 0x7f800000u
#define BITS_NAN 0x7fc00000u

shared float red_sum[WG];   // [WG] thread sums
shared uint red_flag[WG];   // [WG] thread non-finite flags

// FLAG_NAN / FLAG_INF / 0 from a float's bits (exponent all ones: non-finite).
uint nonfinite_flag(uint bits) {
    if ((bits & 0x7f800000u) != 0x7f800000u) return 0u;
    return (bits & 0x007fffffu) != 0u ? FLAG_NAN : FLAG_INF;
}

// Tree-combine every thread's (sum, flag); returns the word thread 0 stores: float bits of the
// sum, or NaN / +Inf bits when a flag is set.
uint workgroup_result(float sum, uint flag) {
    uint t = gl_LocalInvocationID.x;
    red_sum[t] = sum;
    red_flag[t] = flag;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            red_sum[t] += red_sum[t + s];
            red_flag[t] |= red_flag[t + s];
        }
        barrier();
    }
    uint f = red_flag[0];
    if ((f & FLAG_NAN) != 0u) return BITS_NAN;
    if ((f & FLAG_INF) != 0u) return BITS_INF;
    return floatBitsToUint(red_sum[0]);
}

void main() {
    uint t = gl_LocalInvocationID.x;
#ifndef GRAD_NORM_FINAL
    uint base = gl_WorkGroupID.x * WG * ITEMS;  // in items
    float sum = 0.0;
    uint flag = 0u;
    for (uint k = 0u; k < ITEMS; ++k) {
        uint i = base + k * WG + t;
        if (i < pc.n / LANE) {
#ifdef VEC4
            vec4 g = grads4[pc.offset / 4u + i];
            for (uint c = 0u; c < 4u; ++c) {
                flag |= nonfinite_flag(floatBitsToUint(g[c]));
                sum += g[c] * g[c];
            }
#else
            float g = grads[pc.offset + i];
            flag |= nonfinite_flag(floatBitsToUint(g));
            sum += g * g;
#endif
        }
    }
    uint word = workgroup_result(sum, flag);
    if (t == 0u) partials[gl_WorkGroupID.x] = word;
#else
    // Kahan summation: a thread may see many partials (n_partials / WG) and plain float32
    // accumulation would lose ~count * eps; `precise` keeps the compensation from being folded.
    precise float sum = 0.0;
    precise float comp = 0.0;
    uint flag = 0u;
    for (uint i = t; i < pc.n_partials; i += WG) {
        uint bits = partials[i];
        flag |= nonfinite_flag(bits);
        precise float y = uintBitsToFloat(bits) - comp;
        precise float s = sum + y;
        comp = (s - sum) - y;
        sum = s;
    }
    uint word = workgroup_result(sum, flag);
    if (t == 0u) stats[ST_GRAD_NORM_SQ] = word;
#endif
}
