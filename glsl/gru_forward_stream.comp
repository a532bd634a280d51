#version 450
// The GRU forward sweep with W_hh streamed from a float16 copy on tensor cores: for hidden sizes
// whose W_hh fits neither registers nor shared memory (v5: 25 MB per layer as float16, half the
// H200's L2). Same maths, buffers and push constants as gru_forward.comp (read its header), with
// the product h_prev @ W_hh^T taken from float16 operands with float32 sums, as the COOP
// resident sweep's (the twin's recurrent="fp16").
// A slice is 16 units for every lane (B <= 16 * LF). Its workgroup multiplies [BP lanes x H]
// h_prev by W_hh^T's [H x 48] columns of the slice (3 gates x 16 units) straight from memory with
// fragment loads (include/sweep_frag.glsl), PD fragments' loads in flight: nothing is staged in
// shared memory and, but for RES below, nothing of W_hh stays on chip between steps (L2 keeps it:
// one layer's copy at a time). Both operands lie in 16 x 16 blocks of 512 contiguous bytes (BLOCKED_W for W_hh's copy):
// on an H200 at v5, fragments read as 16 rows of 32 bytes at a stride of H took 84% of the step.
// Subgroup sg (of 8 * LF) owns k-group sg (KPG 16-deep fragments) for every lane fragment, so each
// W_hh fragment is loaded once per workgroup; its accumulators (3 gates x LF lane fragments) fold
// with the other k-groups' into `red`'s 4 slots in a fixed order (deterministic). RES: the W_hh
// fragments of a subgroup's first RES k-fragments stay in registers for the whole dispatch (set
// only where a workgroup has one slice). In the persistent sweep the grid barrier is split: a
// workgroup arrives after its gates and waits inside the next product, after issuing the W_hh
// loads that do not depend on the barrier. KFLAGS (persistent only): no grid barrier; each slice's
// gates count its block of h16 into the word of the k-group that reads it, and each subgroup waits
// inside the product for its own k-group's blocks alone (include/grid_sync.glsl's block flags).
// h_prev comes from a float16 shadow `h16` [2][BP][H] (lanes past B stay the zeros the host
// wrote; in 16 x 16 blocks of 512 bytes, include/sweep_frag.glsl's shadow_at): step t reads
// h16[t % 2] and its gates write h16[(t + 1) % 2] = the new state with step t+1's reset applied,
// so no workgroup waits for another's h_prev rows through shared memory. A prologue writes
// h16[0] = h0 * (1 - reset[0]): inside the one persistent dispatch (then a grid barrier), or as
// its own dispatch (t == t_end) before step 0.
// Every thread owns one gate output of the slice (unit j0 + tid % 16, lane tid / 16) and reads
// its own float32 h_prev (o[t-1], which it wrote, or h0) for z * h_prev.
// Persistent (PERSISTENT): workgroups walk the slices (slice wg, wg + n_wg, ...) and meet at a grid
// barrier between steps; else one dispatch per step, a workgroup per slice.
// Needs H a multiple of 16 and w_off a multiple of 8 (16-byte fragment rows).
// FRAG_W (with BLOCKED_W; not with F32, SPLIT, SRES) / FRAG_H (not with F32, SPLIT): W_hh's copy (glsl/frag_order.comp,
// COL) / h16's blocks (the gates writing each element there, include/a_order.glsl) in their fragments' own
// order, each fragment one 16-byte load an invocation (include/sweep_frag.glsl's LOAD_W_BLOCK, LOAD_SHADOW).
// SRES (not with F32): the W_hh fragments of each subgroup's SRES k-fragments after the RES
// resident ones are copied into shared memory (`wsm`) once per dispatch and read from there, in
// what `red` leaves of the workgroup's 48 KB (a workgroup per slice, as RES).
// SAVE16 (not with F32): save holds float16 (save_off in halves), half the bytes of the largest
// buffer a training step keeps (v5: 1.6 of 3.2 GB); the gates' own arithmetic stays float32, only
// what the backward reads back is rounded (the twin's saves="fp16"; gru_backward_stream.comp).
// SPLIT (not with F32, SAVE16, RES, SRES): the product in float32 from float16 splits on tensor cores (a
// float32 program's forward, CATCHAT_STREAM32_SPLIT): each layer's W_hh copy is hi = float16(w), then
// lo = float16(2^11 (w - hi)) 3H*H halves on (ToHalf and its LO, include/split_half.glsl), and each
// lane group's shadow its hi, then its lo 2 * BP * H halves on, written so by the gates; a product takes
// hi hi into one set of accumulators and hi lo + lo hi into another, summed as hi + 2^-11 lo at the fold
// (tools/split16_error.py: float32's error where the sums round to nearest, ~7x it with the tensor
// cores' truncation, against float16's ~1,000x). Two accumulator sets a lane fragment leave no
// registers for 512 threads: the workgroup keeps 8 subgroups (k-groups) at LF 2, each multiplying both
// lane fragments, and each thread takes OUTS = LF gate outputs (lanes bl and bl + 16).
// F32: the same sweep in float32 on the threads' FMAs, for users who train at fp32 (v5's W_hh is 50
// MB per layer as float32): W_hh read as vec4 along k straight from params (binding 11, w_off in
// floats, a multiple of 4), h_prev from a float32 shadow `h4` (include/sweep_simt.glsl's layout);
// each subgroup a k-group as above, each of its invocations 6 rows of W_hh (2 units x 3 gates) for
// BP / 4 lanes, loaded straight by the invocations that multiply them (W_hh through L1) and folded
// through the same `red` slots in the same order. Staged once per k-group through shared memory as
// the backward's F32 stages its operands, the forward measured slower on the H200 at v5 (46.9 us per
// step with a ring of 1 quad, 59.7 with 2, 62.3 with 3, against 39.6 straight; 2026-12-04).
#if defined(KFLAGS) && defined(PERSISTENT)  // block flags instead of the grid barrier (a dispatch per step has neither)
#define BLOCK_FLAGS
#define GROUP_STRIDE 32u  // each k-group's word in a 128-byte line of its own
#endif
#extension GL_EXT_control_flow_attributes : require
#ifndef F32
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
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
#define KPG 2   // 16-deep k-fragments per k-group: 8 * LF * KPG * 16 >= H
#endif
#ifndef PD
#define PD 4    // fragments whose loads are in flight ahead of the product
#endif
#ifndef LG
#define LG 1    // lane groups of 16 * LF lanes, each its own recurrence: B <= 16 * LF * LG
#endif
#ifndef PROBE
#define PROBE 0 // timing probes (tools/gpu-check.sh; wrong results): 1 no W_hh loads, 2 no h_prev loads
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

