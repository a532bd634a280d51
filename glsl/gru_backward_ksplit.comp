#version 450
// The GRU backward sweep with W_hh streamed on tensor cores, its product split over k between
// workgroups (CATCHAT_STREAM_KSPLIT): the maths, buffers and push constants of
// gru_backward_stream.comp (read its header), with a workgroup per (k-part, column group) instead of
// a workgroup per 16 columns of dh. Why: there every workgroup reads all of dGh[s] ([BP lanes x 3H]
// float16) every step, 128 times over at v5 (50 MB a step from L2: half the backward's time, by the
// probe that skips those loads); here each reads 1 / KP of it, once, into shared memory.
//   Workgroup item it = (k-part kp = it % KP, column group cg = it / KP); KP = 8 * LF, the subgroups.
//   Phase A (the product, s < T): the item stages dGh[s]'s rows of k-part kp (KPW 16-deep fragments
//   of the 3H, both lane fragments: LF * KPW * 512 bytes) in `ash`, after waiting for their blocks
//   (block flags: word kp counts the blocks of its rows written); subgroup sg multiplies them by W_hh's
//   [KPW * 16 x 16] block of column block cb = cg * KP + sg (its first RES fragments in registers,
//   the rest through a ring of PD loads) and stores its partial [BP x 16] in float32 to `part`
//   (double-buffered by step parity), then the item counts itself into column group cg's word.
//   Phase B (the element work): the item finishes column block ecb = cg * KP + kp: once column
//   group cg's KP items of this step have counted, each element (b, k) sums its KP partials in
//   k-part order (deterministic), then runs gru_backward_element.glsl's finish of dh and gate backward,
//   writes its three blocks of dGh[s-1]'s shadow and counts each into the word of the k-part that
//   reads it.
// Safe to reuse the buffers by parity: an item writes dGh[s-1] only after its column group's
// partials of step s, which needed every k-part's blocks of dGh[s], so every workgroup has finished
// its step s+1 (its reads of dGh[s+1], the same half); likewise `part`, two steps apart. A persistent
// dispatch only (PERSISTENT, every workgroup co-resident; the host plans it so): a step's items
// depend on each other. Word kp (< KP) counts dGh blocks, word KP + cg partial items; GROUP_STRIDE
// spreads them over cache lines. Needs H a multiple of 16 * KP / gcd(3, KP), B <= 16 * LF (one lane
// group), w_off a multiple of 8.
// BIAS_SUMS: the bias gradients summed in the sweep (include/gru_backward_element.glsl).
// F32: the same items in float32 on the threads' FMAs (gru_backward_stream.comp's F32: W_hh's rows as
// vec4 straight from params, w_off in floats, a multiple of 4; dGh[s] from the float32 shadow `g4` in
// include/sweep_simt.glsl's layout). A k-part of dGh[s] is 24H bytes in float32 (v5: 48 KB, all of a
// workgroup's shared memory), so it is staged in NPASS passes of its row quads, each a contiguous run
// of the shadow; subgroup sg's column block of W_hh streams through a register ring of PD chunks (8
// rows x 16 columns, a vec4 per invocation) and the subgroup's slot of `wst`, as the plain split's F32
// does; invocation (lg, cg) takes lanes lg + 8 i and columns 4 cg .. +3. SUBGROUP32 as there.
#define KFLAGS  // block flags (glsl/include/grid_sync.glsl): no grid barrier
#define GROUP_STRIDE 32u
#extension GL_EXT_control_flow_attributes : require
#ifdef F32
#ifdef SUBGROUP32
#extension GL_KHR_memory_scope_semantics : require
#endif
#else
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifndef EMU
#extension GL_KHR_memory_scope_semantics : require
#include "coopmat_ext.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#endif
#endif
#include "phase_clock.glsl"
#ifndef LF
#define LF 2    // lane fragments: B <= 16 * LF
#endif
#ifndef KPW
#define KPW 24  // 16-deep fragments of the 3H rows per k-part: KP * KPW * 16 == 3H
#endif
#ifndef PD
#define PD 4    // W_hh fragments (F32: chunks) whose loads are in flight ahead of the product
#endif
#ifndef NPASS
#define NPASS 1 // F32: passes of the k-part's rows through the stage per step
#endif
#ifndef RES
#define RES 0   // k-fragments whose W_hh fragments stay in registers (one item per workgroup)
#endif
#include "common.glsl"
#include "slots.glsl"

const uint KP = 8u * LF;    // k-parts, and the column blocks of a column group: one per subgroup
const uint BP = 16u * LF;   // lanes, padded
layout(local_size_x_id = 0) in;  // 256 * LF: KP subgroups of 32, a thread per element of a column block

