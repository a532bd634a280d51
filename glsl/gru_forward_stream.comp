#version 450
// The GRU forward sweep with W_hh streamed from a float16 copy on tensor cores: for hidden sizes
// whose W_hh fits neither registers nor shared memory (v5: 25 MB per layer as float16, half the
// H200's L2). Same maths, buffers and push constants as gru_forward.comp (read its header), with
// the product h_prev @ W_hh^T taken from float16 operands with float32 sums, as the COOP
// resident sweep's (the twin's recurrent="fp16").
// A slice is 16 units for every lane (B <= 16 * LF). Its workgroup multiplies [BP lanes x H]
// h_prev by W_hh^T's [H x 48] columns of the slice (3 gates x 16 units) straight from memory with
// fragment loads (include/sweep_frag.glsl), PD fragments' loads in flight: nothing is staged in
// shared memory and nothing of W_hh stays on chip between steps (L2 keeps it: one layer's copy at
// a time). Both operands lie in 16 x 16 blocks of 512 contiguous bytes (BLOCKED_W for W_hh's copy):
// on an H200 at v5, fragments read as 16 rows of 32 bytes at a stride of H took 84% of the step.
// Subgroup sg (of 8 * LF) owns lane fragment sg % LF and k-group sg / LF (8 k-groups of KPG
// 16-deep fragments); its three accumulators (one per gate) are summed with the other k-groups'
// through `red` in two rounds (k-groups 4..7 into 0..3, then the gates add the 4 in order:
// deterministic).
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
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifndef EMU
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require
#endif
#include "phase_clock.glsl"
#ifndef LF
#define LF 2    // lane fragments: B <= 16 * LF
#endif
#ifndef KPG
#define KPG 2   // 16-deep k-fragments per k-group: 8 * KPG * 16 >= H
#endif
#ifndef PD
#define PD 4    // fragments whose loads are in flight ahead of the product
#endif
#ifndef PROBE
#define PROBE 0 // timing probes (tools/bench_stream.py; wrong results): 1 no W_hh loads, 2 no h_prev loads
#endif
#ifndef FULL
#define FULL false  // true: every k-group has KPG fragments (8 * KPG * 16 == the product's depth)
#endif
#include "common.glsl"

const uint KG = 8u;         // k-groups
const uint RK = 4u;         // k-group slots of red after the first round
const uint BP = 16u * LF;   // lanes, padded
layout(local_size_x_id = 0) in;  // 256 * LF: 8 * LF subgroups of 32, a thread per gate output

layout(set = 0, binding = 0) readonly buffer Gi { float gi[]; };        // [T,B,3H] at gi_off
layout(set = 0, binding = 1) readonly buffer P { float params[]; };     // b_hh [3H] at b_off
layout(set = 0, binding = 2) readonly buffer H0 { float h0[]; };        // [B,H] at h0_off
layout(set = 0, binding = 3) readonly buffer Resets { uint resets[]; }; // [T,B]
layout(set = 0, binding = 4) buffer Out { float o[]; };                 // [T,B,H] at o_off
layout(set = 0, binding = 5) writeonly buffer Hprev { float hprev[]; }; // [B,H] at hprev_off (t == 0 only)
layout(set = 0, binding = 6) writeonly buffer Save { float save[]; };   // [T,B,4H] at save_off: r, z, n, ghn
layout(set = 0, binding = 7) writeonly buffer HT { float hT[]; };       // [B,H] at hT_off
layout(set = 0, binding = 8) SWEEP_COHERENT buffer H16 { float16_t h16[]; };  // [2][BP][H] in blocks (shadow_at)
layout(set = 0, binding = 10) buffer Stats { uint stats[]; };
layout(set = 0, binding = 11) readonly buffer W16 { float16_t w16[]; }; // W_hh [3H,H] at w_off (halves)
layout(push_constant) uniform Push {
    uint t; uint T; uint B; uint H;
    uint gi_off; uint w_off; uint b_off; uint h0_off; uint o_off; uint hprev_off; uint save_off; uint hT_off;
    uint t_end;  // steps [t, t_end); t == t_end: the prologue alone
} pc;
#define SYNC_BINDING 9
#include "grid_sync.glsl"

