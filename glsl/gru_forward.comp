#version 450
// One GRU timestep t (PyTorch gate order r, z, n), the recurrent matmul fused with the gates:
//   hp  = (t == 0 ? h0 : o[t-1]) * (1 - reset[t,b])                        // [B,H]
//   gh  = hp @ W_hh^T + b_hh                                               // [B,3H]
//   r = sigmoid(gi_r + gh_r);  z = sigmoid(gi_z + gh_z);  n = tanh(gi_n + r * gh_n)
//   o[t] = (1 - z) * n + z * hp;  save[t] = (r, z, n, gh_n);  hT = o[T-1];  hprev[0] = hp (t == 0 only)
// The state entering step t >= 1 is o[t-1] (before its reset): a caller that passes o's buffer as
// hprev at hprev_off = o_off - B*H gets the whole state sequence as rows [0, T) of one buffer
// without a second copy (the backward sweep applies the resets, gru_backward.comp).
// gi = x @ W_ih^T + b_ih for all t comes from a GEMM beforehand. One dispatch runs the steps
// [t, t_end) (push constants): per-step mode dispatches one step at a time (t_end = t + 1, one
// workgroup per tile); PERSISTENT mode runs a whole sweep in one dispatch of co-resident
// workgroups that walk the tiles grid-stride and meet at a grid barrier between steps (see
// grid_sync in include/grid_sync.glsl).
// Work split: workgroup (wx, wy) owns units j in [wx*TJ, +TJ) for lanes b in [wy*TB, +TB), i.e.
// rows j, H+j, 2H+j of W_hh. Thread (tx, ty, tz) owns RJ units x RB lanes (x 3 gates) in
// registers; the KS slices tz split each k chunk (vec4 columns tz, tz+KS, ...) and are summed in
// slice order at the end (deterministic). K = H is walked in chunks of KC staged in shared memory
// row-major (hp rows [TB][KC], W rows [3TJ][KC], rows padded by 4 floats so the vec4 reads of a
// quarter-warp hit distinct banks).
// HALF_W: W_hh comes from a float16 copy (binding 11, w_off counted in halves; b_hh stays in
// params at b_off), widened as it is staged: half the bytes of the sweep's largest stream, the same
// float32 arithmetic (the mixed-precision plan, docs/benchmarks.md).
#extension GL_EXT_control_flow_attributes : require
#ifdef HALF_W
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "common.glsl"

// Register block and k chunk are defines (compile-time) so the loops over them unroll and the
// accumulators stay in registers.
#ifndef RJ
#define RJ 1  // units per thread
#endif
#ifndef RB
#define RB 1  // lanes per thread
#endif
#ifndef KC
#define KC 32  // k chunk (a multiple of 4)
#endif
// Staged elements per thread per chunk, ceil(TB*KC / NT) and ceil(3*TJ*KC / NT): compile-time so
// the loads of a chunk are issued back to back into registers (and the next chunk's are in flight
// while this one is multiplied) instead of waiting one L2 round trip each.
#ifndef LH
#define LH 8
#endif
#ifndef LW
#define LW 12
#endif
const uint KQ = KC / 4;  // vec4 per staged row
const uint RS = KQ + 1;  // row stride in vec4

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;  // NTJ x NTB x KS
const uint NTJ = gl_WorkGroupSize.x;
const uint NTB = gl_WorkGroupSize.y;
const uint KS = gl_WorkGroupSize.z;
const uint NT = NTJ * NTB * KS;
const uint TJ = NTJ * RJ;  // units per workgroup
const uint TB = NTB * RB;  // lanes per workgroup
const uint NACC = 3 * RB * RJ;

layout(set = 0, binding = 0) readonly buffer Gi { float gi[]; };        // [T,B,3H] at gi_off
layout(set = 0, binding = 1) readonly buffer P { float params[]; };     // W_hh [3H,H] at w_off, b_hh [3H]
layout(set = 0, binding = 2) readonly buffer H0 { float h0[]; };        // [B,H] at h0_off
layout(set = 0, binding = 3) readonly buffer Resets { uint resets[]; }; // [T,B] 1 = state reset before t
// SWEEP_COHERENT (common.glsl): o[t-1] comes from other workgroups of a persistent dispatch
layout(set = 0, binding = 4) SWEEP_COHERENT writeonly buffer Out { float o[]; };  // [T,B,H] at o_off (writes o[t])
layout(set = 0, binding = 5) writeonly buffer Hprev { float hprev[]; }; // [B,H] at hprev_off (row 0 of the state sequence)
layout(set = 0, binding = 6) writeonly buffer Save { float save[]; };   // [T,B,4H] at save_off: r, z, n, ghn
layout(set = 0, binding = 7) writeonly buffer HT { float hT[]; };       // [B,H] at hT_off (t == T-1)
layout(set = 0, binding = 8) SWEEP_COHERENT readonly buffer Prev { float o_in[]; };  // o again (same tensor):
                                                                        // o[t-1] via a read-only binding