#ifdef SPLIT
const uint OUTS = LF;       // gate outputs a thread: 256 threads at any LF (two accumulator sets a lane fragment)
#else
const uint OUTS = 1u;
#endif
const uint KGS = 8u * LF / OUTS;  // k-groups: one per subgroup
const uint RK = 4u;         // k-group slots of red after the folds
const uint BP = 16u * LF;   // lanes, padded
layout(local_size_x_id = 0) in;  // 256 * LF / OUTS: KGS subgroups of 32, a thread per OUTS gate outputs

layout(set = 0, binding = 0) readonly buffer Gi { float gi[]; };        // [T,B,3H] at gi_off
layout(set = 0, binding = 1) readonly buffer P { float params[]; };     // b_hh [3H] at b_off
layout(set = 0, binding = 2) readonly buffer H0 { float h0[]; };        // [B,H] at h0_off
layout(set = 0, binding = 3) readonly buffer Resets { uint resets[]; }; // [T,B]
layout(set = 0, binding = 4) buffer Out { float o[]; };                 // [T,B,H] at o_off
layout(set = 0, binding = 5) writeonly buffer Hprev { float hprev[]; }; // [B,H] at hprev_off (t == 0 only)
#ifdef SAVE16  // the saves as float16 (save_off in halves): the backward reads them back rounded once
layout(set = 0, binding = 6) writeonly buffer Save { float16_t save[]; };  // [T,B,4H] at save_off: r, z, n, ghn
#define SAVE_W(v) float16_t(v)
#else
layout(set = 0, binding = 6) writeonly buffer Save { float save[]; };   // [T,B,4H] at save_off: r, z, n, ghn
#define SAVE_W(v) (v)
#endif
layout(set = 0, binding = 7) writeonly buffer HT { float hT[]; };       // [B,H] at hT_off
layout(set = 0, binding = 10) buffer Stats { uint stats[]; };
#ifdef F32
layout(set = 0, binding = 8) SWEEP_COHERENT buffer H4 { vec4 h4[]; };   // [2][H/4][BP] (shadow_q)
layout(set = 0, binding = 11) readonly buffer W32 { vec4 w4[]; };       // params again: W_hh [3H,H] at w_off
#else
layout(set = 0, binding = 8) SWEEP_COHERENT buffer H16 { float16_t h16[]; };  // [2][BP][H] in blocks (shadow_at)
#if defined(FRAG_H) && !defined(EMU)
layout(set = 0, binding = 8) SWEEP_COHERENT buffer H16Q { uvec4 h16q[]; };   // the same, 8 halves a word
#define A_BUF_Q h16q
#endif
layout(set = 0, binding = 11) W16_QUAL buffer W16 { float16_t w16[]; }; // W_hh [3H,H] at w_off (halves)
#if defined(FRAG_W) && !defined(EMU)
layout(set = 0, binding = 11) W16_QUAL buffer W16Q { uvec4 w16q[]; };   // the same, 8 halves a word
#define B_BUF_Q w16q
#endif
#endif
layout(push_constant) uniform Push {
    uint t; uint T; uint B; uint H;
    uint gi_off; uint w_off; uint b_off; uint h0_off; uint o_off; uint hprev_off; uint save_off; uint hT_off;
    uint t_end;  // steps [t, t_end); t == t_end: the prologue alone
} pc;
#define SYNC_BINDING 9
#include "grid_sync.glsl"

