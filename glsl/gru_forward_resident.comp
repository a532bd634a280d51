#version 450
// The GRU forward sweep with W_hh kept in registers (a persistent RNN, Diamos et al. 2016).
// Same maths, buffers and push constants as gru_forward.comp (read its header); what differs is
// where W_hh lives. A tile is NU units x TB lanes; its workgroup holds the tile's 3*NU rows of
// W_hh in registers for the whole sweep when every tile has its own workgroup (resident: one
// PERSISTENT dispatch of n_tiles co-resident workgroups), so a step streams only the TB lanes of
// h_prev (TB*H floats) instead of W_hh's slice. Workgroups that walk several tiles (fewer
// workgroups than tiles, or one dispatch per step) reload W per tile: same results, slower.
// Work split: thread (s, u) owns k-slice s (vec4 columns s, s + KS, ..., KV of them: consecutive
// threads read consecutive vec4, no bank conflicts) of units u*RU .. +RU, all 3 gates: 12*RU*KV
// registers of W. Per batch of LB lanes it forms 3*RU*LB partial sums over its slice; the SL
// slices of a subgroup reduce them by shuffles (transposed: each level halves the values a
// thread holds), the KS/SL slice groups through shared memory in group order (deterministic).
// Between steps only the workgroups of one lane tile meet (group_arrive/group_wait): lanes are
// independent. A step: stage h_prev of the tile's lanes (vec4 loads where H and o_off allow,
// HV4) -> matmul and reduction -> gates, o[t] written -> arrive -> the writes nobody in the sweep
// reads (save, hT, hprev at t = 0) and the next step's gi loads, while the other workgroups
// finish -> wait.
// COOP (train.precision fp16; gru.coop_sweeps): the tile's product on cooperative matrices (tensor cores,
// VK_NV_cooperative_matrix, subgroups of 32) instead of the threads' FMAs. Tiles of NU = 16 units x
// TB = 16 lanes only: the product [16 lanes x H] x [H x 48] is 3 fragment columns (one per gate) of
// 16 x 16 float32 accumulators over ceil(H/16) 16-deep k-fragments, split into 4 k-groups: subgroup
// w < 12 owns gate w % 3 and k-group w / 3, i.e. COOP_KF fragments of W_hh^T held as float16 for
// the whole sweep, and writes its 16 x 16 partial sums into red as k-group kg (so gate() sums 4 of
// them, in k-group order: deterministic). h_prev is staged as float16 (rounded to nearest even), so
// the product takes float16 h_prev and W_hh with float32 sums (the twin rounds the same operands);
// the gates' own h_prev (z * h_prev) stays float32, read by each output's thread while staging.
// EMU (with COOP): emulated fragments (include/resident_frag.glsl), for devices without cooperative matrices.
// SPLIT (with COOP; a float32 program's forward, CATCHAT_RESIDENT_SPLIT): the product in float32 from float16
// splits, x = hi + lo / SPLIT_SCALE (include/split_half.glsl), as the streamed forward's SPLIT: W_hh^T's hi
// and lo fragments held for the sweep (wf, wl), h_prev staged as hi then lo (hs16 twice), hi hi into one
// accumulator and hi lo + lo hi into another, folded as acc + accl / SPLIT_SCALE before the k-groups meet.
#extension GL_EXT_control_flow_attributes : require
#ifdef COOP
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifndef EMU
#extension GL_KHR_memory_scope_semantics : require
#include "coopmat_ext.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#endif
#endif
#include "phase_clock.glsl"
// (defaults: a small valid tile, so the shader compiles on its own)
#ifndef NU
#define NU 16
#endif
#ifndef TB
#define TB 4
#endif
#ifndef RU
#define RU 2
#endif
#ifndef KV
#define KV 2
#endif
#ifndef LB
#define LB 4
#endif
#ifndef KS
#define KS 8
#endif
#ifndef SL
#define SL 8
#endif
#ifndef LOG2SL
#define LOG2SL 3
#endif
#ifndef NTR
#define NTR 3
#endif
#include "common.glsl"