shared float red[RK * LF * 3u * 256u];  // red[((slot * LF + lf) * 3 + g) * 256 + row * 16 + unit]
#define A_BUF h16
#define B_BUF w16
#define ACC_SHARED red
#include "sweep_frag.glsl"

float keep(uint t, uint b) { return 1.0 - float(resets[t * pc.B + b]); }

// h16[0] for the slice's units: h0 after step 0's reset.
void prologue(uint j0, uint tid) {
    uint b = tid / 16u, j = j0 + tid % 16u;
    if (b < pc.B) h16[shadow_at(0u, b, j, pc.H)] = float16_t(h0[pc.h0_off + b * pc.H + j] * keep(0u, b));
}

// Fragment kf's operands: h_prev's (its lane fragment's blocks from a0) and gate g's W_hh^T for the 16 units from j0.
void load_frags(uint a0, uint j0, uint kf, out FRAG_A a, out FRAG_B w0, out FRAG_B w1, out FRAG_B w2) {
    uint H = pc.H;
#if PROBE == 2  // timing probe: no h_prev loads (the product multiplies W by W)
    LOAD_B(w0, w_block(j0, 16u * kf), W_LD, true);
    a = w0;
#else
    LOAD_A(a, a0 + 256u * kf, 16u, false);
#endif
#if PROBE == 1  // timing probe: no W_hh loads (the product multiplies h_prev by h_prev)
    w0 = a;
    w1 = a;
    w2 = a;
#else
    LOAD_B(w0, w_block(j0, 16u * kf), W_LD, true);
    LOAD_B(w1, w_block(H + j0, 16u * kf), W_LD, true);
    LOAD_B(w2, w_block(2u * H + j0, 16u * kf), W_LD, true);
#endif
}

// The slice's product at step t into red: gate g's 16 x 16 block of lane fragment lf, k-group
// slots 0..3 (each the sum of two k-groups).
void product(uint t, uint j0, uint sg) {
    uint H = pc.H, lf = sg % LF, kg = sg / LF, n_kf = H / 16u;
    uint a0 = shadow_frag(t % 2u, lf, 0u, H);
    // three accumulators, not an array: spirv-opt (shaderc 2022) crashes on arrays of them
    ACC_T acc0 = ACC_ZERO(), acc1 = ACC_ZERO(), acc2 = ACC_ZERO();
    // A ring of PD fragments' operands: the loads of fragment i + PD are issued right after
    // fragment i is multiplied, so PD fragments' L2 round trips overlap (a loop that loads and then
    // multiplies each fragment waits out one round trip per fragment).
    FRAG_A a[PD];
    FRAG_B w0[PD], w1[PD], w2[PD];  // (k, unit) = W_hh[g*H + j0 + unit, 16 kf + k] for gates g = 0, 1, 2
    [[unroll]] for (uint i = 0u; i < PD && i < KPG; ++i) {
        uint kf = kg * KPG + i;
        if (FULL || kf < n_kf) load_frags(a0, j0, kf, a[i], w0[i], w1[i], w2[i]);
    }
    [[unroll]] for (uint i = 0u; i < KPG; ++i) {
        uint kf = kg * KPG + i, r = i % PD;
        if (FULL || kf < n_kf) {  // FULL: no bound checks (every k-group whole)
            acc0 = MUL_ADD(a[r], w0[r], acc0);
            acc1 = MUL_ADD(a[r], w1[r], acc1);
            acc2 = MUL_ADD(a[r], w2[r], acc2);
        }
        if (i + PD < KPG && (FULL || kf + PD < n_kf)) load_frags(a0, j0, kf + PD, a[r], w0[r], w1[r], w2[r]);
    }
    uint slot = (kg % RK) * LF + lf;  // red's blocks of this subgroup: (slot * 3 + g) * 256
    if (kg >= RK) {
        ACC_STORE(acc0, (slot * 3u) * 256u, 16u);
        ACC_STORE(acc1, (slot * 3u + 1u) * 256u, 16u);
        ACC_STORE(acc2, (slot * 3u + 2u) * 256u, 16u);
    }
    barrier();
    if (kg < RK) {
        ACC_T other;
        ACC_LOAD(other, (slot * 3u) * 256u, 16u);
        other = ACC_ADD(other, acc0);
        ACC_STORE(other, (slot * 3u) * 256u, 16u);
        ACC_LOAD(other, (slot * 3u + 1u) * 256u, 16u);
        other = ACC_ADD(other, acc1);
        ACC_STORE(other, (slot * 3u + 1u) * 256u, 16u);
        ACC_LOAD(other, (slot * 3u + 2u) * 256u, 16u);
        other = ACC_ADD(other, acc2);
        ACC_STORE(other, (slot * 3u + 2u) * 256u, 16u);
    }
    barrier();
}