layout(set = 0, binding = 0) readonly buffer Do { float dO[]; };        // [T,B,H] at do_off
#ifdef SAVE16
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
layout(set = 0, binding = 12) SWEEP_COHERENT buffer G4 { vec4 g4[]; };  // dGh's float32 shadow [2][3H/4][BP] (shadow_q)
layout(set = 0, binding = 13) readonly buffer W32 { vec4 w4[]; };       // params again: W_hh [3H,H] at w_off
#else
// dGh's float16 shadow [2][BP][3H] in 16 x 16 blocks (shadow_at), and the same words as uvec4 (staging)
layout(set = 0, binding = 12) SWEEP_COHERENT buffer G16 { float16_t g16[]; };
layout(set = 0, binding = 12) SWEEP_COHERENT buffer G16v { uvec4 g16v[]; };
layout(set = 0, binding = 13) W16_QUAL buffer W16 { float16_t w16[]; }; // W_hh [3H,H] at w_off (halves)
#endif
layout(set = 0, binding = 14) SWEEP_COHERENT buffer Part { float part[]; };  // [2][KP][H/16][LF][16 x 16]
layout(push_constant) uniform Push {
    uint s; uint T; uint B; uint H;
    uint w_off; uint do_off; uint save_off; uint hprev_off; uint dgi_off; uint dgh_off; uint dh0_off;
    uint dgh_ld;   // words between dGh rows: 3H, or H with SAVE16
    uint n_steps;  // steps s, s-1, ..., s-n_steps+1
} pc;
#define SYNC_BINDING 11
#include "grid_sync.glsl"

// Where the partial of k-part kp for column block cb starts (parity p), a [LF][16 x 16] block.
uint part_at(uint p, uint kp, uint cb) { return ((p * KP + kp) * (pc.H / 16u) + cb) * (LF * 256u); }

#ifdef F32
#include "sweep_simt.glsl"
#define G_STORE(p, b, c, cols, v) g4[shadow_q(p, b, c, cols)][(c) % 4u] = (v)
const uint RB = BP / 8u;   // lanes per invocation in the product: lg, lg + 8, ...
const uint KQ = KPW * 4u;  // row quads of a k-part
const uint PQ = KQ / NPASS;  // of them staged per pass (even: whole chunks)
const uint NC = KQ / 2u;   // chunks of 2 row quads per k-part
const uint NCP = PQ / 2u;  // of them per pass
shared vec4 dst[PQ * BP];  // the pass's row quads of dGh[s], [quad][lane] as in the shadow
shared vec4 wst[KP * 32u];  // subgroup sg's chunk of W_hh at 32 sg: row e / 4's column quad e % 4 at e

// Pass `pass` of dGh[s]'s rows of k-part kp into dst: PQ quads of every lane, one contiguous run of
// the shadow, every load of the invocation issued before its stores.
void stage(uint s, uint kp, uint pass) {
    const uint N = PQ * BP, NT = 256u * LF, PER = (N + NT - 1u) / NT;
    uint src = ((s % 2u) * (3u * pc.H / 4u) + kp * KQ + pass * PQ) * BP;
    vec4 v[PER];
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + j * NT;
        if (e < N) v[j] = g4[src + e];
    }
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + j * NT;
        if (e < N) dst[e] = v[j];
    }
}

