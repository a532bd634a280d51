#version 450
// The GRU backward sweep with W_hh streamed from a float16 copy on tensor cores: the backward of
// gru_forward_stream.comp (read its header). Same maths, buffers and push constants as
// gru_backward.comp (read its header for step s), with the product dGh[s] @ W_hh taken from
// float16 operands with float32 sums, as the COOP resident sweep's (the twin's recurrent="fp16").
// A slice is 16 columns k of dh for every lane (B <= 16 * LF), and the same 16 units' gate
// backward: the element (b, k) is owned by one thread in every step (its running gradient dhz
// in `dhz_mem`, read and written by it alone). The product is split by columns, so no partial
// sums go through memory: the slice's workgroup multiplies all of dGh[s] [BP lanes x 3H] by
// W_hh's [3H x 16] columns of the slice, straight from memory with fragment loads
// (include/sweep_frag.glsl). Subgroup sg (of 8 * LF) owns k-group sg (KPG 16-deep fragments of
// the 3H rows) for every lane fragment, so each W_hh fragment is loaded once per workgroup; the
// k-groups' partial blocks are summed through `red` in a fixed order (deterministic). RES and the
// split grid barrier as in the forward. KFLAGS as the forward's: a slice counts its three blocks of
// g16 (its units' r, z and n columns), each into the word of the k-group that reads it.
// dGh[s] comes from a float16 shadow `g16` [2][BP][3H] (lanes past B stay the zeros the host
// wrote; 16 x 16 blocks as the forward's h16): dispatch s reads g16[s % 2], and its gate
// backward of step s-1 writes g16[(s-1) % 2] beside dGh's float32 rows. At s = T there is no
// product (dh = 0).
// Persistent (PERSISTENT): workgroups walk the slices and meet at a grid barrier between steps;
// else one dispatch per step, a workgroup per slice.
// Needs H a multiple of 16 and w_off a multiple of 8 (16-byte fragment rows).
// F32: the same sweep in float32 on the threads' FMAs (the forward's F32): W_hh's rows read as vec4
// of the slice's columns straight from params (binding 13, w_off in floats, a multiple of 4), dGh
// from a float32 shadow `g4` (include/sweep_simt.glsl's layout); each subgroup a k-group as above,
// its operands for 2 quads of rows (W_hh's 8 rows of the slice's columns, dGh's lanes) loaded once,
// PD chunks ahead into a register ring, and staged through shared memory as the forward's F32; each
// invocation 4 columns for BP / 8 lanes, summed through the same `red` slots in the same order.
// SUBGROUP32 as there.
// SRES (not with F32): as the forward's, a 16 x 16 block per k-fragment.
// BIAS_SUMS: the bias gradients summed in the sweep (include/gru_backward_element.glsl).
// SAVE16 (not with F32): save holds float16 (the forward's SAVE16), and dGh's float32 rows hold its
// n third alone, [T,B,H] (dgh_ld = H): its r and z thirds equal dGi's, so the weight and bias
// gradients of W_hh's first 2H rows read them from dGi's.
#if defined(KFLAGS) && defined(PERSISTENT)  // block flags instead of the grid barrier (a dispatch per step has neither)
#define BLOCK_FLAGS
#define GROUP_STRIDE 32u  // each k-group's word in a 128-byte line of its own
#endif
#extension GL_EXT_control_flow_attributes : require
#ifndef F32
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#if defined(F32) && defined(SUBGROUP32)
#extension GL_KHR_memory_scope_semantics : require
// unused since the stage's barrier is controlBarrier; kept so the SPIR-V stays the one measured
#extension GL_KHR_shader_subgroup_basic : require
#endif
#if !defined(EMU) && !defined(F32)
#extension GL_KHR_memory_scope_semantics : require
#include "coopmat_ext.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#endif
#include "phase_clock.glsl"
#ifndef LF
#define LF 2    // lane fragments: B <= 16 * LF
#endif
#ifndef KPG
#define KPG 6   // 16-deep fragments of the 3H rows per k-group: 8 * LF * KPG * 16 >= 3H
#endif
#ifndef PD
#define PD 8    // fragments whose loads are in flight ahead of the product
#endif
#ifndef LG
#define LG 1    // lane groups of 16 * LF lanes, each its own recurrence: B <= 16 * LF * LG
#endif
#ifndef PROBE
#define PROBE 0 // timing probes (tools/gpu-check.sh; wrong results): 1 no W_hh loads, 2 no dGh loads
#endif
#ifndef RES
#define RES 0   // k-fragments per subgroup whose W_hh fragments stay in registers (one slice per workgroup)
#endif
#ifndef SRES
#define SRES 0  // the next k-fragments per subgroup whose W_hh fragments stay in shared memory (likewise)
#endif
#ifndef FULL
#define FULL false  // true: every k-group has KPG fragments (8 * LF * KPG * 16 == the product's depth)
#endif
#include "common.glsl"
#include "slots.glsl"