#ifdef BOTH_LANES
// The product with both lane fragments per subgroup (LF == 2; CATCHAT_STREAM_SPLIT=lanes, to measure):
// 16 k-groups, one per subgroup, each W_hh fragment loaded once per workgroup instead of once per
// lane fragment; the 16 k-groups fold into red's 4 slots in rounds, highest first (slot s =
// ((kg s+12 + kg s+8) + kg s+4) + kg s: deterministic).
const uint KGS = 8u * LF;

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

void product_both(uint t, uint j0, uint kg) {
    uint H = pc.H, n_kf = H / 16u;
    uint a0 = shadow_frag(t % 2u, 0u, 0u, H), a1 = shadow_frag(t % 2u, 1u, 0u, H);
    ACC_T p0 = ACC_ZERO(), p1 = ACC_ZERO(), p2 = ACC_ZERO();  // lane fragment 0, gates 0..2
    ACC_T q0 = ACC_ZERO(), q1 = ACC_ZERO(), q2 = ACC_ZERO();  // lane fragment 1
    FRAG_A x[PD], y[PD];
    FRAG_B w0[PD], w1[PD], w2[PD];
    [[unroll]] for (uint i = 0u; i < PD && i < KPG; ++i) {
        uint kf = kg * KPG + i;
        if (FULL || kf < n_kf) {
            load_frags(a0, j0, kf, x[i], w0[i], w1[i], w2[i]);
            LOAD_A(y[i], a1 + 256u * kf, 16u, false);
        }
    }
    [[unroll]] for (uint i = 0u; i < KPG; ++i) {
        uint kf = kg * KPG + i, r = i % PD;
        if (FULL || kf < n_kf) {
            p0 = MUL_ADD(x[r], w0[r], p0);
            p1 = MUL_ADD(x[r], w1[r], p1);
            p2 = MUL_ADD(x[r], w2[r], p2);
            q0 = MUL_ADD(y[r], w0[r], q0);
            q1 = MUL_ADD(y[r], w1[r], q1);
            q2 = MUL_ADD(y[r], w2[r], q2);
        }
        if (i + PD < KPG && (FULL || kf + PD < n_kf)) {
            load_frags(a0, j0, kf + PD, x[r], w0[r], w1[r], w2[r]);
            LOAD_A(y[r], a1 + 256u * (kf + PD), 16u, false);
        }
    }
    for (uint round = KGS / RK; round-- > 0u;) {  // uniform: the barrier is every subgroup's
        if (kg / RK == round) {
            uint b0 = (kg % RK) * LF * 3u * 256u;  // slot kg % RK: lane fragment 0's 3 blocks, then 1's
            bool first = round + 1u == KGS / RK;
            fold(p0, b0, first);
            fold(p1, b0 + 256u, first);
            fold(p2, b0 + 512u, first);
            fold(q0, b0 + 768u, first);
            fold(q1, b0 + 1024u, first);
            fold(q2, b0 + 1280u, first);
        }
        barrier();
    }
}
#endif