// Subgroup sg's partial of item (kp, cg) in float32: dGh[s]'s rows of k-part kp (staged pass by
// pass once the k-part's blocks have counted to wait_blocks, 0: no wait) @ W_hh's rows of k-part kp
// at column block cb, in k order, stored to part (parity s % 2). The ring's first chunks are loaded
// before the wait. Uniform per workgroup (the stage's barriers).
void product(uint s, uint kp, uint cb, uint wait_blocks) {
    uint lane = gl_LocalInvocationIndex % 32u, lg = lane % 8u, cg = lane / 8u, k0 = 16u * cb, q0 = kp * KQ;
    uint st = (gl_LocalInvocationIndex / 32u) * 32u;
    vec4 ring[PD];  // chunk c in slot c % PD
    [[unroll]] for (uint c = 0u; c < PD && c < NC; ++c) ring[c] = w_chunk_vec(lane, q0 + 2u * c, k0);
    if (wait_blocks > 0u) kgroup_wait(wait_blocks, kp);
    vec4 acc[RB];
    [[unroll]] for (uint i = 0u; i < RB; ++i) acc[i] = vec4(0.0);
    [[unroll]] for (uint pass = 0u; pass < NPASS; ++pass) {
        if (pass > 0u) barrier();  // dst is free: the pass before multiplied (the item before: its arrival's barrier)
        stage(s, kp, pass);
        barrier();
        if (pass == 0u) PHASE(pc.s - s, 1u);
        [[unroll]] for (uint c = 0u; c < NCP; ++c) {
            uint gc = pass * NCP + c, r = gc % PD;
            KG_BARRIER();  // the subgroup's slot of wst is free: chunk gc - 1 multiplied
            wst[st + lane] = ring[r];
            if (gc + PD < NC) ring[r] = w_chunk_vec(lane, q0 + 2u * (gc + PD), k0);
            KG_BARRIER();  // chunk gc staged
            [[unroll]] for (uint qq = 0u; qq < 2u; ++qq) {
                uint wr = st + 16u * qq + cg;  // row 4 qq + j's column quad cg at wr + 4 j
                vec4 w0 = wst[wr], w1 = wst[wr + 4u], w2 = wst[wr + 8u], w3 = wst[wr + 12u];
                [[unroll]] for (uint i = 0u; i < RB; ++i) {
                    acc[i] = fma4(dst[(2u * c + qq) * BP + lg + 8u * i], w0, w1, w2, w3, acc[i]);
                }
            }
        }
    }
    uint at = part_at(s % 2u, kp, cb);
    [[unroll]] for (uint i = 0u; i < RB; ++i) {
        uint b = lg + 8u * i, e = at + (b / 16u) * 256u + (b % 16u) * 16u + 4u * cg;
        [[unroll]] for (uint c = 0u; c < 4u; ++c) part[e + c] = acc[i][c];
    }
}
#else  // tensor cores
// The item's k-part of dGh[s], lane fragment lf's fragment kf at (lf * KPW + kf) * 64: 8-byte words
// (4 halves), as the tensor-core GEMM's shared tiles, so the stage's 16-byte loads land in two
// conflict-free stores; fragment loads count in words (ASH_UNIT halves), the emulation in halves.
shared uvec2 ash[LF * KPW * 64u];
#ifdef EMU
#define ASH_UNIT 1u
#else
#define ASH_UNIT 4u
#endif
#define A_BUF g16
#define A_SHARED ash
#define A_SHARED_AT(i) float(unpackFloat2x16(ash[(i) / 4u][((i) % 4u) / 2u])[(i) % 2u])
#define B_BUF w16
#define ACC_SHARED part  // the emulation's accumulator store (unused: accumulators go to `part` by ACC_STORE_BUF)
#include "sweep_frag.glsl"
#define G_STORE(p, b, c, cols, v) g16[shadow_at(p, b, c, cols)] = float16_t(v)

#if RES > 0
FRAG_B rw[RES];  // W_hh's first RES fragments of this subgroup's column block in the item's k-part
#endif

// W_hh's fragment kf of k-part kp at column block cb.
void load_w(uint kp, uint kf, uint cb, out FRAG_B w) { LOAD_B(w, w_block(16u * (kp * KPW + kf), 16u * cb), W_LD, false); }

// dGh[s]'s rows of k-part kp, both lane fragments, into ash: LF * KPW blocks of 512 bytes, 16 bytes a
// load, every load of the invocation issued before its stores.
void stage(uint s, uint kp) {
    const uint N = LF * KPW * 32u, NT = 256u * LF, PER = (N + NT - 1u) / NT;  // uvec4s, in all and per invocation
    uvec4 v[PER];
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + j * NT, blk = e / 32u;
        if (e < N) v[j] = g16v[(shadow_frag(s % 2u, blk / KPW, kp * KPW + blk % KPW, 3u * pc.H) + (e % 32u) * 8u) / 8u];
    }
    [[unroll]] for (uint j = 0u; j < PER; ++j) {
        uint e = gl_LocalInvocationIndex + j * NT;
        if (e < N) {
            ash[2u * e] = v[j].xy;  // block e / 32 at word (e / 32) * 64, its 16-byte piece e % 32 at 2 (e % 32)
            ash[2u * e + 1u] = v[j].zw;
        }
    }
}