const uint KG = 8u;         // red's k-group slots
const uint KGS = 8u * LF;   // k-groups: one per subgroup
const uint BP = 16u * LF;   // lanes, padded
layout(local_size_x_id = 0) in;  // 256 * LF: 8 * LF subgroups of 32, a thread per element

layout(set = 0, binding = 0) readonly buffer Do { float dO[]; };        // [T,B,H] at do_off
#ifdef SAVE16  // float16 saves (save_off in halves; gru_forward_stream.comp's SAVE16)
layout(set = 0, binding = 1) readonly buffer Save { float16_t save[]; };  // [T,B,4H] at save_off: r, z, n, ghn
#define SAVE_R(i) float(save[i])
#else
layout(set = 0, binding = 1) readonly buffer Save { float save[]; };    // [T,B,4H] at save_off: r, z, n, ghn
#define SAVE_R(i) save[i]
#endif
layout(set = 0, binding = 2) buffer Hprev { float hprev[]; };           // [T,B,H] at hprev_off (reset rows zeroed)
layout(set = 0, binding = 3) readonly buffer Resets { uint resets[]; }; // [T,B]
layout(set = 0, binding = 5) readonly buffer Hyper { uint hyper[]; };   // HP_GRADH_CLAMP
layout(set = 0, binding = 6) buffer Dhz { float dhz_mem[]; };           // [B,H] scratch: dhtot * z
layout(set = 0, binding = 7) writeonly buffer Dgi { float dgi[]; };     // [T,B,3H] at dgi_off
layout(set = 0, binding = 8) writeonly buffer Dgh { float dgh[]; };     // [T,B,3H] rows dgh_ld apart at dgh_off
layout(set = 0, binding = 9) writeonly buffer Dh0 { float dh0[]; };     // [B,H] at dh0_off
layout(set = 0, binding = 10) buffer Stats { uint stats[]; };           // ST_CLAMP_HITS (+=)
#ifdef F32
layout(set = 0, binding = 12) SWEEP_COHERENT buffer G4 { vec4 g4[]; };   // [2][3H/4][BP] (shadow_q)
layout(set = 0, binding = 13) readonly buffer W32 { vec4 w4[]; };        // params again: W_hh [3H,H] at w_off
#else
layout(set = 0, binding = 12) SWEEP_COHERENT buffer G16 { float16_t g16[]; };  // [2][BP][3H] in blocks (shadow_at)
layout(set = 0, binding = 13) W16_QUAL buffer W16 { float16_t w16[]; }; // W_hh [3H,H] at w_off (halves)
#endif
layout(push_constant) uniform Push {
    uint s; uint T; uint B; uint H;
    uint w_off; uint do_off; uint save_off; uint hprev_off; uint dgi_off; uint dgh_off; uint dh0_off;
    uint dgh_ld;   // words between dGh rows: 3H, or 4H over save (gru_backward.comp)
    uint n_steps;  // steps s, s-1, ..., s-n_steps+1
} pc;
#define SYNC_BINDING 11
#include "grid_sync.glsl"

