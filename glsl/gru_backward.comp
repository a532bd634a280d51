#version 450
// GRU backward sweep, one fused step per s = T, T-1, ..., 0. A dispatch runs n_steps of them
// from s down (push constants): one per dispatch (per-step mode, one workgroup per tile), or the
// whole sweep in one dispatch of co-resident workgroups (PERSISTENT: tiles grid-stride, a grid
// barrier between steps, include/grid_sync.glsl). Step s:
//   if s < T (the recurrent matmul of step s):
//     dh = (dhz[b,k] + sum_r dGh[s,b,r] * W_hh[r,k]) * (1 - reset[s,b])   // into h_{s-1}
//     if s >= 1 and c > 0: count |dh| > c into stats[ST_CLAMP_HITS], clamp to [-c, c]
//     if s == 0: dh0 = dh, done
//   else (s == T): dh = 0 (truncated at the window edge)
//   gate backward of step u = s - 1, elementwise on the same (b, k):
//     hp = hprev[u] * (1 - reset[u,b])   (zeroed in memory where the reset cut: see below)
//     dhtot = dh + do[u];  dn = dhtot (1 - z);  dz = dhtot (hp - n);  dhz = dhtot z
//     dan = dn (1 - n^2);  daz = dz z (1 - z);  dar = dan ghn r (1 - r)
//     dGi[u] = (dar, daz, dan);  dGh[u] = (dar, daz, dan * r)
// hprev is the state sequence of the forward sweep: row 0 the state entering the window (after
// its reset), row u >= 1 the output o[u-1] (before the reset: the caller passes o's buffer one row
// block earlier, gru_forward.comp). The reset is applied here, and where it cut (reset[u,b] = 1)
// the row is written back as zeros by dispatch u (after dispatch u+1's gate backward read it, and
// after the norm backward read it as o[u-1]: in the layer wavefront, that of the chunk below the one
// ending at u), so after the sweep rows [0, T) are exactly the states entering each step: what the
// dW_hh GEMM reads. dGh rows are dgh_ld apart: 3H in a buffer of their own,
// or 4H when dGh is written over save's r, z, n (dgh_off = save_off): each element's gate
// backward reads its r, z, n, ghn before it writes its dGh there, and nothing reads save[u]
// after that (z[u] travels on as dhz), so dGh needs no buffer of its own.
// Thread (b, k) owns element (b, k) in every dispatch: it is the only reader and writer of
// dhz[b,k] (kept from one dispatch to the next), of hprev[u, b, k] and hprev[s, b, k], of save[u, b, {k, H+k,
// 2H+k, 3H+k}] and of dGi/dGh[u, b, {k, H+k, 2H+k}]. Dispatch s reads dGh[s] (all rows: written
// by the previous dispatch) and writes dGh[s-1]: no two dispatches in flight touch the same words.
// Matmul tiling: workgroup owns columns k in [wx*TK, +TK) for lanes [wy*TB, +TB); thread (tx, ty)
// owns RQ groups of 4 consecutive columns x RB lanes; the 3H rows are walked in chunks of RC
// staged in shared memory (dGh [RC][TB], W_hh [RC][TK] row-major), the KS slices tz split each
// chunk's rows (tz, tz+KS, ...) and are summed in slice order (deterministic).
#extension GL_EXT_control_flow_attributes : require
#ifdef HALF_W
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "common.glsl"
#include "slots.glsl"

#ifndef RQ
#define RQ 1  // groups of 4 columns per thread
#endif
#ifndef RB
#define RB 1  // lanes per thread
#endif
#ifndef RC
#define RC 32  // rows of W_hh per shared-memory chunk
#endif
// Staged elements per thread per chunk, ceil(TB*RC / NT) and ceil(RC*TK / NT): compile-time so
// a chunk's loads are issued back to back into registers and the next chunk's are in flight
// while this one is multiplied.
#ifndef LG
#define LG 8
#endif
#ifndef LW
#define LW 32
#endif

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;  // NTK x NTB x KS
const uint NTK = gl_WorkGroupSize.x;
const uint NTB = gl_WorkGroupSize.y;
const uint KS = gl_WorkGroupSize.z;
const uint NT = NTK * NTB * KS;
const uint TK4 = NTK * RQ;  // vec4 columns per workgroup
const uint TK = 4 * TK4;    // columns per workgroup
const uint TB = NTB * RB;   // lanes per workgroup
const uint GS = TB + 1;     // padded: the staging stores are rr-major
const uint NACC = 4 * RB * RQ;