// Gate output (lane b, unit j) of step t from red, its gi, b_hh and h_prev hp (float32, reset
// applied): o[t], save[t], hprev at t = 0, hT at T-1, and h16 for step t+1.
void gate(uint t, uint b, uint j, uint u, vec3 gi3, vec3 bias, float hp) {
    uint H = pc.H, lf = b / 16u, rc = (b % 16u) * 16u + u;
    vec3 gh = bias;
    [[unroll]] for (uint g = 0u; g < 3u; ++g) {
        [[unroll]] for (uint s = 0u; s < RK; ++s) gh[g] += red[((s * LF + lf) * 3u + g) * 256u + rc];
    }
    float r = sigmoid(gi3.x + gh.x);
    float z = sigmoid(gi3.y + gh.y);
    float n = tanh_safe(gi3.z + r * gh.z);
    float h = (1.0 - z) * n + z * hp;
    uint row = t * pc.B + b, sb = pc.save_off + row * 4u * H;
    o[pc.o_off + row * H + j] = h;
    if (t + 1u < pc.T) h16[shadow_at((t + 1u) % 2u, b, j, H)] = float16_t(h * keep(t + 1u, b));
    if (t == 0u) hprev[pc.hprev_off + b * H + j] = hp;
    save[sb + j] = r;
    save[sb + H + j] = z;
    save[sb + 2u * H + j] = n;
    save[sb + 3u * H + j] = gh.z;
    if (t + 1u == pc.T) hT[pc.hT_off + b * H + j] = h;
}

void main() {
    uint tid = gl_LocalInvocationIndex, sg = tid / 32u, u = tid % 16u, b = tid / 16u, H = pc.H;
    uint n_sl = H / 16u, wg = gl_WorkGroupID.x, n_wg = gl_NumWorkGroups.x;
    bool live = b < pc.B;
    uint k = 0u;  // grid barriers passed
#ifdef PERSISTENT
    if (pc.t == 0u) {
        for (uint sl = wg; sl < n_sl; sl += n_wg) prologue(16u * sl, tid);
        if (pc.t < pc.t_end && !grid_sync(++k)) return;
    }
#else
    if (pc.t == pc.t_end) {
        if (wg < n_sl) prologue(16u * wg, tid);
        return;
    }
#endif
    for (uint t = pc.t; t < pc.t_end; ++t) {
        for (uint sl = wg; sl < n_sl; sl += n_wg) {
            uint j0 = 16u * sl, j = j0 + u;
            vec3 gi3 = vec3(0.0), bias = vec3(0.0);
            float hp = 0.0;
            if (live) {  // loaded before the product: their latency hides behind it
                uint gib = pc.gi_off + (t * pc.B + b) * 3u * H + j;
                gi3 = vec3(gi[gib], gi[gib + H], gi[gib + 2u * H]);
                bias = vec3(params[pc.b_off + j], params[pc.b_off + H + j], params[pc.b_off + 2u * H + j]);
                hp = (t == 0u ? h0[pc.h0_off + b * H + j] : o[pc.o_off + ((t - 1u) * pc.B + b) * H + j]) * keep(t, b);
            }
            PHASE(t, 0u);
#ifdef BOTH_LANES
            product_both(t, j0, sg);
#else
            product(t, j0, sg);
#endif
            PHASE(t, 1u);
            if (live) gate(t, b, j, u, gi3, bias, hp);
            barrier();  // red is rewritten by the next slice
        }
        PHASE(t, 2u);
#ifdef PERSISTENT
        if (t + 1u < pc.t_end && !grid_sync(++k)) break;
#endif
    }
#ifdef PERSISTENT
    grid_sync_done(1u);
#endif
}