// red: RED((kg * LF + lf) * 256 + row * 16 + column) (F32: in `smem4`, with the stage)
#ifdef F32
#include "sweep_simt.glsl"
#define G_GROUP (2u * (3u * pc.H / 4u) * BP)  // vec4s of a lane group's shadow
#define G_STORE(p, b, c, cols, v) g4[((b) / BP) * G_GROUP + shadow_q(p, (b) % BP, c, cols)][(c) % 4u] = (v)
#else
shared float red[KG * LF * 256u];
#define RED(i) red[i]
#define A_BUF g16
#define B_BUF w16
#define ACC_SHARED red
#if SRES > 0  // k-group kg's shared fragment j at (kg * SRES + j) * 256, row-major
shared float16_t wsm[KGS * SRES * 256u];
#define B_SHARED wsm
#endif
#include "sweep_frag.glsl"
#define G_GROUP (2u * BP * 3u * pc.H)  // halves of a lane group's shadow
#define G_STORE(p, b, c, cols, v) g16[((b) / BP) * G_GROUP + shadow_at(p, (b) % BP, c, cols)] = float16_t(v)
#endif

#ifndef F32
// W_hh's fragment of rows 16 kf.. at columns k0..: (row, column) = W_hh[16 kf + row, k0 + column].
void load_w(uint k0, uint kf, out FRAG_B w) {
#if PROBE == 1  // timing probe: no W_hh loads (a constant fragment)
    w = FRAG_B(float16_t(1.0));
#else
    LOAD_B(w, w_block(16u * kf, k0), W_LD, false);
#endif
}

// dGh's fragment kf of the lane fragment whose blocks start at a: (lane, row) = dGh[s, lane, 16 kf + row].
void load_a(uint a, uint kf, out FRAG_A x) {
#if PROBE == 2  // timing probe: no dGh loads (a constant fragment)
    x = FRAG_A(float16_t(1.0));
#else
    LOAD_A(x, a + 256u * kf, 16u, false);
#endif
}

#if RES > 0
// The W_hh fragments of this subgroup's first RES k-fragments, loaded once per dispatch (a workgroup
// per slice: the host sets RES only then).
FRAG_B rw[RES];
#endif

#if LF == 2
#define LOAD_LANES(r, kf) load_a(a0, kf, x[r]); load_a(a1, kf, y[r])
#define MUL_LANES(r, w) p = MUL_ADD(x[r], w, p); q = MUL_ADD(y[r], w, q)
#else
#define LOAD_LANES(r, kf) load_a(a0, kf, x[r])
#define MUL_LANES(r, w) p = MUL_ADD(x[r], w, p)
#endif