// Subgroup sg's partial of item (kp, cg): dGh[s]'s rows of k-part kp (staged in ash once the k-part's
// blocks have counted to wait_blocks, 0: no wait) @ W_hh's rows of k-part kp at column block cb, stored
// to part (parity s % 2). The ring's first W_hh loads are issued before the wait: their latency hides
// behind it. Uniform per workgroup (the stage's barrier).
void product(uint s, uint kp, uint cb, uint wait_blocks) {
    FRAG_B w[PD];  // ring over the k-fragments past RES: fragment i in slot (i - RES) % PD
    [[unroll]] for (uint i = RES; i < KPW && i < RES + PD; ++i) load_w(kp, i, cb, w[i - RES]);
    if (wait_blocks > 0u) kgroup_wait(wait_blocks, kp);
    stage(s, kp);
    barrier();
    PHASE(pc.s - s, 1u);
    ACC_T p = ACC_ZERO();
#if LF == 2
    ACC_T q = ACC_ZERO();
#endif
    [[unroll]] for (uint i = 0u; i < KPW; ++i) {
        FRAG_A x;
        LOAD_A_SHARED(x, i * 256u / ASH_UNIT, 16u / ASH_UNIT, false);
#if LF == 2
        FRAG_A y;
        LOAD_A_SHARED(y, (KPW + i) * 256u / ASH_UNIT, 16u / ASH_UNIT, false);
#endif
#if RES > 0
        if (i < RES) {
            p = MUL_ADD(x, rw[i], p);
#if LF == 2
            q = MUL_ADD(y, rw[i], q);
#endif
        } else
#endif
        {
            uint r = (i - RES) % PD;
            p = MUL_ADD(x, w[r], p);
#if LF == 2
            q = MUL_ADD(y, w[r], q);
#endif
            if (i + PD < KPW) load_w(kp, i + PD, cb, w[r]);
        }
    }
    uint at = part_at(s % 2u, kp, cb);
    ACC_STORE_BUF(p, part, at, 16u);
#if LF == 2
    ACC_STORE_BUF(q, part, at + 256u, 16u);
#endif
}
#endif  // F32
#include "gru_backward_element.glsl"

void main() {
    uint tid = gl_LocalInvocationIndex, sg = tid / 32u, u = tid % 16u, b = tid / 16u, H = pc.H;
    uint n_cb = H / 16u, n_it = n_cb, wg = gl_WorkGroupID.x, n_wg = gl_NumWorkGroups.x;
    float c = HPF(hyper, HP_GRADH_CLAMP);
    uint hits = 0u;
#ifdef BIAS_SUMS
    bias_walk = n_it > n_wg;
#endif
#if RES > 0 && !defined(F32)
    [[unroll]] for (uint i = 0u; i < RES; ++i) {
        if (wg < n_it) load_w(wg % KP, i, (wg / KP) * KP + sg, rw[i]);
    }
#endif
    uint products = 0u;  // steps of this dispatch with a product so far
    for (uint i = 0u; i < pc.n_steps; ++i) {
        uint s = pc.s - i;
        if (s < pc.T) {  // phase A: every item's partial (uniform: s is)
            ++products;
            for (uint it = wg; it < n_it; it += n_wg) {
                uint kp = it % KP, cg = it / KP;
                PHASE(i, 0u);
                product(s, kp, cg * KP + sg, i * KPW);  // k-part kp's blocks of dGh[s] written in this dispatch
                PHASE(i, 2u);
                blocks_arrive(uvec3(KP + cg), 1u);  // the item's partials written (and ash free again)
            }
        }
        for (uint it = wg; it < n_it; it += n_wg) {  // phase B: column block ecb's elements
            uint kp = it % KP, cg = it / KP, ecb = cg * KP + kp, k = 16u * ecb + u;
            bool live = b < pc.B;
            float in_u[7] = float[7](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
            float dhz = 0.0;
            if (live) {  // loaded before the wait: their latency hides behind it
                in_u = step_inputs(s, b, k);
                if (s < pc.T) dhz = dhz_mem[b * H + k];
            }
            float mm = 0.0;
            if (s < pc.T) {
                kgroup_wait(products * KP, KP + cg);  // column group cg's KP partials of this step
                uint at = (b / 16u) * 256u + (b % 16u) * 16u + u;
                [[unroll]] for (uint j = 0u; j < KP; ++j) mm += part[part_at(s % 2u, j, ecb) + at];
            }
            PHASE(i, 3u);
            vec4 dg = vec4(0.0);
            float dhz_next = 0.0;
            bool writes = live && element(s, b, k, mm, dhz, in_u, c, hits, dg, dhz_next);
            if (s > 0u && i + 1u < pc.n_steps) {  // r, z, n blocks of ecb, each into its k-part's word
                blocks_arrive(uvec3(ecb, n_cb + ecb, 2u * n_cb + ecb) / KPW, 3u);
            }
            if (writes) element_writes(s, b, k, dg, dhz_next);
        }
        PHASE(i, 4u);
    }
    if (hits > 0u) atomicAdd(stats[ST_CLAMP_HITS], hits);
#ifdef BIAS_SUMS  // the one item's element (item wg finishes column block wg)
    bias_finish(b, 16u * wg + u);
#endif
    grid_sync_done(KP + n_cb / KP);
}