// Compile-time (host: gru.resident_defines): NU units and TB lanes per tile, RU units per thread,
// KV vec4 of k per thread, KS k-slices (KS*KV*4 >= H), LB lanes per batch (divides TB), SL slices
// reduced by shuffles (a power of two dividing KS, at most the subgroup size), LOG2SL, NTR
// transposed shuffle levels (<= LOG2SL, 3*RU*LB divisible by 2^NTR).
const uint NUG = NU / RU;     // unit groups
#ifdef COOP
const uint KG = 4u;           // k-groups of fragments, summed through shared memory
#else
const uint KG = KS / SL;      // slice groups, summed through shared memory
#endif
const uint RS = KS * KV;      // vec4 per staged h row
const uint NV = 3u * RU * LB; // partial sums per thread per batch: index (g * RU + ru) * LB + lb
const uint NF = NV >> NTR;    // values a thread holds after the transposed levels
#include "slice_reduce.glsl"
layout(local_size_x_id = 0) in;  // NUG * KS
const uint NT = gl_WorkGroupSize.x;

layout(set = 0, binding = 0) readonly buffer Gi { float gi[]; };        // [T,B,3H] at gi_off
layout(set = 0, binding = 1) readonly buffer P { float params[]; };     // W_hh [3H,H] at w_off, b_hh [3H]
layout(set = 0, binding = 2) readonly buffer H0 { float h0[]; };        // [B,H] at h0_off
layout(set = 0, binding = 3) readonly buffer Resets { uint resets[]; }; // [T,B]
layout(set = 0, binding = 4) SWEEP_COHERENT writeonly buffer Out { float o[]; };  // [T,B,H] at o_off
layout(set = 0, binding = 5) writeonly buffer Hprev { float hprev[]; }; // [B,H] at hprev_off (t == 0 only)
layout(set = 0, binding = 6) writeonly buffer Save { float save[]; };   // [T,B,4H] at save_off: r, z, n, ghn
layout(set = 0, binding = 7) writeonly buffer HT { float hT[]; };       // [B,H] at hT_off
#ifdef HV4  // H and o_off multiples of 4: o[t-1] rows as vec4
layout(set = 0, binding = 8) SWEEP_COHERENT readonly buffer Prev { vec4 o_in4[]; };  // o again: o[t-1]
#else
layout(set = 0, binding = 8) SWEEP_COHERENT readonly buffer Prev { float o_in[]; };
#endif
layout(push_constant) uniform Push {
    uint t; uint T; uint B; uint H;
    uint gi_off; uint w_off; uint b_off; uint h0_off; uint o_off; uint hprev_off; uint save_off; uint hT_off;
    uint t_end;  // steps [t, t_end)
} pc;
layout(set = 0, binding = 10) buffer Stats { uint stats[]; };
#define SYNC_BINDING 9
#include "grid_sync.glsl"

shared float red[KG * 3u * TB * NU];  // red[((kg * 3 + g) * TB + bb) * NU + u]: slice group kg's sums
#ifdef COOP
const uint KFT = 4u * COOP_KF;         // k-fragments staged (>= H / 16)
const uint SH = 16u * KFT + 8u;        // hs16's row stride in halves (16-byte rows, padded)
#ifdef SPLIT
#include "split_half.glsl"
const uint LO_AT = TB * SH;            // h_prev's lo part, after its hi
#define HS_HALVES (2u * TB * SH)
#else
#define HS_HALVES (TB * SH)
#endif
// hs16[bb * SH + k] = h_prev[b0 + bb, k] as float16 (0 past B, H); SPLIT: its hi there and its lo at LO_AT
// + bb * SH + k; first W_hh's fragments' scratch
shared float16_t hs16[HS_HALVES > 3072u ? HS_HALVES : 3072u];
float hp_own;                          // the thread's own output's h_prev (float32), for its gate
#define A_SHARED hs16
#define ACC_SHARED red
#include "resident_frag.glsl"
#else
shared vec4 hs[TB * RS];            // hs[bb * RS + q] = h_prev[b0 + bb, 4q .. 4q+3] (0 past B, H)