// The slice's product dGh[s] @ W_hh[:, k0 .. k0+15] into red: subgroup kg multiplies its k-group
// (k-fragments kg * KPG .. of the 3H rows) for every lane fragment, each W_hh fragment loaded once
// per workgroup; with 16 k-groups, 8..15 store into red's 8 slots, then 0..7 add theirs (slot s =
// kg s+8 + kg s: deterministic). W_hh's operands come from the resident fragments (the first RES)
// and a ring of PD in flight, dGh's from a ring of PD. wait_k > 0: dGh waits for the grid barrier's
// crossing wait_k, after the ring's first W_hh loads are issued. false: the barrier was aborted.
bool product(uint s, uint k0, uint grp, uint kg, uint wait_k) {
    uint H = pc.H, n_kf = 3u * H / 16u, k1 = kg * KPG;
    const uint RS = RES + SRES;  // the first k-fragment whose W_hh streams through the ring
    FRAG_B w[PD];  // ring over the k-fragments past RS: k-fragment i in slot (i - RS) % PD
    [[unroll]] for (uint i = RS; i < KPG && i < RS + PD; ++i) {
        if (FULL || k1 + i < n_kf) load_w(k0, k1 + i, w[i - RS]);
    }
    if (!operand_wait(wait_k, kg, n_kf, KPG, grp * KGS)) return false;
    PHASE(pc.s - s, 1u);
    uint a0 = grp * G_GROUP + shadow_frag(s % 2u, 0u, 0u, 3u * H);
    FRAG_A x[PD];  // dGh, lane fragment 0 (ring slot i % PD)
    ACC_T p = ACC_ZERO();
#if LF == 2
    uint a1 = grp * G_GROUP + shadow_frag(s % 2u, 1u, 0u, 3u * H);
    FRAG_A y[PD];
    ACC_T q = ACC_ZERO();
#endif
    [[unroll]] for (uint i = 0u; i < PD && i < KPG; ++i) {
        if (FULL || k1 + i < n_kf) { LOAD_LANES(i, k1 + i); }
    }
    [[unroll]] for (uint i = 0u; i < KPG; ++i) {
        uint kf = k1 + i, r = i % PD;
        if (FULL || kf < n_kf) {  // FULL: no bound checks (every k-group whole)
#if RES > 0
            if (i < RES) {
                MUL_LANES(r, rw[i]);
            } else
#endif
#if SRES > 0
            if (i < RS) {
                FRAG_B sw;
                LOAD_B_SHARED(sw, (kg * SRES + i - RES) * 256u, 16u, false);
                MUL_LANES(r, sw);
            } else
#endif
            {
                uint wr = (i - RS) % PD;
                MUL_LANES(r, w[wr]);
                if (i + PD < KPG && (FULL || kf + PD < n_kf)) load_w(k0, kf + PD, w[wr]);
            }
        }
        if (i + PD < KPG && (FULL || kf + PD < n_kf)) { LOAD_LANES(r, kf + PD); }
    }
    uint slot = kg % KG;  // red's blocks (slot * LF + lf) * 256
    if (KGS == KG || kg >= KG) {
        ACC_STORE(p, (slot * LF) * 256u, 16u);
#if LF == 2
        ACC_STORE(q, (slot * LF + 1u) * 256u, 16u);
#endif
    }
    if (KGS > KG) {
        barrier();
        if (kg < KG) {
            ACC_T other;
            ACC_LOAD(other, (slot * LF) * 256u, 16u);
            other = ACC_ADD(other, p);
            ACC_STORE(other, (slot * LF) * 256u, 16u);
#if LF == 2
            ACC_LOAD(other, (slot * LF + 1u) * 256u, 16u);
            other = ACC_ADD(other, q);
            ACC_STORE(other, (slot * LF + 1u) * 256u, 16u);
#endif
        }
    }
    return true;
}
#else  // F32
const uint RB = BP / 8u;         // lanes per invocation in the product: lg, lg + 8, ...
const uint SQ = 32u + 2u * BP;   // vec4s of a k-group's chunk: W_hh's 8 rows x 4 vec4 of columns, then dGh's 2 quads x lanes
const uint SL = SQ / 32u;        // of them loaded per invocation
const uint NC = KPG * 2u;        // chunks (2 quads of rows) per k-group
const uint RED4 = KG * LF * 64u;  // red's vec4s
// k-group kg's chunk at stage[kg * SQ], and red after the product (a barrier apart): lavapipe's 32 KB
// hold both only as one
shared vec4 smem4[RED4 > KGS * SQ ? RED4 : KGS * SQ];
#define stage smem4
#define RED(i) smem4[(i) / 4u][(i) % 4u]

// Vec4 e of the k-group's chunk from row quad qa (zero past 3H): W_hh's row 4 qa + e / 4 at columns
// k0 + 4 (e % 4) .. +3, or dGh's (quad qa + (e - 32) / BP, lane (e - 32) % BP) from its shadow at gb.
vec4 chunk_vec(uint e, uint qa, uint k0, uint gb) {
    if (e < 32u) return (FULL || 4u * qa + e / 4u < 3u * pc.H) ? w_chunk_vec(e, qa, k0) : vec4(0.0);
    uint q = qa + (e - 32u) / BP;
    return (FULL || q < 3u * pc.H / 4u) ? g4[gb + q * BP + (e - 32u) % BP] : vec4(0.0);
}