shared float red[RK * LF * 3u * 256u];  // RED(((slot * LF + lf) * 3 + g) * 256 + row * 16 + unit)
#define RED(i) red[i]
#ifdef F32
#include "sweep_simt.glsl"
#define H_GROUP (2u * (pc.H / 4u) * BP)  // vec4s of a lane group's shadow
#define H_STORE(p, b, j, v) h4[((b) / BP) * H_GROUP + shadow_q(p, (b) % BP, j, pc.H)][(j) % 4u] = (v)
#else
#define A_BUF h16
#define B_BUF w16
#define ACC_SHARED red
#if SRES > 0  // k-group kg's shared fragment j of gate g at ((kg * SRES + j) * 3 + g) * 256, row-major
shared float16_t wsm[KGS * SRES * 3u * 256u];
#define B_SHARED wsm
#endif
#ifdef FRAG_H  // h16's element at `at` where its A fragment's order puts it (H_STORE)
#include "a_order.glsl"
#define H_AT(at) a_frag_at(at)
#else
#define H_AT(at) (at)
#endif
#include "sweep_frag.glsl"
#ifdef SPLIT  // a lane group's shadow: hi, then lo (H_LO halves on)
#include "split_half.glsl"
#define H_LO (2u * BP * pc.H)
#define H_GROUP (2u * H_LO)
void h_store(uint at, float v) {
    h16[at] = float16_t(v);
    h16[at + H_LO] = split_lo(v);
}
#define H_STORE(p, b, j, v) h_store(((b) / BP) * H_GROUP + shadow_at(p, (b) % BP, j, pc.H), v)
#else
#define H_GROUP (2u * BP * pc.H)  // halves of a lane group's shadow
#define H_STORE(p, b, j, v) h16[H_AT(((b) / BP) * H_GROUP + shadow_at(p, (b) % BP, j, pc.H))] = float16_t(v)
#endif
#endif

float keep(uint t, uint b) { return 1.0 - float(resets[t * pc.B + b]); }

// h16[0] for the slice's units in lane group grp: h0 after step 0's reset.
void prologue(uint j0, uint grp, uint tid) {
    uint j = j0 + tid % 16u;
    [[unroll]] for (uint e = 0u; e < OUTS; ++e) {
        uint b = grp * BP + e * (BP / OUTS) + tid / 16u;
        if (b < pc.B) H_STORE(0u, b, j, h0[pc.h0_off + b * pc.H + j] * keep(0u, b));
    }
}

#ifndef F32
// Gate g's W_hh^T fragment kf for the 16 units from j0: (k, unit) = W_hh[g*H + j0 + unit, 16 kf + k].
void load_w(uint j0, uint kf, out FRAG_B w0, out FRAG_B w1, out FRAG_B w2) {
#if PROBE == 1  // timing probe: no W_hh loads (constant fragments)
    w0 = FRAG_B(float16_t(1.0));
    w1 = w0;
    w2 = w0;
#else
    uint H = pc.H;
    LOAD_W_BLOCK(w0, w_block(j0, 16u * kf), true);
    LOAD_W_BLOCK(w1, w_block(H + j0, 16u * kf), true);
    LOAD_W_BLOCK(w2, w_block(2u * H + j0, 16u * kf), true);
#endif
}