vec4 w[3][RU][KV];  // w[g][ru][i] = W_hh[g*H + j0 + u*RU + ru, 4(s + KS*i) .. +3] (0 past H)
#endif

// h_prev[b, 4q .. 4q+3] entering step t, after the reset (b < B, 4q < H; 0 past H).
vec4 h_prev4(uint t, uint b, uint q) {
    uint H = pc.H, k = 4u * q;
    vec4 v = vec4(0.0);
#ifdef HV4
    if (t > 0u) {
        v = o_in4[(pc.o_off + ((t - 1u) * pc.B + b) * H) / 4u + q];
    } else
#endif
    {
        [[unroll]] for (uint c = 0u; c < 4u; ++c) {
            if (k + c < H) {
#ifdef HV4
                v[c] = h0[pc.h0_off + b * H + k + c];
#else
                v[c] = t == 0u ? h0[pc.h0_off + b * H + k + c] : o_in[pc.o_off + ((t - 1u) * pc.B + b) * H + k + c];
#endif
            }
        }
    }
    return v * (1.0 - float(resets[t * pc.B + b]));
}

#ifndef COOP
void load_w(uint j0, uint u, uint s) {
    [[unroll]] for (uint g = 0u; g < 3u; ++g) {
        [[unroll]] for (uint ru = 0u; ru < RU; ++ru) {
            uint j = j0 + u * RU + ru;
            [[unroll]] for (uint i = 0u; i < KV; ++i) {
                uint k = 4u * (s + KS * i);
                vec4 v = vec4(0.0);
                [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                    if (j < pc.H && k + c < pc.H) v[c] = params[pc.w_off + (g * pc.H + j) * pc.H + k + c];
                }
                w[g][ru][i] = v;
            }
        }
    }
}
#endif

// Gate output p of a tile: unit j0 + p % NU, lane b0 + p / NU.
bool gate_live(uint j0, uint b0, uint p) { return p < NU * TB && j0 + p % NU < pc.H && b0 + p / NU < pc.B; }

// Its gi (r, z, n) at step t, 0 outside.
vec3 gate_inputs(uint t, uint j0, uint b0, uint p) {
    if (!gate_live(j0, b0, p)) return vec3(0.0);
    uint j = j0 + p % NU, H = pc.H, gib = pc.gi_off + (t * pc.B + b0 + p / NU) * 3u * H + j;
    return vec3(gi[gib], gi[gib + H], gi[gib + 2u * H]);
}

// Its b_hh (r, z, n), 0 outside.
vec3 gate_bias(uint j0, uint b0, uint p) {
    if (!gate_live(j0, b0, p)) return vec3(0.0);
    uint j = j0 + p % NU, H = pc.H;
    return vec3(params[pc.b_off + j], params[pc.b_off + H + j], params[pc.b_off + 2u * H + j]);
}

// Its gates from the slice groups' sums in `red` and h_prev in `hs`; writes o[t] (what the next
// step reads) and returns (h, r, z, n, ghn, h_prev) for put_state.
float[6] gate(uint t, uint j0, uint b0, uint p, vec3 gi3, vec3 bias) {
    uint u = p % NU, bb = p / NU, j = j0 + u, b = b0 + bb, H = pc.H;
    vec3 gh = bias;
    [[unroll]] for (uint g = 0u; g < 3u; ++g) {
        for (uint q = 0u; q < KG; ++q) gh[g] += red[((q * 3u + g) * TB + bb) * NU + u];
    }
    float r = sigmoid(gi3.x + gh.x);
    float z = sigmoid(gi3.y + gh.y);
    float n = tanh_safe(gi3.z + r * gh.z);
#ifdef COOP
    float hp = hp_own;  // p == the calling thread's index (COOP: NU * TB <= threads)
#else
    float hp = hs[bb * RS + j / 4u][j % 4u];
#endif
    float h = (1.0 - z) * n + z * hp;
    o[pc.o_off + (t * pc.B + b) * H + j] = h;
    return float[6](h, r, z, n, gh.z, hp);
}