// The slice's product dGh[s] @ W_hh[:, k0 .. k0+15] into red, float32 on the threads' FMAs:
// subgroup kg multiplies its k-group (rows kg * KPG * 16 .. of the 3H) for every lane, 2 quads of rows
// at a time through its stage; its invocation (lg, cg) takes lanes lg + 8 i and columns k0 + 4 cg ..
// +3 (32 RB FMAs per chunk). The k-groups' sums go through red's slots in the fragments' order
// (deterministic). wait_k and false as there.
bool product(uint s, uint k0, uint grp, uint kg, uint wait_k) {
    if (!operand_wait(wait_k, kg, 3u * pc.H / 16u, KPG, grp * KGS)) return false;
    PHASE(pc.s - s, 1u);
    uint lane = gl_LocalInvocationIndex % 32u, lg = lane % 8u, cg = lane / 8u;
    uint q0 = kg * KPG * 4u, gb = grp * G_GROUP + (s % 2u) * (3u * pc.H / 4u) * BP, st = kg * SQ;
    vec4 ring[PD][SL];  // chunk c in slot c % PD
    [[unroll]] for (uint c = 0u; c < PD && c < NC; ++c) {
        [[unroll]] for (uint m = 0u; m < SL; ++m) ring[c][m] = chunk_vec(lane + 32u * m, q0 + 2u * c, k0, gb);
    }
    vec4 acc[RB];
    [[unroll]] for (uint i = 0u; i < RB; ++i) acc[i] = vec4(0.0);
    [[unroll]] for (uint c = 0u; c < NC; ++c) {
        uint r = c % PD;
        KG_BARRIER();  // the stage is free: chunk c - 1 multiplied
        [[unroll]] for (uint m = 0u; m < SL; ++m) stage[st + lane + 32u * m] = ring[r][m];
        if (c + PD < NC) {
            [[unroll]] for (uint m = 0u; m < SL; ++m) {
                ring[r][m] = chunk_vec(lane + 32u * m, q0 + 2u * (c + PD), k0, gb);
            }
        }
        KG_BARRIER();  // chunk c staged
        [[unroll]] for (uint qq = 0u; qq < 2u; ++qq) {
            uint wr = st + 16u * qq + cg;  // row 4 qq + j's vec4 of the columns at wr + 4 j
            vec4 w0 = stage[wr], w1 = stage[wr + 4u], w2 = stage[wr + 8u], w3 = stage[wr + 12u];
            [[unroll]] for (uint i = 0u; i < RB; ++i) {
                acc[i] = fma4(stage[st + 32u + qq * BP + lg + 8u * i], w0, w1, w2, w3, acc[i]);
            }
        }
    }
    uint slot = kg % KG;  // red's blocks (slot * LF + lf) * 256
    barrier();  // every k-group done with the stage: red takes its place
    [[unroll]] for (uint i = 0u; i < RB; ++i) {
        uint b = lg + 8u * i, at = (slot * LF + b / 16u) * 256u + (b % 16u) * 16u + 4u * cg;
        if (KGS == KG || kg >= KG) {
            [[unroll]] for (uint c = 0u; c < 4u; ++c) RED(at + c) = acc[i][c];
        }
    }
    if (KGS > KG) {
        barrier();
        [[unroll]] for (uint i = 0u; i < RB; ++i) {
            uint b = lg + 8u * i, at = (slot * LF + b / 16u) * 256u + (b % 16u) * 16u + 4u * cg;
            if (kg < KG) {
                [[unroll]] for (uint c = 0u; c < 4u; ++c) RED(at + c) = RED(at + c) + acc[i][c];
            }
        }
    }
    return true;
}
#endif

#include "gru_backward_element.glsl"