// h_prev's fragment kf of the lane fragment whose blocks start at a.
void load_a(uint a, uint kf, out FRAG_A x) {
#if PROBE == 2  // timing probe: no h_prev loads (a constant fragment)
    x = FRAG_A(float16_t(1.0));
#else
    LOAD_SHADOW(x, a + 256u * kf);
#endif
}

void mul3(FRAG_A x, FRAG_B w0, FRAG_B w1, FRAG_B w2, inout ACC_T c0, inout ACC_T c1, inout ACC_T c2) {
    c0 = MUL_ADD(x, w0, c0);
    c1 = MUL_ADD(x, w1, c1);
    c2 = MUL_ADD(x, w2, c2);
}

// SPLIT: the lo fragments beside each hi one (the header), and their products into the second set of
// accumulators (l0..l2), added to the first as 2^-11 of them at the fold.
#if (defined(FRAG_W) && (defined(SPLIT) || SRES > 0 || !defined(BLOCKED_W))) || (defined(FRAG_H) && defined(SPLIT))
#error "FRAG_W needs BLOCKED_W; neither FRAG_W nor FRAG_H runs the split product, nor FRAG_W shared W_hh fragments"
#endif
#ifdef SPLIT
#if RES > 0 || SRES > 0 || defined(SAVE16) || PROBE != 0
#error "SPLIT runs no resident or shared W_hh fragments, float32 saves, no probe"
#endif
void load_w_lo(uint j0, uint kf, out FRAG_B w0, out FRAG_B w1, out FRAG_B w2) {
    uint H = pc.H, lo = 3u * H * H;
    LOAD_B(w0, w_block(j0, 16u * kf) + lo, W_LD, true);
    LOAD_B(w1, w_block(H + j0, 16u * kf) + lo, W_LD, true);
    LOAD_B(w2, w_block(2u * H + j0, 16u * kf) + lo, W_LD, true);
}
#define SPLIT_LOAD_W(slot, kf) load_w_lo(j0, kf, v0[slot], v1[slot], v2[slot])
#if LF == 2  // the second lane fragment's lo operand and products (y, yl into q, m)
#define SPLIT_LOAD_A(r, kf) load_a(a0 + H_LO, kf, xl[r]); load_a(a1 + H_LO, kf, yl[r])
#define SPLIT_MUL(r, wr) SPLIT_MUL1(x[r], xl[r], wr, l0, l1, l2); SPLIT_MUL1(y[r], yl[r], wr, m0, m1, m2)
#else
#define SPLIT_LOAD_A(r, kf) load_a(a0 + H_LO, kf, xl[r])
#define SPLIT_MUL(r, wr) SPLIT_MUL1(x[r], xl[r], wr, l0, l1, l2)
#endif
#define SPLIT_MUL1(hi, lo, wr, c0, c1, c2) mul3(hi, v0[wr], v1[wr], v2[wr], c0, c1, c2); mul3(lo, w0[wr], w1[wr], w2[wr], c0, c1, c2)
#define SPLIT_SUM(p, l) ACC_ADD(p, ACC_SCALE(l, 1.0 / SPLIT_SCALE))
#else
#define SPLIT_LOAD_W(slot, kf)
#define SPLIT_LOAD_A(r, kf)
#define SPLIT_MUL(r, wr)
#define SPLIT_SUM(p, l) (p)
#endif

// red block `off` = acc (first round) or red + acc.
void fold(ACC_T acc, uint off, bool first) {
    if (first) {
        ACC_STORE(acc, off, 16u);
    } else {
        ACC_T other;
        ACC_LOAD(other, off, 16u);
        other = ACC_ADD(other, acc);
        ACC_STORE(other, off, 16u);
    }
}

#if RES > 0
// The W_hh fragments of this subgroup's first RES k-fragments, loaded once per dispatch (a workgroup
// per slice: the host sets RES only then).
FRAG_B rw0[RES], rw1[RES], rw2[RES];
#endif

#if LF == 2
#define LOAD_LANES(r, kf) load_a(a0, kf, x[r]); load_a(a1, kf, y[r])
#define MUL_LANES(r, w0, w1, w2) mul3(x[r], w0, w1, w2, p0, p1, p2); mul3(y[r], w0, w1, w2, q0, q1, q2)
#else
#define LOAD_LANES(r, kf) load_a(a0, kf, x[r])
#define MUL_LANES(r, w0, w1, w2) mul3(x[r], w0, w1, w2, p0, p1, p2)
#endif