layout(set = 0, binding = 0) readonly buffer Do { float dO[]; };        // [T,B,H] at do_off
layout(set = 0, binding = 1) readonly buffer Save { float save[]; };    // [T,B,4H] at save_off: r, z, n, ghn
layout(set = 0, binding = 2) buffer Hprev { float hprev[]; };           // [T,B,H] at hprev_off (reset rows zeroed)
layout(set = 0, binding = 3) readonly buffer Resets { uint resets[]; }; // [T,B]
layout(set = 0, binding = 4) readonly buffer P { float params[]; };     // W_hh [3H,H] at w_off
layout(set = 0, binding = 5) readonly buffer Hyper { uint hyper[]; };   // HP_GRADH_CLAMP
layout(set = 0, binding = 6) buffer Dhz { float dhz[]; };               // [B,H] scratch: dhtot * z
layout(set = 0, binding = 7) writeonly buffer Dgi { float dgi[]; };     // [T,B,3H] at dgi_off
// SWEEP_COHERENT (common.glsl): dGh[s] comes from other workgroups of a persistent dispatch
layout(set = 0, binding = 8) SWEEP_COHERENT buffer Dgh { float dgh[]; };  // [T,B,3H] rows dgh_ld apart at dgh_off
layout(set = 0, binding = 9) writeonly buffer Dh0 { float dh0[]; };     // [B,H] at dh0_off
layout(set = 0, binding = 10) buffer Stats { uint stats[]; };           // ST_CLAMP_HITS (+=)
layout(push_constant) uniform Push {
    uint s; uint T; uint B; uint H;
    uint w_off; uint do_off; uint save_off; uint hprev_off; uint dgi_off; uint dgh_off; uint dh0_off;
    uint dgh_ld;   // words between dGh rows: 3H, or 4H over save
    uint n_steps;  // steps s, s-1, ..., s-n_steps+1
} pc;
#ifdef HALF_W  // W_hh from a float16 copy, w_off in halves (as gru_forward.comp's HALF_W)
layout(set = 0, binding = 12) readonly buffer W16 { float16_t w16[]; };  // W_hh [3H,H] at w_off
#define W_HH(i) float(w16[i])
#else
#define W_HH(i) params[i]
#endif
#define SYNC_BINDING 11
#include "grid_sync.glsl"

shared float gs[RC * GS];   // gs[rr * GS + bb] = dGh[s, b0 + bb, r0 + rr]
shared vec4 ws[RC * TK4];   // ws[rr * TK4 + kq] = W_hh[r0 + rr, k0 + 4kq .. 4kq+3]
const uint NP = NTK * NTB * (KS > 1u ? KS - 1u : 1u);  // threads of slices 1..KS-1
shared float red[NACC * NP];  // their partials: red[a * NP + tid - NTK * NTB], a = (rb*RQ + q)*4 + i
shared uint hits;

// Staging element e of the dGh tile / W tile for the chunk at r0 (0 outside the tile or the matrix).
float g_elem(uint s, uint e, uint r0, uint b0) {
    uint bb = e / RC, b = b0 + bb, r = r0 + e % RC, R3 = 3u * pc.H;
    return (bb < TB && b < pc.B && r < R3) ? dgh[pc.dgh_off + (s * pc.B + b) * pc.dgh_ld + r] : 0.0;
}
float w_elem(uint e, uint r0, uint k0) {
    uint rr = e / TK, r = r0 + rr, k = k0 + e % TK;
    return (rr < RC && r < 3u * pc.H && k < pc.H) ? W_HH(pc.w_off + r * pc.H + k) : 0.0;
}