layout(push_constant) uniform Push {
    uint t; uint T; uint B; uint H;
    uint gi_off; uint w_off; uint b_off; uint h0_off; uint o_off; uint hprev_off; uint save_off; uint hT_off;
    uint t_end;  // steps [t, t_end)
} pc;
layout(set = 0, binding = 10) buffer Stats { uint stats[]; };  // ST_SYNC_TIMEOUTS (+=, PERSISTENT)
#ifdef HALF_W
layout(set = 0, binding = 11) readonly buffer W16 { float16_t w16[]; };  // W_hh [3H,H] at w_off
#define W_HH(i) float(w16[i])
#else
#define W_HH(i) params[i]
#endif
#define SYNC_BINDING 9
#include "grid_sync.glsl"

shared vec4 hs[TB * RS];      // hs[bb * RS + kq] = hp[b0 + bb, k0 + 4kq .. 4kq+3]
shared vec4 ws[3 * TJ * RS];  // ws[(g * TJ + jj) * RS + kq] = W_hh[g*H + j0 + jj, k0 + 4kq ..]
const uint NP = NTJ * NTB * (KS > 1u ? KS - 1u : 1u);  // threads of slices 1..KS-1
shared float red[NACC * NP];  // their partials: red[a * NP + tid - NTJ * NTB], a = (g*RB + rb)*RJ + rj

// The state entering step t for lane b, unit k, after the reset (b < B, k < H).
float h_prev(uint t, uint b, uint k) {
    float h = t == 0u ? h0[pc.h0_off + b * pc.H + k] : o_in[pc.o_off + ((t - 1u) * pc.B + b) * pc.H + k];
    return h * (1.0 - float(resets[t * pc.B + b]));
}

// Staging element e of the hp tile / W tile for the chunk at k0 (0 outside the tile or the matrix).
float h_elem(uint t, uint e, uint k0, uint b0) {
    uint bb = e / KC, b = b0 + bb, k = k0 + e % KC;
    return (bb < TB && b < pc.B && k < pc.H) ? h_prev(t, b, k) : 0.0;
}
float w_elem(uint e, uint k0, uint j0) {
    uint row = e / KC, g = row / TJ, j = j0 + row % TJ, k = k0 + e % KC;
    return (row < 3u * TJ && j < pc.H && k < pc.H) ? W_HH(pc.w_off + (g * pc.H + j) * pc.H + k) : 0.0;
}