void main() {
    uint tid = gl_LocalInvocationIndex, sg = tid / 32u, u = tid % 16u, bl = tid / 16u, H = pc.H;
    // work items: slice sl of lane group grp, item sl + n_sl * grp; a workgroup walks items wg, wg + n_wg, ...
    uint n_sl = H / 16u, n_it = n_sl * LG, wg = gl_WorkGroupID.x, n_wg = gl_NumWorkGroups.x;
    float c = HPF(hyper, HP_GRADH_CLAMP);
    uint hits = 0u;
#ifdef BIAS_SUMS
    bias_walk = n_it > n_wg;
#endif
#if RES > 0
    [[unroll]] for (uint i = 0u; i < RES; ++i) {
        if (wg < n_it && (FULL || sg * KPG + i < 3u * H / 16u)) load_w(16u * (wg % n_sl), sg * KPG + i, rw[i]);
    }
#endif
#if SRES > 0  // the next SRES k-fragments' W_hh into shared memory, each subgroup its own
    for (uint j = 0u; j < SRES; ++j) {
        uint kf = sg * KPG + RES + j;
        if (wg < n_it && (FULL || kf < 3u * H / 16u)) {
            w_block_to_shared(16u * kf, 16u * (wg % n_sl), (sg * SRES + j) * 256u, tid % 32u);
        }
    }
    barrier();
#endif
    uint arrived = 0u, waited = 0u;  // grid barrier crossings arrived at, waited for
    bool ok = true;
    vec4 held = vec4(0.0);  // the step's last item's element outputs (lane held_b, column held_k, step held_s > 0)
    uint held_b = 0u, held_k = 0u, held_s = 0u;
    float held_dhz = 0.0;
    for (uint i = 0u; i < pc.n_steps && ok; ++i) {
        uint s = pc.s - i;
        for (uint it = wg; it < n_it; it += n_wg) {
            uint sl = it % n_sl, grp = it / n_sl, k0 = 16u * sl, k = k0 + u, b = grp * BP + bl;
            bool live = b < pc.B;
            float in_u[7] = float[7](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
            float dhz = 0.0;
            if (live) {  // loaded before the product: their latency hides behind it
                in_u = step_inputs(s, b, k);
                if (s < pc.T) dhz = dhz_mem[b * H + k];
            }
            PHASE(i, 0u);
#ifdef BLOCK_FLAGS  // no grid barrier: the item's 3 blocks of g16 (r, z, n) count into the k-groups reading them
            if (s < pc.T) product(s, k0, grp, sg, i);  // its k-group's blocks of dGh waited for inside
            barrier();
#else
            if (s < pc.T) {  // uniform: s is
                ok = product(s, k0, grp, sg, arrived > waited ? arrived : 0u);  // waits for the step's dGh inside
                waited = arrived;
                if (!ok) break;
            }
            barrier();
#endif
            PHASE(i, 2u);
            if (live) {
                float mm = 0.0;
                if (s < pc.T) {
                    uint rc = (bl % 16u) * 16u + u;
                    [[unroll]] for (uint g = 0u; g < KG; ++g) mm += RED((g * LF + bl / 16u) * 256u + rc);
                }
                vec4 dg;
                float dhz_next;
                bool writes = element(s, b, k, mm, dhz, in_u, c, hits, dg, dhz_next);
                if (writes && it + n_wg < n_it) {
                    element_writes(s, b, k, dg, dhz_next);
                } else if (writes) {  // the step's last item: written after the arrival
                    held = dg;
                    held_b = b;
                    held_k = k;
                    held_dhz = dhz_next;
                    held_s = s;
                }
            }
#ifdef BLOCK_FLAGS
            if (i + 1u < pc.n_steps) {  // with the barrier red needs before the next item
                blocks_arrive(grp * KGS + uvec3(sl, n_sl + sl, 2u * n_sl + sl) / KPG, 3u);
                continue;
            }
#endif
            barrier();  // red is rewritten by the next item
        }
        PHASE(i, 3u);
#if defined(PERSISTENT) && !defined(BLOCK_FLAGS)
        if (ok && arrived > waited) {  // a workgroup without an item (or a step without a product) waits here
            ok = grid_wait(arrived);
            waited = arrived;
        }
        if (ok && i + 1u < pc.n_steps) {
            grid_arrive();
            ++arrived;
        }
#endif
        if (held_s > 0u) element_writes(held_s, held_b, held_k, held, held_dhz);
        held_s = 0u;
    }
    if (hits > 0u) atomicAdd(stats[ST_CLAMP_HITS], hits);
#ifdef BIAS_SUMS  // the one item's element (item wg)
    bias_finish((wg / n_sl) * BP + bl, 16u * (wg % n_sl) + u);
#endif
#ifdef BLOCK_FLAGS
    grid_sync_done(LG * KGS);
#elif defined(PERSISTENT)
    grid_sync_done(1u);
#endif
}