// Gate backward of step u for lane b, unit k, given dh = the gradient on h_u from step u+1.
void gate_backward(uint u, uint b, uint k, float dh) {
    uint H = pc.H, row = u * pc.B + b;
    float dht = dh + dO[pc.do_off + row * H + k];
    uint sb = pc.save_off + row * 4u * H;
    float r = save[sb + k], z = save[sb + H + k], n = save[sb + 2u * H + k], ghn = save[sb + 3u * H + k];
    uint hi = pc.hprev_off + row * H + k;
    float hp = hprev[hi] * (1.0 - float(resets[row]));  // the state entering u is 0 where reset, not o[u-1]
    dhz[b * H + k] = dht * z;
    float dn = dht * (1.0 - z);
    float dz = dht * (hp - n);
    float dan = dn * (1.0 - n * n);
    float daz = dz * z * (1.0 - z);
    float dar = dan * ghn * r * (1.0 - r);
    uint gb = pc.dgi_off + row * 3u * H, hb = pc.dgh_off + row * pc.dgh_ld;
    dgi[gb + k] = dar;
    dgi[gb + H + k] = daz;
    dgi[gb + 2u * H + k] = dan;
    dgh[hb + k] = dar;
    dgh[hb + H + k] = daz;
    dgh[hb + 2u * H + k] = dan * r;
}