// Step t on the tile of units [j0, +TJ) x lanes [b0, +TB).
void step_tile(uint t, uint j0, uint b0) {
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y, tz = gl_LocalInvocationID.z;
    uint tid = (tz * NTB + ty) * NTJ + tx;
    uint H = pc.H, B = pc.B;

    float acc[3][RB][RJ];  // gh of gate g for lane b0 + ty + rb*NTB, unit j0 + tx + rj*NTJ
    [[unroll]] for (uint g = 0u; g < 3u; ++g)
        [[unroll]] for (uint rb = 0u; rb < RB; ++rb)
            [[unroll]] for (uint rj = 0u; rj < RJ; ++rj) acc[g][rb][rj] = 0.0;

    float ph[LH], pw[LW];  // the next chunk's staging elements, e = tid + i * NT (consecutive k)
    [[unroll]] for (uint i = 0u; i < LH; ++i) ph[i] = h_elem(t, tid + i * NT, 0u, b0);
    [[unroll]] for (uint i = 0u; i < LW; ++i) pw[i] = w_elem(tid + i * NT, 0u, j0);
    for (uint k0 = 0u; k0 < H; k0 += KC) {
        [[unroll]] for (uint i = 0u; i < LH; ++i) {
            uint e = tid + i * NT;
            if (e < TB * KC) hs[(e / KC) * RS + (e % KC) / 4u][e % 4u] = ph[i];
        }
        [[unroll]] for (uint i = 0u; i < LW; ++i) {
            uint e = tid + i * NT;
            if (e < 3u * TJ * KC) ws[(e / KC) * RS + (e % KC) / 4u][e % 4u] = pw[i];
        }
        barrier();
        if (k0 + KC < H) {  // prefetch the next chunk: in flight during this chunk's FMAs
            [[unroll]] for (uint i = 0u; i < LH; ++i) ph[i] = h_elem(t, tid + i * NT, k0 + KC, b0);
            [[unroll]] for (uint i = 0u; i < LW; ++i) pw[i] = w_elem(tid + i * NT, k0 + KC, j0);
        }
        for (uint kq = tz; kq < KQ; kq += KS) {
            vec4 hv[RB];
            [[unroll]] for (uint rb = 0u; rb < RB; ++rb) hv[rb] = hs[(ty + rb * NTB) * RS + kq];
            [[unroll]] for (uint g = 0u; g < 3u; ++g) {
                [[unroll]] for (uint rj = 0u; rj < RJ; ++rj) {
                    vec4 w = ws[(g * TJ + tx + rj * NTJ) * RS + kq];
                    [[unroll]] for (uint rb = 0u; rb < RB; ++rb) {
                        float a = acc[g][rb][rj];
                        a = fma(w.x, hv[rb].x, a); a = fma(w.y, hv[rb].y, a);
                        a = fma(w.z, hv[rb].z, a); a = fma(w.w, hv[rb].w, a);
                        acc[g][rb][rj] = a;
                    }
                }
            }
        }
        barrier();
    }

    if (KS > 1u) {  // slices 1.. park their partials, slice 0 adds them in slice order
        uint NXY = NTJ * NTB;
        [[unroll]] for (uint g = 0u; g < 3u; ++g) {
            [[unroll]] for (uint rb = 0u; rb < RB; ++rb) {
                [[unroll]] for (uint rj = 0u; rj < RJ; ++rj) {
                    if (tz > 0u) red[((g * RB + rb) * RJ + rj) * NP + tid - NXY] = acc[g][rb][rj];
                }
            }
        }
        barrier();
        for (uint z = 1u; tz == 0u && z < KS; ++z) {
            uint src = (z - 1u) * NXY + ty * NTJ + tx;
            [[unroll]] for (uint g = 0u; g < 3u; ++g) {
                [[unroll]] for (uint rb = 0u; rb < RB; ++rb) {
                    [[unroll]] for (uint rj = 0u; rj < RJ; ++rj) acc[g][rb][rj] += red[((g * RB + rb) * RJ + rj) * NP + src];
                }
            }
        }
    }

    [[unroll]] for (uint rb = 0u; rb < RB; ++rb) {
        uint b = b0 + ty + rb * NTB;
        [[unroll]] for (uint rj = 0u; rj < RJ; ++rj) {
            uint j = j0 + tx + rj * NTJ;
            if (tz > 0u || b >= B || j >= H) continue;  // slice 0 owns the outputs
            uint row = t * B + b;  // (t, b)
            uint gib = pc.gi_off + row * 3u * H;
            float ghr = acc[0][rb][rj] + params[pc.b_off + j];
            float ghz = acc[1][rb][rj] + params[pc.b_off + H + j];
            float ghn = acc[2][rb][rj] + params[pc.b_off + 2u * H + j];
            float r = sigmoid(gi[gib + j] + ghr);
            float z = sigmoid(gi[gib + H + j] + ghz);
            float n = tanh_safe(gi[gib + 2u * H + j] + r * ghn);
            float hp = h_prev(t, b, j);
            float h = (1.0 - z) * n + z * hp;
            o[pc.o_off + row * H + j] = h;
            if (t == 0u) hprev[pc.hprev_off + b * H + j] = hp;
            uint sb = pc.save_off + row * 4u * H;
            save[sb + j] = r;
            save[sb + H + j] = z;
            save[sb + 2u * H + j] = n;
            save[sb + 3u * H + j] = ghn;
            if (t + 1u == pc.T) hT[pc.hT_off + b * H + j] = h;
        }
    }
    barrier();  // `red` and the staging tiles are reused by the next tile
}

void main() {
    uint n_tj = ceil_div(pc.H, TJ), n_tiles = n_tj * ceil_div(pc.B, TB);
    for (uint t = pc.t; t < pc.t_end; ++t) {
        for (uint tile = gl_WorkGroupID.x; tile < n_tiles; tile += gl_NumWorkGroups.x)
            step_tile(t, (tile % n_tj) * TJ, (tile / n_tj) * TB);
#ifdef PERSISTENT
        if (t + 1u < pc.t_end && !grid_sync(t + 1u - pc.t)) break;
#endif
    }
#ifdef PERSISTENT
    grid_sync_done(1u);
#endif
}