// The slice's product at step t into red's RK slots: subgroup kg multiplies its k-group (k-fragments
// kg * KPG ..) for every lane fragment, each W_hh fragment loaded once per workgroup; the KGS
// k-groups fold into the slots in rounds, highest first (slot s = ((kg s+12 + kg s+8) + kg s+4) +
// kg s: deterministic). W_hh's operands come from the resident fragments (the first RES) and a ring
// of PD in flight, h_prev's from a ring of PD. wait_k > 0: the step's h_prev waits for the grid
// barrier's crossing wait_k, after the ring's first W_hh loads (W_hh does not depend on it) are
// issued. false: the barrier was aborted.
bool product(uint t, uint j0, uint grp, uint kg, uint wait_k) {
    uint H = pc.H, n_kf = H / 16u, k1 = kg * KPG;
    const uint RS = RES + SRES;  // the first k-fragment whose W_hh streams through the ring
    FRAG_B w0[PD], w1[PD], w2[PD];  // ring over the k-fragments past RS: k-fragment i in slot (i - RS) % PD
#ifdef SPLIT
    FRAG_B v0[PD], v1[PD], v2[PD];  // W_hh's lo fragments
#endif
    [[unroll]] for (uint i = RS; i < KPG && i < RS + PD; ++i) {
        if (FULL || k1 + i < n_kf) {
            load_w(j0, k1 + i, w0[i - RS], w1[i - RS], w2[i - RS]);
            SPLIT_LOAD_W(i - RS, k1 + i);
        }
    }
    if (!operand_wait(wait_k, kg, H / 16u, KPG, grp * KGS)) return false;
    PHASE(t, 1u);
    uint a0 = grp * H_GROUP + shadow_frag(t % 2u, 0u, 0u, H);
    FRAG_A x[PD];  // h_prev, lane fragment 0 (ring slot i % PD)
    ACC_T p0 = ACC_ZERO(), p1 = ACC_ZERO(), p2 = ACC_ZERO();  // lane fragment 0, gates 0..2
#ifdef SPLIT
    FRAG_A xl[PD];  // h_prev's lo fragments
    ACC_T l0 = ACC_ZERO(), l1 = ACC_ZERO(), l2 = ACC_ZERO();  // hi lo + lo hi
#endif
#if LF == 2
    uint a1 = grp * H_GROUP + shadow_frag(t % 2u, 1u, 0u, H);
    FRAG_A y[PD];
    ACC_T q0 = ACC_ZERO(), q1 = ACC_ZERO(), q2 = ACC_ZERO();  // lane fragment 1
#ifdef SPLIT
    FRAG_A yl[PD];
    ACC_T m0 = ACC_ZERO(), m1 = ACC_ZERO(), m2 = ACC_ZERO();
#endif
#endif
    [[unroll]] for (uint i = 0u; i < PD && i < KPG; ++i) {
        if (FULL || k1 + i < n_kf) { LOAD_LANES(i, k1 + i); SPLIT_LOAD_A(i, k1 + i); }
    }
    [[unroll]] for (uint i = 0u; i < KPG; ++i) {
        uint kf = k1 + i, r = i % PD;
        if (FULL || kf < n_kf) {  // FULL: no bound checks (every k-group whole)
#if RES > 0
            if (i < RES) {
                MUL_LANES(r, rw0[i], rw1[i], rw2[i]);
            } else
#endif
#if SRES > 0
            if (i < RS) {
                FRAG_B s0, s1, s2;
                uint o = (kg * SRES + i - RES) * 768u;
                LOAD_B_SHARED(s0, o, 16u, true);
                LOAD_B_SHARED(s1, o + 256u, 16u, true);
                LOAD_B_SHARED(s2, o + 512u, 16u, true);
                MUL_LANES(r, s0, s1, s2);
            } else
#endif
            {
                uint wr = (i - RS) % PD;
                MUL_LANES(r, w0[wr], w1[wr], w2[wr]);
                SPLIT_MUL(r, wr);
                if (i + PD < KPG && (FULL || kf + PD < n_kf)) {
                    load_w(j0, kf + PD, w0[wr], w1[wr], w2[wr]);
                    SPLIT_LOAD_W(wr, kf + PD);
                }
            }
        }
        if (i + PD < KPG && (FULL || kf + PD < n_kf)) { LOAD_LANES(r, kf + PD); SPLIT_LOAD_A(r, kf + PD); }
    }
    for (uint round = KGS / RK; round-- > 0u;) {  // uniform: the barrier is every subgroup's
        if (kg / RK == round) {
            uint b0 = (kg % RK) * LF * 3u * 256u;  // slot kg % RK: lane fragment 0's 3 blocks, then 1's
            bool first = round + 1u == KGS / RK;
            fold(SPLIT_SUM(p0, l0), b0, first);
            fold(SPLIT_SUM(p1, l1), b0 + 256u, first);
            fold(SPLIT_SUM(p2, l2), b0 + 512u, first);
#if LF == 2
            fold(SPLIT_SUM(q0, m0), b0 + 768u, first);
            fold(SPLIT_SUM(q1, m1), b0 + 1024u, first);
            fold(SPLIT_SUM(q2, m2), b0 + 1280u, first);
#endif
        }
        barrier();
    }
    return true;
}
#else  // F32
const uint RB = BP / 4u;  // lanes per thread: lg, lg + 4, ...