// Step s on the tile of columns [k0, +TK) x lanes [b0, +TB).
void step_tile(uint s, uint k0, uint b0) {
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y, tz = gl_LocalInvocationID.z;
    uint tid = (tz * NTB + ty) * NTK + tx;
    uint H = pc.H, B = pc.B, R3 = 3u * pc.H;
    float c = HPF(hyper, HP_GRADH_CLAMP);
    bool clamping = c > 0.0 && s >= 1u && s < pc.T;
    bool lead = tz == 0u;  // slice 0 owns the elements; the other slices only help the matmul

    vec4 dh[RB][RQ];  // gradient into h_{s-1}: lane b0 + ty + rb*NTB, columns k0 + 4(tx + q*NTK) + 0..3
    [[unroll]] for (uint rb = 0u; rb < RB; ++rb)
        [[unroll]] for (uint q = 0u; q < RQ; ++q) dh[rb][q] = vec4(0.0);
    if (tid == 0u) hits = 0u;

    if (s < pc.T) {  // uniform over the dispatch: the barriers inside are in uniform control flow
        float pg[LG], pw[LW];  // the next chunk's staging elements, e = tid + i * NT
        [[unroll]] for (uint i = 0u; i < LG; ++i) pg[i] = g_elem(s, tid + i * NT, 0u, b0);
        [[unroll]] for (uint i = 0u; i < LW; ++i) pw[i] = w_elem(tid + i * NT, 0u, k0);
        for (uint r0 = 0u; r0 < R3; r0 += RC) {
            [[unroll]] for (uint i = 0u; i < LG; ++i) {
                uint e = tid + i * NT;
                if (e < TB * RC) gs[(e % RC) * GS + e / RC] = pg[i];
            }
            [[unroll]] for (uint i = 0u; i < LW; ++i) {
                uint e = tid + i * NT;
                if (e < RC * TK) ws[(e / TK) * TK4 + (e % TK) / 4u][e % 4u] = pw[i];
            }
            barrier();
            if (r0 + RC < R3) {  // prefetch the next chunk: in flight during this chunk's FMAs
                [[unroll]] for (uint i = 0u; i < LG; ++i) pg[i] = g_elem(s, tid + i * NT, r0 + RC, b0);
                [[unroll]] for (uint i = 0u; i < LW; ++i) pw[i] = w_elem(tid + i * NT, r0 + RC, k0);
            }
            for (uint rr = tz; rr < RC; rr += KS) {
                float gv[RB];
                [[unroll]] for (uint rb = 0u; rb < RB; ++rb) gv[rb] = gs[rr * GS + ty + rb * NTB];
                [[unroll]] for (uint q = 0u; q < RQ; ++q) {
                    vec4 w = ws[rr * TK4 + tx + q * NTK];
                    [[unroll]] for (uint rb = 0u; rb < RB; ++rb) dh[rb][q] = fma(vec4(gv[rb]), w, dh[rb][q]);
                }
            }
            barrier();
        }
        if (KS > 1u) {  // slices 1.. park their partials, slice 0 adds them in slice order
            uint NXY = NTK * NTB;
            [[unroll]] for (uint rb = 0u; rb < RB; ++rb) {
                [[unroll]] for (uint q = 0u; q < RQ; ++q) {
                    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
                        if (!lead) red[((rb * RQ + q) * 4u + i) * NP + tid - NXY] = dh[rb][q][i];
                    }
                }
            }
            barrier();
            for (uint z = 1u; lead && z < KS; ++z) {
                uint src = (z - 1u) * NXY + ty * NTK + tx;
                [[unroll]] for (uint rb = 0u; rb < RB; ++rb) {
                    [[unroll]] for (uint q = 0u; q < RQ; ++q) {
                        [[unroll]] for (uint i = 0u; i < 4u; ++i) dh[rb][q][i] += red[((rb * RQ + q) * 4u + i) * NP + src];
                    }
                }
            }
        }
        uint my_hits = 0u;
        [[unroll]] for (uint rb = 0u; rb < RB; ++rb) {
            uint b = b0 + ty + rb * NTB;
            if (!lead || b >= B) continue;
            float carry = 1.0 - float(resets[s * B + b]);
            [[unroll]] for (uint q = 0u; q < RQ; ++q) {
                [[unroll]] for (uint i = 0u; i < 4u; ++i) {
                    uint k = k0 + 4u * (tx + q * NTK) + i;
                    if (k >= H) continue;
                    // the row the reset cut, written as the state it stands for (for dW_hh): row s at
                    // step s (step_inputs in gru_backward_stream.comp says why then)
                    if (carry == 0.0) hprev[pc.hprev_off + (s * B + b) * H + k] = 0.0;
                    float d = (dhz[b * H + k] + dh[rb][q][i]) * carry;
                    if (clamping && abs(d) > c) { my_hits += 1u; d = clamp(d, -c, c); }
                    if (s == 0u) dh0[pc.dh0_off + b * H + k] = d;
                    dh[rb][q][i] = d;
                }
            }
        }
        if (clamping) {  // one global atomic per workgroup
            if (my_hits > 0u) atomicAdd(hits, my_hits);
            barrier();
            if (tid == 0u && hits > 0u) atomicAdd(stats[ST_CLAMP_HITS], hits);
        }
    }
    if (s > 0u && lead) {
        [[unroll]] for (uint rb = 0u; rb < RB; ++rb) {
            uint b = b0 + ty + rb * NTB;
            if (b >= B) continue;
            [[unroll]] for (uint q = 0u; q < RQ; ++q) {
                [[unroll]] for (uint i = 0u; i < 4u; ++i) {
                    uint k = k0 + 4u * (tx + q * NTK) + i;
                    if (k < H) gate_backward(s - 1u, b, k, dh[rb][q][i]);
                }
            }
        }
    }
    barrier();  // shared memory (hits, red, staging) is reused by the next tile
}

void main() {
    uint n_tk = ceil_div(pc.H, TK), n_tiles = n_tk * ceil_div(pc.B, TB);
    for (uint i = 0u; i < pc.n_steps; ++i) {
        for (uint tile = gl_WorkGroupID.x; tile < n_tiles; tile += gl_NumWorkGroups.x)
            step_tile(pc.s - i, (tile % n_tk) * TK, (tile / n_tk) * TB);
#ifdef PERSISTENT
        if (i + 1u < pc.n_steps && !grid_sync(i + 1u)) break;
#endif
    }
#ifdef PERSISTENT
    grid_sync_done(1u);
#endif
}