// The rest of output p's step t: save (r, z, n, ghn), hT at the last step, and hprev at the first
// (the state entering step t >= 1 is o[t-1]: gru_forward.comp's header).
void put_state(uint t, uint j0, uint b0, uint p, float[6] v) {
    uint j = j0 + p % NU, b = b0 + p / NU, H = pc.H, row = t * pc.B + b, sb = pc.save_off + row * 4u * H;
    if (t == 0u) hprev[pc.hprev_off + b * H + j] = v[5];
    save[sb + j] = v[1];
    save[sb + H + j] = v[2];
    save[sb + 2u * H + j] = v[3];
    save[sb + 3u * H + j] = v[4];
    if (t + 1u == pc.T) hT[pc.hT_off + b * H + j] = v[0];
}

#ifdef COOP
// Stage h_prev of the tile's lanes as float16, all k (zero to KFT * 16), into hs16; each output's
// thread keeps its own h_prev in float32 (hp_own). Every load is issued before the first store (a
// fixed count per thread, unrolled), so a step waits on L2 once, not once per quad; the rows'
// padding past KFT * 16 halves is never read by a fragment load, so it is not written.
void stage_h(uint t, uint j0, uint b0) {
    const uint QR = 4u * KFT;                       // quads of a staged row that hold k
    const uint NQ = (TB * QR + NT - 1u) / NT;       // quads per thread
    uint tid = gl_LocalInvocationIndex;
    vec4 v[NQ];
    [[unroll]] for (uint i = 0u; i < NQ; ++i) {
        uint e = tid + i * NT, bb = e / QR, q = e % QR, b = b0 + bb;
        v[i] = (e < TB * QR && b < pc.B && 4u * q < pc.H) ? h_prev4(t, b, q) : vec4(0.0);
    }
    if (gate_live(j0, b0, tid)) hp_own = h_prev4(t, b0 + tid / NU, (j0 + tid % NU) / 4u)[(j0 + tid % NU) % 4u];
    [[unroll]] for (uint i = 0u; i < NQ; ++i) {
        uint e = tid + i * NT, bb = e / QR, q = e % QR;
        if (e < TB * QR) {
            [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                hs16[bb * SH + 4u * q + c] = float16_t(v[i][c]);
#ifdef SPLIT
                hs16[LO_AT + bb * SH + 4u * q + c] = split_lo(v[i][c]);
#endif
            }
        }
    }
}