// The slice's product at step t into red's RK slots, float32 on the threads' FMAs: subgroup kg
// multiplies its k-group (columns kg * KPG * 16 .. of h_prev) for every lane; its thread (lg, ug)
// takes lanes lg + 4 i and units ug, ug + 8 of the slice, 3 gates each (6 rows of W_hh as vec4
// along k), a k quad at a time: per quad 6 + RB vec4 loads for 24 RB FMAs. The k-groups fold into
// the slots in the fragments' rounds and order (deterministic). wait_k and false as there.
bool product(uint t, uint j0, uint grp, uint kg, uint wait_k) {
    if (!operand_wait(wait_k, kg, pc.H / 16u, KPG, grp * KGS)) return false;
    PHASE(t, 1u);
    uint H = pc.H, H4 = H / 4u, lane = gl_LocalInvocationIndex % 32u, lg = lane % 4u, ug = lane / 4u;
    uint q0 = kg * KPG * 4u, q1 = min(q0 + KPG * 4u, H4);
    uint wr[6];  // row c = 3 e + g (unit ug + 8 e, gate g) of W_hh: its vec4 at k quad 0
    [[unroll]] for (uint c = 0u; c < 6u; ++c) wr[c] = pc.w_off / 4u + ((c % 3u) * H + j0 + ug + 8u * (c / 3u)) * H4;
    uint hb = grp * H_GROUP + (t % 2u) * H4 * BP + lg;  // lane lg's vec4 of h_prev at k quad 0 (shadow_q)
    float acc[RB][6];
    [[unroll]] for (uint i = 0u; i < RB; ++i) {
        [[unroll]] for (uint c = 0u; c < 6u; ++c) acc[i][c] = 0.0;
    }
    for (uint q = q0; q < q1; ++q) {
        vec4 w[6];
        [[unroll]] for (uint c = 0u; c < 6u; ++c) w[c] = w4[wr[c] + q];
        [[unroll]] for (uint i = 0u; i < RB; ++i) {
            vec4 x = h4[hb + q * BP + 4u * i];
            [[unroll]] for (uint c = 0u; c < 6u; ++c) acc[i][c] = fdot(x, w[c], acc[i][c]);
        }
    }
    for (uint round = KGS / RK; round-- > 0u;) {  // uniform: the barrier is every subgroup's
        if (kg / RK == round) {
            bool first = round + 1u == KGS / RK;
            [[unroll]] for (uint i = 0u; i < RB; ++i) {
                uint b = lg + 4u * i;
                [[unroll]] for (uint c = 0u; c < 6u; ++c) {
                    uint at = (((kg % RK) * LF + b / 16u) * 3u + c % 3u) * 256u + (b % 16u) * 16u + ug + 8u * (c / 3u);
                    RED(at) = first ? acc[i][c] : RED(at) + acc[i][c];
                }
            }
        }
        barrier();
    }
    return true;
}
#endif

// Gate output (lane b, unit j) of step t from red, its gi, b_hh and h_prev hp (float32, reset
// applied): writes h16 for step t+1 (what the grid barrier publishes) and returns (h, r, z, n,
// ghn) for gate_writes.
float[5] gate(uint t, uint b, uint j, uint u, vec3 gi3, vec3 bias, float hp) {
    uint lf = (b % BP) / 16u, rc = (b % 16u) * 16u + u;
    vec3 gh = bias;
    [[unroll]] for (uint g = 0u; g < 3u; ++g) {
        [[unroll]] for (uint s = 0u; s < RK; ++s) gh[g] += RED(((s * LF + lf) * 3u + g) * 256u + rc);
    }
    float r = sigmoid(gi3.x + gh.x);
    float z = sigmoid(gi3.y + gh.y);
    float n = tanh_safe(gi3.z + r * gh.z);
    float h = (1.0 - z) * n + z * hp;
    if (t + 1u < pc.T) H_STORE((t + 1u) % 2u, b, j, h * keep(t + 1u, b));
    return float[5](h, r, z, n, gh.z);
}

// The rest of gate output (lane b, unit j) of step t: o[t], save[t], hprev at t = 0, hT at T-1.
// Nothing else in the dispatch reads them but this thread (o[t] as the next step's hp), so the last
// slice of a step writes them after the grid barrier's arrival: its memory barrier then waits for
// h16's writes alone.
void gate_writes(uint t, uint b, uint j, float[5] v, float hp) {
    uint H = pc.H, row = t * pc.B + b, sb = pc.save_off + row * 4u * H;
    o[pc.o_off + row * H + j] = v[0];
    if (t == 0u) hprev[pc.hprev_off + b * H + j] = hp;
    save[sb + j] = SAVE_W(v[1]);
    save[sb + H + j] = SAVE_W(v[2]);
    save[sb + 2u * H + j] = SAVE_W(v[3]);
    save[sb + 3u * H + j] = SAVE_W(v[4]);
    if (t + 1u == pc.T) hT[pc.hT_off + b * H + j] = v[0];
}

// RES, SRES (a workgroup a slice): subgroup sg's first RES k-fragments' W_hh into registers, the next
// SRES into shared memory, once a dispatch.
void w_on_chip(uint sg, uint wg, uint n_sl, uint n_it, uint tid) {
    uint H = pc.H;
#if RES > 0
    [[unroll]] for (uint i = 0u; i < RES; ++i) {
        if (wg < n_it && (FULL || sg * KPG + i < H / 16u)) {
            load_w(16u * (wg % n_sl), sg * KPG + i, rw0[i], rw1[i], rw2[i]);
        }
    }
#endif
#if SRES > 0  // each subgroup its own
    for (uint j = 0u; j < SRES; ++j) {
        uint kf = sg * KPG + RES + j;
        if (wg < n_it && (FULL || kf < H / 16u)) {
            for (uint g = 0u; g < 3u; ++g) {
                w_block_to_shared(g * H + 16u * (wg % n_sl), 16u * kf, ((sg * SRES + j) * 3u + g) * 256u, tid % 32u);
            }
        }
    }
    barrier();
#endif
}

// The step-t inputs of a thread's OUTS gate outputs (unit j; lanes b0, b0 + BP / OUTS, ...), read
// before the product: lanes b, live (b < B), gi, b_hh (one unit: every output's), h_prev with the reset.
void item_inputs(uint t, uint b0, uint j, out uint b[OUTS], out bool live[OUTS], out vec3 gi3[OUTS],
                 out vec3 bias, out float hp[OUTS]) {
    uint H = pc.H;
    bias = b0 < pc.B ? vec3(params[pc.b_off + j], params[pc.b_off + H + j], params[pc.b_off + 2u * H + j]) : vec3(0.0);
    [[unroll]] for (uint e = 0u; e < OUTS; ++e) {
        b[e] = b0 + e * (BP / OUTS);
        live[e] = b[e] < pc.B;
        gi3[e] = vec3(0.0);
        hp[e] = 0.0;
        if (live[e]) {
            uint gib = pc.gi_off + (t * pc.B + b[e]) * 3u * H + j;
            gi3[e] = vec3(gi[gib], gi[gib + H], gi[gib + 2u * H]);
            hp[e] = (t == 0u ? h0[pc.h0_off + b[e] * H + j] : o[pc.o_off + ((t - 1u) * pc.B + b[e]) * H + j])
                * keep(t, b[e]);
        }
    }
}

// The gates of a thread's OUTS outputs (item_inputs'), written now, or held for after the grid
// barrier's arrival where this is the step's last item (`last`).
void item_gates(uint t, uint j, uint u, bool last, uint b[OUTS], bool live[OUTS], vec3 gi3[OUTS], vec3 bias,
                float hp[OUTS], inout float held[OUTS][5], inout uint held_b[OUTS], inout float held_hp[OUTS],
                inout bool held_live[OUTS]) {
    [[unroll]] for (uint e = 0u; e < OUTS; ++e) {
        if (live[e]) {
            float[5] v = gate(t, b[e], j, u, gi3[e], bias, hp[e]);
            if (last) {
                held[e] = v;
                held_b[e] = b[e];
                held_hp[e] = hp[e];
            } else {
                gate_writes(t, b[e], j, v, hp[e]);
            }
        }
        held_live[e] = live[e];
    }
}