// The gate's and k-group's W_hh^T fragments of subgroup sg (< 12): element (k, n) of fragment f is
// W_hh[g*H + j0 + n, 16*(kgroup*COOP_KF + f) + k] as float16 (lo: SPLIT's lo part of it), staged one at a
// time through hs16 (before the sweep's first staging of h_prev; barriers around it, the caller's).
#if defined(SPLIT) || defined(EMU)  // the part to load (lo), an argument only where it is read
#define LO_PARAM , bool lo
#define LO_ARG(lo) , lo
#else
#define LO_PARAM
#define LO_ARG(lo)
#endif
void load_w_frags(uint j0, uint sg LO_PARAM, out FRAG_B wf[COOP_KF]) {
    uint g = sg % 3u, kgroup = sg / 3u, lane = gl_LocalInvocationIndex % 32u, base = sg * 256u;
    [[unroll]] for (uint f = 0u; f < COOP_KF; ++f) {
        uint k0 = 16u * (kgroup * COOP_KF + f);
#ifdef EMU
        wf[f] = W_FRAG_REF(g * pc.H + j0, k0, true, lo);
#else
        for (uint e = lane; e < 256u; e += 32u) {
            uint n = e / 16u, k = e % 16u, j = j0 + n;
            float v = (j < pc.H && k0 + k < pc.H) ? params[pc.w_off + (g * pc.H + j) * pc.H + k0 + k] : 0.0;
#ifdef SPLIT
            hs16[base + e] = lo ? split_lo(v) : float16_t(v);  // column-major (k, n) at n * 16 + k
#else
            hs16[base + e] = float16_t(v);  // column-major (k, n) at n * 16 + k
#endif
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        CM_LOAD(wf[f], hs16, base, 16u, true);
        subgroupBarrier();  // the scratch is rewritten by the next fragment
#endif
    }
}
#else
// Stage h_prev of the tile's lanes, all k, into hs.
void stage_h(uint t, uint j0, uint b0) {
    const uint n = (TB * RS + NT - 1u) / NT;
    [[unroll]] for (uint i = 0u; i < n; ++i) {
        uint e = gl_LocalInvocationIndex + i * NT, b = b0 + e / RS, q = e % RS;
        if (e < TB * RS) hs[e] = (b < pc.B && 4u * q < pc.H) ? h_prev4(t, b, q) : vec4(0.0);
    }
}

#endif

#ifndef COOP
// The tile's matmul: gh partial sums of slice group kg into red.
void matmul(uint u, uint s, uint sl, uint kg) {
    for (uint bat = 0u; bat < TB / LB; ++bat) {
        float acc[NV];
        [[unroll]] for (uint a = 0u; a < NV; ++a) acc[a] = 0.0;
        [[unroll]] for (uint lb = 0u; lb < LB; ++lb) {
            [[unroll]] for (uint i = 0u; i < KV; ++i) {
                vec4 hv = hs[(bat * LB + lb) * RS + s + KS * i];
                [[unroll]] for (uint g = 0u; g < 3u; ++g) {
                    [[unroll]] for (uint ru = 0u; ru < RU; ++ru) {
                        uint a = (g * RU + ru) * LB + lb;
                        vec4 wv = w[g][ru][i];
                        acc[a] = fma(wv.w, hv.w, fma(wv.z, hv.z, fma(wv.y, hv.y, fma(wv.x, hv.x, acc[a]))));
                    }
                }
            }
        }
        uint off = slice_reduce(acc, sl);
        if (slice_writes(sl)) {
            [[unroll]] for (uint f = 0u; f < NF; ++f) {
                uint a = off + f, g = a / (RU * LB), ru = (a / LB) % RU, bb = bat * LB + a % LB;
                red[((kg * 3u + g) * TB + bb) * NU + u * RU + ru] = acc[f];
            }
        }
    }
}
#endif

void main() {
    uint tid = gl_LocalInvocationIndex;
    uint sl = tid % SL, u = (tid / SL) % NUG, kg = tid / (SL * NUG), s = kg * SL + sl;
    uint n_tj = ceil_div(pc.H, NU), n_tiles = n_tj * ceil_div(pc.B, TB);
    uint wg = gl_WorkGroupID.x, n_wg = gl_NumWorkGroups.x;
    // Resident: one tile per workgroup, its W and bias loaded once, its gi one step ahead, and
    // only the workgroups of its lane tile to meet. Else (more tiles than workgroups) all reloaded
    // per tile, all workgroups meet.
    bool resident = n_tiles <= n_wg;
    uint group = resident ? wg / n_tj : 0u, group_n = resident ? n_tj : n_wg;
    uint j0 = (wg % n_tj) * NU, b0 = (wg / n_tj) * TB;
    vec3 bias = vec3(0.0), gi3 = vec3(0.0);
#ifdef COOP
    uint sg = tid / 32u;
    FRAG_B wf[COOP_KF];
#ifdef SPLIT
    FRAG_B wl[COOP_KF];
#define LOAD_W() { if (sg < 12u) { load_w_frags(j0, sg LO_ARG(false), wf); load_w_frags(j0, sg LO_ARG(true), wl); } barrier(); }
#else
#define LOAD_W() { if (sg < 12u) load_w_frags(j0, sg LO_ARG(false), wf); barrier(); }
#endif
#else
#define LOAD_W() load_w(j0, u, s)
#endif
    if (resident && wg < n_tiles) {
        LOAD_W();
        bias = gate_bias(j0, b0, tid);
        gi3 = gate_inputs(pc.t, j0, b0, tid);
    }
    for (uint t = pc.t; t < pc.t_end && wg < n_tiles; ++t) {
        for (uint tile = wg; tile < n_tiles; tile += n_wg) {
            if (!resident) {
                j0 = (tile % n_tj) * NU;
                b0 = (tile / n_tj) * TB;
                LOAD_W();
                bias = gate_bias(j0, b0, tid);
                gi3 = gate_inputs(t, j0, b0, tid);
            }
            PHASE(t, 0u);
            stage_h(t, j0, b0);
            barrier();
            PHASE(t, 1u);
#ifdef COOP
            if (sg < 12u) {  // gate sg % 3, k-group sg / 3: a 16 x 16 partial of the [16 lanes x 48] product
                ACC_T acc = ACC_ZERO();
#ifdef SPLIT
                ACC_T accl = ACC_ZERO();
#endif
                [[unroll]] for (uint f = 0u; f < COOP_KF; ++f) {
                    FRAG_A a;
                    LOAD_A_SHARED(a, 16u * ((sg / 3u) * COOP_KF + f), SH, false);
                    acc = MUL_ADD(a, wf[f], acc);
#ifdef SPLIT
                    FRAG_A al;
                    LOAD_A_SHARED(al, LO_AT + 16u * ((sg / 3u) * COOP_KF + f), SH, false);
                    accl = MUL_ADD(a, wl[f], accl);
                    accl = MUL_ADD(al, wf[f], accl);
#endif
                }
#ifdef SPLIT
                ACC_ADD_SCALED(acc, accl, 1.0 / SPLIT_SCALE);
#endif
                ACC_STORE(acc, (((sg / 3u) * 3u + sg % 3u) * TB) * NU, NU);
            }
#else
            matmul(u, s, sl, kg);
#endif
            barrier();
            bool live = gate_live(j0, b0, tid);
            float v[6] = live ? gate(t, j0, b0, tid, gi3, bias) : float[6](0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
            for (uint p = tid + NT; p < NU * TB; p += NT) {  // more outputs than threads (small tiles)
                if (gate_live(j0, b0, p))
                    put_state(t, j0, b0, p, gate(t, j0, b0, p, gate_inputs(t, j0, b0, p), gate_bias(j0, b0, p)));
            }
            bool more = t + 1u < pc.t_end;
            PHASE(t, 2u);
#ifdef PERSISTENT
            if (resident && more) group_arrive(group);
#endif
            PHASE(t, 3u);
            if (live) put_state(t, j0, b0, tid, v);
            if (resident && more) gi3 = gate_inputs(t + 1u, j0, b0, tid);
#ifdef PERSISTENT
            if (!resident || !more) barrier();  // hs and red are reused by the next tile
#else
            barrier();
#endif
        }
        PHASE(t, 4u);
#ifdef PERSISTENT
        if (t + 1u < pc.t_end) {
            if (!(resident ? group_wait(t + 1u - pc.t, group, group_n) : grid_sync(t + 1u - pc.t))) break;
        }
#endif
    }
#ifdef PERSISTENT
    grid_sync_done(resident ? ceil_div(pc.B, TB) : 1u);
#endif
}