void main() {
    uint tid = gl_LocalInvocationIndex, sg = tid / 32u, u = tid % 16u, bl = tid / 16u, H = pc.H;
    // work items: slice sl of lane group grp, item sl + n_sl * grp; a workgroup walks items wg, wg + n_wg, ...
    uint n_sl = H / 16u, n_it = n_sl * LG, wg = gl_WorkGroupID.x, n_wg = gl_NumWorkGroups.x;
#ifdef FRAG_H
    a_pos_init(tid);
#endif
    w_on_chip(sg, wg, n_sl, n_it, tid);
    uint arrived = 0u, waited = 0u;  // grid barrier crossings arrived at, waited for
    bool ok = true;
    // the step's last item's gate outputs (each thread's OUTS: lanes held_b[e], unit held_j)
    float held[OUTS][5];
    uint held_b[OUTS], held_j = 0u;
    bool held_live[OUTS];
    float held_hp[OUTS];
    [[unroll]] for (uint e = 0u; e < OUTS; ++e) held_live[e] = false;
#ifdef BLOCK_FLAGS  // no grid barrier: each item's block of h16 counted into the word of the k-group reading it
    uint first_crossing = pc.t == 0u && pc.t < pc.t_end ? 1u : 0u;  // the prologue's
#endif
#ifdef PERSISTENT
    if (pc.t == 0u) {
        for (uint it = wg; it < n_it; it += n_wg) {
            prologue(16u * (it % n_sl), it / n_sl, tid);
#ifdef BLOCK_FLAGS
            if (pc.t < pc.t_end) blocks_arrive(uvec3((it / n_sl) * KGS + (it % n_sl) / KPG, 0u, 0u), 1u);
#endif
        }
#ifndef BLOCK_FLAGS
        if (pc.t < pc.t_end) {
            grid_arrive();
            ++arrived;
        }
#endif
    }
#else
    if (pc.t == pc.t_end) {
        if (wg < n_it) prologue(16u * (wg % n_sl), wg / n_sl, tid);
        return;
    }
#endif
    for (uint t = pc.t; t < pc.t_end && ok; ++t) {
        for (uint it = wg; it < n_it; it += n_wg) {
            uint sl = it % n_sl, grp = it / n_sl, j0 = 16u * sl, j = j0 + u;
            vec3 gi3[OUTS], bias;
            float hp[OUTS];
            uint b[OUTS];
            bool live[OUTS];
            item_inputs(t, grp * BP + bl, j, b, live, gi3, bias, hp);  // their latency hides behind the product
            PHASE(t, 0u);
#ifdef BLOCK_FLAGS
            product(t, j0, grp, sg, first_crossing + t - pc.t);  // its k-group's blocks of h_prev waited for inside
#else
            ok = product(t, j0, grp, sg, arrived > waited ? arrived : 0u);  // waits for the step's h_prev inside
            waited = arrived;
#endif
            if (!ok) break;
            PHASE(t, 2u);
            item_gates(t, j, u, it + n_wg >= n_it, b, live, gi3, bias, hp, held, held_b, held_hp, held_live);
            held_j = j;
#ifdef BLOCK_FLAGS
            if (t + 1u < pc.t_end) {  // with the barrier red needs before the next item
                blocks_arrive(uvec3(grp * KGS + sl / KPG, 0u, 0u), 1u);
                continue;
            }
#endif
            barrier();  // red is rewritten by the next item
        }
        PHASE(t, 3u);
#if defined(PERSISTENT) && !defined(BLOCK_FLAGS)
        if (ok && arrived > waited) {  // a workgroup without an item waits here
            ok = grid_wait(arrived);
            waited = arrived;
        }
        if (ok && t + 1u < pc.t_end) {
            grid_arrive();
            ++arrived;
        }
#endif
        [[unroll]] for (uint e = 0u; e < OUTS; ++e) {
            if (held_live[e] && wg < n_it) gate_writes(t, held_b[e], held_j, held[e], held_hp[e]);
        }
    }
#ifdef BLOCK_FLAGS
    grid_sync_done(LG * KGS);
#elif defined(PERSISTENT)
    grid_sync_done(1u);
#endif
}
