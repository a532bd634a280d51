#version 450
// The GRU backward sweep with W_hh kept in registers (a persistent RNN, Diamos et al. 2016).
// Same maths, buffers and push constants as gru_backward.comp (read its header for step s), plus
// a partial-sum buffer. A tile is NU units x TB lanes, the forward resident sweep's tile: its
// workgroup holds the tile's 3*NU rows of W_hh (all H columns) in registers for the whole sweep
// when every tile has its own workgroup (resident: one PERSISTENT dispatch of n_tiles
// co-resident workgroups), and with them each element's running gradient dhz = dhtot * z[s].
// The recurrent product dGh[s] @ W_hh is split by rows: the tile's rows of dGh[s] are its own
// (the gate backward of its units made them), so the workgroup multiplies them by its rows of
// W_hh without reading anything, and writes the partial product for all H columns of its lanes;
// an element of dh then sums the n_tu unit tiles' partials in tile order (deterministic). A step
// reads TB*H partials per workgroup instead of staging TB*3H of dGh from other workgroups.
// Workgroups that walk several tiles (fewer workgroups than tiles, or one dispatch per step)
// reload W and the state per tile from memory: same results, slower.
// Work split of the product: thread (cg, sl) owns columns cg*CPT .. +CPT and row slice sl (rows
// sl, sl + SL, ...: RG of them) of the tile's 3*NU rows: RG*CPT registers of W. Per batch of LB
// lanes it forms CPT*LB partial sums over its rows; the SL slices (consecutive threads of a
// subgroup) reduce them by shuffles (slice_reduce.glsl). On an H200 at v3, 2 columns x 2 slices
// measured fastest; more columns per thread (fewer shared loads per FMA, more shuffles) or
// 256-thread tiles were slower (docs/benchmarks.md).
// A step s, element p (lane p / NU, unit p % NU): sum the partials of dGh[s] @ W_hh -> finish dh,
// gate backward of step s-1 -> dGh[s-1] to memory and to shared -> the product of the tile's
// rows of dGh[s-1] with W_hh -> partials to memory -> arrive -> dGi, dhz and the next step's
// inputs while the others finish -> wait.
// COOP (train.precision fp16, with the forward's COOP; gru.coop_sweeps): the product on cooperative matrices
// (tensor cores, VK_NV_cooperative_matrix, 16 subgroups of 32). Tiles of NU = 16 units x TB = 16
// lanes: the partials [16 lanes x H] = dGh rows [16 lanes x 48] x W rows [48 x H] are 3 k-fragments
// (one per gate) deep; subgroup sg owns COOP_NF 16-column n-fragments (columns 16 * (sg * COOP_NF +
// i)), their 3 W_hh fragments each held as float16 for the whole sweep. dGh[s-1] is staged as
// float16 (dgs16), so the product takes float16 dGh (carrying fp16's loss scale) and W_hh with
// float32 sums; the partials go to `part` as before (directly where the 16 x 16 block is inside B
// and H, else through a per-subgroup scratch with bounds). EMU (with COOP): emulated fragments
// (include/resident_frag.glsl), for devices without cooperative matrices; they store past B or H by element.
// BIAS_SUMS: the bias gradients summed in the sweep (include/gru_bias_sums.glsl): the thread's own
// element of a resident tile in registers, any other element step by step.
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
#define NU 4
#endif
#ifndef TB
#define TB 4
#endif
#ifndef CPT
#define CPT 2
#endif
#ifndef LB
#define LB 4
#endif
#ifndef SL
#define SL 2
#endif
#ifndef LOG2SL
#define LOG2SL 1
#endif
#ifndef NTR
#define NTR 1
#endif
#include "common.glsl"
#include "slots.glsl"

// Compile-time (host: gru.resident_defines): NU units and TB lanes per tile, CPT columns of dh per
// thread, LB lanes per batch (a multiple of 4), SL row slices (a power of two, at most the
// subgroup size), LOG2SL, NTR transposed shuffle levels (CPT*LB divisible by 2^NTR).
const uint NR = 3u * NU;                  // rows of W_hh per tile: gate g's unit u is row g * NU + u
const uint RG = (NR + SL - 1u) / SL;      // rows per slice
const uint NB = (TB + LB - 1u) / LB;      // lane batches
const uint TBV = NB * LB / 4u;            // vec4 of (padded) lanes
const uint RS = TBV + 1u;                 // vec4 per dgs row: the padding spreads a warp's rows over the banks
const uint NV = CPT * LB;                 // partial sums per thread per batch: index lb * CPT + c
const uint NF = NV >> NTR;                // values a thread holds after the transposed levels
#include "slice_reduce.glsl"
layout(local_size_x_id = 0) in;
const uint NT = gl_WorkGroupSize.x;       // >= SL * ceil(H / CPT)

layout(set = 0, binding = 0) readonly buffer Do { float dO[]; };        // [T,B,H] at do_off
layout(set = 0, binding = 1) readonly buffer Save { float save[]; };    // [T,B,4H] at save_off: r, z, n, ghn
layout(set = 0, binding = 2) buffer Hprev { float hprev[]; };           // [T,B,H] at hprev_off (reset rows zeroed)
layout(set = 0, binding = 3) readonly buffer Resets { uint resets[]; }; // [T,B]
layout(set = 0, binding = 4) readonly buffer P { float params[]; };     // W_hh [3H,H] at w_off
layout(set = 0, binding = 5) readonly buffer Hyper { uint hyper[]; };   // HP_GRADH_CLAMP
layout(set = 0, binding = 6) buffer Dhz { float dhz_mem[]; };           // [B,H] scratch: dhtot * z
layout(set = 0, binding = 7) writeonly buffer Dgi { float dgi[]; };     // [T,B,3H] at dgi_off
layout(set = 0, binding = 8) writeonly buffer Dgh { float dgh[]; };     // [T,B,3H] rows dgh_ld apart at dgh_off
layout(set = 0, binding = 9) writeonly buffer Dh0 { float dh0[]; };     // [B,H] at dh0_off
layout(set = 0, binding = 10) buffer Stats { uint stats[]; };           // ST_CLAMP_HITS (+=)
// part[((s % 2 * n_tu + tu) * B + b) * H + k]: unit tile tu's rows of dGh[s] @ W_hh, column k
layout(set = 0, binding = 12) SWEEP_COHERENT buffer Part { float part[]; };  // [2, n_tu, B, H]
layout(push_constant) uniform Push {
    uint s; uint T; uint B; uint H;
    uint w_off; uint do_off; uint save_off; uint hprev_off; uint dgi_off; uint dgh_off; uint dh0_off;
    uint dgh_ld;   // words between dGh rows: 3H, or 4H over save (gru_backward.comp)
    uint n_steps;  // steps s, s-1, ..., s-n_steps+1
} pc;
#define SYNC_BINDING 11
#include "grid_sync.glsl"
#ifdef BIAS_SUMS  // the bias gradients summed in the sweep (binding BIAS_SUMS)
#include "gru_bias_sums.glsl"
#endif

#ifdef COOP
const uint SA = NR + 8u;              // dgs16's row stride in halves (16-byte rows)
shared float16_t dgs16[TB * SA];      // dgs16[bb * SA + r] = dGh[s-1, b0 + bb, row r of the tile] (0 outside)
shared float16_t wst[16u * 256u];     // per subgroup: a W_hh fragment being loaded (sweep start)
shared float pst[16u * 256u];         // per subgroup: a partial block bound for `part` past B or H
#define A_SHARED dgs16
#define ACC_SHARED pst
#include "resident_frag.glsl"

// Row r (gate r / NU, unit r % NU) of the tile's dGh[s-1] for tile lane bb.
void put_dgs(uint r, uint bb, float v) { dgs16[bb * SA + r] = float16_t(v); }
#else
shared vec4 dgs[NR * RS];  // dgs[r * RS + bb / 4][bb % 4] = dGh[s-1, b0 + bb, row r of the tile] (0 outside)

void put_dgs(uint r, uint bb, float v) { dgs[r * RS + bb / 4u][bb % 4u] = v; }

float w[RG][CPT];  // w[i][c] = W_hh[g*H + j0 + u, cg*CPT + c] for row g*NU + u = sl + SL*i (0 outside)
#endif

#ifndef COOP
void load_w(uint j0, uint cg, uint sl) {
    [[unroll]] for (uint i = 0u; i < RG; ++i) {
        uint r = sl + SL * i, j = j0 + r % NU;
        [[unroll]] for (uint c = 0u; c < CPT; ++c) {
            uint k = cg * CPT + c;
            w[i][c] = (r < NR && j < pc.H && k < pc.H) ? params[pc.w_off + ((r / NU) * pc.H + j) * pc.H + k] : 0.0;
        }
    }
}
#endif

uint n_unit_tiles() { return ceil_div(pc.H, NU); }

// Row (b, k) of dGh[s] @ W_hh: the unit tiles' partials, in tile order. Loaded PR at a time so
// their L2 round trips overlap (a plain loop left them nearly serial: ~3400 cycles per step on an
// H200 at v3).
const uint PR = 16u;
float product_row(uint s, uint b, uint k) {
    uint n_tu = n_unit_tiles(), stride = pc.B * pc.H, base = ((s % 2u) * n_tu * pc.B + b) * pc.H + k;
    float mm = 0.0;
    for (uint tu0 = 0u; tu0 < n_tu; tu0 += PR) {
        float v[PR];
        [[unroll]] for (uint j = 0u; j < PR; ++j) v[j] = tu0 + j < n_tu ? part[base + (tu0 + j) * stride] : 0.0;
        [[unroll]] for (uint j = 0u; j < PR; ++j) {
            if (tu0 + j < n_tu) mm += v[j];
        }
    }
    return mm;
}

#ifdef COOP
// Subgroup sg's W_hh fragments: wf[i * 3 + q] holds rows q * H + j0 .. +15 (gate q's units) by
// columns 16 * (sg * COOP_NF + i) .. +15, as float16, staged one at a time through wst.
void load_w_frags(uint j0, uint sg, out FRAG_B wf[3u * COOP_NF]) {
    uint lane = gl_LocalInvocationIndex % 32u, base = sg * 256u;
    [[unroll]] for (uint i = 0u; i < COOP_NF; ++i) {
        [[unroll]] for (uint q = 0u; q < 3u; ++q) {
            uint k0 = 16u * (sg * COOP_NF + i);
#ifdef EMU
            wf[i * 3u + q] = W_FRAG_REF(q * pc.H + j0, k0, false, false);
#else
            for (uint e = lane; e < 256u; e += 32u) {
                uint rr = e / 16u, cc = e % 16u, j = j0 + rr;
                float v = (j < pc.H && k0 + cc < pc.H) ? params[pc.w_off + (q * pc.H + j) * pc.H + k0 + cc] : 0.0;
                wst[base + e] = float16_t(v);  // row-major (rr, cc)
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            CM_LOAD(wf[i * 3u + q], wst, base, 16u, false);
            subgroupBarrier();  // the scratch is rewritten by the next fragment
#endif
        }
    }
}
#else
// The tile's rows of dGh[s-1] (in dgs) times its rows of W_hh: partials for the tile's lanes and
// every column, into part (read at step s-1).
void product_partials(uint s, uint tu, uint b0, uint cg, uint sl) {
    uint base = (((s - 1u) % 2u) * n_unit_tiles() + tu) * pc.B;
    [[unroll]] for (uint bat = 0u; bat < NB; ++bat) {
        float acc[NV];
        [[unroll]] for (uint a = 0u; a < NV; ++a) acc[a] = 0.0;
        [[unroll]] for (uint i = 0u; i < RG; ++i) {
            [[unroll]] for (uint v = 0u; v < LB / 4u; ++v) {
                vec4 g = dgs[(sl + SL * i) * RS + bat * (LB / 4u) + v];
                [[unroll]] for (uint c = 0u; c < CPT; ++c) {
                    float wv = w[i][c];
                    [[unroll]] for (uint m = 0u; m < 4u; ++m) {
                        uint a = (4u * v + m) * CPT + c;
                        acc[a] = fma(wv, g[m], acc[a]);
                    }
                }
            }
        }
        uint off = slice_reduce(acc, sl);
        if (slice_writes(sl)) {
            [[unroll]] for (uint f = 0u; f < NF; ++f) {
                uint a = off + f, b = b0 + bat * LB + a / CPT, k = cg * CPT + a % CPT;
                if (k < pc.H && b < min(pc.B, b0 + TB)) part[(base + b) * pc.H + k] = acc[f];
            }
        }
    }
}
#endif

// What step s needs from memory for one element, besides the partials: do, r, z, n, ghn, hprev
// of step s-1 (the gate backward; 0 at s = 0) and 1 - reset of step s (0 at s = T). Loaded a step
// ahead when resident, so none of it is on the step's critical path. hprev gets its reset here,
// and a row the reset cut is written back as the state it stands for (gru_backward.comp's header).
float[7] step_inputs(uint s, uint b, uint k) {
    float[7] v = float[7](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    if (s > 0u) {
        uint H = pc.H, row = (s - 1u) * pc.B + b, sb = pc.save_off + row * 4u * H, hi = pc.hprev_off + row * H + k;
        float hp = hprev[hi] * (1.0 - float(resets[row]));
        v = float[7](dO[pc.do_off + row * H + k], save[sb + k], save[sb + H + k], save[sb + 2u * H + k],
                     save[sb + 3u * H + k], hp, 0.0);
    }
    if (s < pc.T) {
        v[6] = 1.0 - float(resets[s * pc.B + b]);
        // the row the reset cut, written as the state it stands for (for dW_hh): row s at step s, after the
        // gate backward of s read it, and after the norm backward of the chunk below the layer wavefront's
        // chunk that ends at s read it as step s-1's output
        if (v[6] == 0.0) hprev[pc.hprev_off + (s * pc.B + b) * pc.H + k] = 0.0;
    }
    return v;
}

// Element (b, k) = tile element p of step s, given mm = its row of dGh[s] @ W_hh (s < T), its
// running gradient dhz = dhtot * z[s], in_u = step_inputs(s) and the clamp c (0 = off): finishes
// dh into h_{s-1} (clamp, dh0) and runs the gate backward of step s-1, writing dGh[s-1] to memory
// and to dgs. Returns dGi[s-1] (r, z, n) and dGh[s-1]'s n (r dan) for the caller to write later;
// updates dhz.
vec4 element(uint s, uint p, uint b, uint k, float mm, inout float dhz, float[7] in_u, float c, inout uint hits) {
    uint H = pc.H;
    float d = 0.0;
    if (s < pc.T) {
        d = (dhz + mm) * in_u[6];
        if (c > 0.0 && s >= 1u && abs(d) > c) { hits += 1u; d = clamp(d, -c, c); }
        if (s == 0u) dh0[pc.dh0_off + b * H + k] = d;
    }
    if (s == 0u) return vec4(0.0);
    float r = in_u[1], z = in_u[2], n = in_u[3];
    float dht = d + in_u[0];
    dhz = dht * z;
    float dn = dht * (1.0 - z);
    float dz = dht * (in_u[5] - n);
    float dan = dn * (1.0 - n * n);
    float daz = dz * z * (1.0 - z);
    float dar = dan * in_u[4] * r * (1.0 - r);
    vec3 g = vec3(dar, daz, dan * r);
    uint gb = pc.dgh_off + ((s - 1u) * pc.B + b) * pc.dgh_ld, u = p % NU, bb = p / NU;
    [[unroll]] for (uint q = 0u; q < 3u; ++q) {
        dgh[gb + q * H + k] = g[q];
        put_dgs(q * NU + u, bb, g[q]);
    }
    return vec4(dar, daz, dan, g.z);
}

void put_dgi(uint u, uint b, uint k, vec4 v) {
    uint H = pc.H, gb = pc.dgi_off + (u * pc.B + b) * 3u * H;
    dgi[gb + k] = v.x;
    dgi[gb + H + k] = v.y;
    dgi[gb + 2u * H + k] = v.z;
}

// Element p of a tile: (lane b0 + p / NU, unit j0 + p % NU), inside the matrices?
bool live_at(uint j0, uint b0, uint p) { return p < NU * TB && j0 + p % NU < pc.H && b0 + p / NU < pc.B; }

// Element p's running gradient entering step s from memory (non-resident, or a dispatch's first step).
float load_state(uint s, uint b, uint k) {
    return s < pc.T ? dhz_mem[b * pc.H + k] : 0.0;
}

// Element p of step s with its state read from memory and written back (not resident).
void element_from_memory(uint s, uint j0, uint b0, uint p, float c, inout uint hits) {
    uint b = b0 + p / NU, k = j0 + p % NU;
    float dhz = load_state(s, b, k);
    float mm = s < pc.T ? product_row(s, b, k) : 0.0;
    vec4 g = element(s, p, b, k, mm, dhz, step_inputs(s, b, k), c, hits);
    if (s > 0u) {
        put_dgi(s - 1u, b, k, g);
        dhz_mem[b * pc.H + k] = dhz;
#ifdef BIAS_SUMS
        bias_add(false, s, b, k, g);  // not the thread's own: stored at once
#endif
    }
}

void main() {
    uint tid = gl_LocalInvocationIndex, sl = tid % SL, cg = tid / SL;
    uint n_tu = n_unit_tiles(), n_tiles = n_tu * ceil_div(pc.B, TB);
    uint wg = gl_WorkGroupID.x, n_wg = gl_NumWorkGroups.x;
    bool resident = n_tiles <= n_wg;  // one tile per workgroup: W and the element state stay put
    uint group = resident ? wg / n_tu : 0u, group_n = resident ? n_tu : n_wg;
    uint tu = wg % n_tu, j0 = tu * NU, b0 = (wg / n_tu) * TB;
    uint b = b0 + tid / NU, k = j0 + tid % NU;  // this thread's element (when live)
    // Rows and lanes outside the matrices stay 0 in dgs (their products must be finite).
#ifdef COOP
    for (uint e = tid; e < TB * SA; e += NT) dgs16[e] = float16_t(0.0);
    uint sg = tid / 32u, lane = tid % 32u;
    FRAG_B wf[3u * COOP_NF];
#define LOAD_W() { load_w_frags(j0, sg, wf); barrier(); }
#else
    for (uint e = tid; e < NR * RS; e += NT) dgs[e] = vec4(0.0);
#define LOAD_W() load_w(j0, cg, sl)
#endif
    float dhz = 0.0;
    float in_u[7] = float[7](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    float c = HPF(hyper, HP_GRADH_CLAMP);
    uint hits = 0u;
    bool live = false;
    if (resident && wg < n_tiles) {
        LOAD_W();
        live = live_at(j0, b0, tid);
        if (live) {
            dhz = load_state(pc.s, b, k);
            in_u = step_inputs(pc.s, b, k);
        }
    }
    barrier();  // dgs zeroed
    for (uint i = 0u; i < pc.n_steps && wg < n_tiles; ++i) {
        uint s = pc.s - i;
        bool more = i + 1u < pc.n_steps;
        for (uint tile = wg; tile < n_tiles; tile += n_wg) {
            if (!resident) {
                tu = tile % n_tu;
                j0 = tu * NU;
                b0 = (tile / n_tu) * TB;
                LOAD_W();
            }
            PHASE(i, 0u);
            vec4 g = vec4(0.0);
            if (resident && live) g = element(s, tid, b, k, s < pc.T ? product_row(s, b, k) : 0.0, dhz, in_u, c, hits);
            for (uint p = resident ? tid + NT : tid; p < NU * TB; p += NT) {  // state from memory
                if (live_at(j0, b0, p)) {
                    element_from_memory(s, j0, b0, p, c, hits);
                } else {  // outside: a walked tile may leave a previous tile's value here
                    [[unroll]] for (uint q = 0u; q < 3u; ++q) put_dgs(q * NU + p % NU, p / NU, 0.0);
                }
            }
            PHASE(i, 1u);
            barrier();  // dgs holds the tile's rows of dGh[s-1]
#ifdef COOP
            if (s > 0u) {  // uniform: s is. Subgroup sg: columns 16 * (sg * COOP_NF + i) .. +15
                uint row0 = (((s - 1u) % 2u) * n_tu + tu) * pc.B + b0;  // part's row of lane b0
                [[unroll]] for (uint i = 0u; i < COOP_NF; ++i) {
                    uint k0 = 16u * (sg * COOP_NF + i);
                    if (k0 >= pc.H) break;  // uniform in the subgroup
                    ACC_T acc = ACC_ZERO();
                    [[unroll]] for (uint q = 0u; q < 3u; ++q) {
                        FRAG_A a;
                        LOAD_A_SHARED(a, 16u * q, SA, false);  // (lane bb, row q * 16 + u)
                        acc = MUL_ADD(a, wf[i * 3u + q], acc);
                    }
                    if (b0 + 16u <= pc.B && k0 + 16u <= pc.H && pc.H % 4u == 0u) {
                        ACC_STORE_BUF(acc, part, row0 * pc.H + k0, pc.H);
                    } else {
#ifdef EMU  // this invocation's 8 elements: row lane / 2, columns (lane % 2) * 8 ..
                        for (uint e = 0u; e < 8u; ++e) {
                            uint bb = lane / 2u, k = k0 + (lane % 2u) * 8u + e;
                            if (b0 + bb < pc.B && k < pc.H) part[(row0 + bb) * pc.H + k] = acc.v[e];
                        }
#else
                        CM_STORE(acc, pst, sg * 256u, 16u, false);
                        subgroupMemoryBarrierShared();
                        subgroupBarrier();
                        for (uint e = lane; e < 256u; e += 32u) {
                            uint bb = e / 16u, k = k0 + e % 16u;
                            if (b0 + bb < pc.B && k < pc.H) part[(row0 + bb) * pc.H + k] = pst[sg * 256u + e];
                        }
                        subgroupBarrier();
#endif
                    }
                }
            }
#else
            if (s > 0u) product_partials(s, tu, b0, cg, sl);  // uniform: s is
#endif
            PHASE(i, 2u);
            if (resident && more) {
#ifdef PERSISTENT
                group_arrive(group);  // the partials of dGh[s-1] @ W_hh published
#endif
                PHASE(i, 3u);
                if (live) in_u = step_inputs(s - 1u, b, k);
            }
            if (resident && live && s > 0u) {
                put_dgi(s - 1u, b, k, g);
                dhz_mem[b * pc.H + k] = dhz;
#ifdef BIAS_SUMS
                bias_add(true, s, b, k, g);  // the thread's own element: summed in registers
#endif
            }
#ifdef PERSISTENT
            if (!resident || !more) barrier();  // dgs is rewritten by the next tile
#else
            barrier();
#endif
        }
        PHASE(i, 4u);
#ifdef PERSISTENT
        if (more && !(resident ? group_wait(i + 1u, group, group_n) : grid_sync(i + 1u))) break;
#endif
    }
    if (hits > 0u) atomicAdd(stats[ST_CLAMP_HITS], hits);
#ifdef BIAS_SUMS
    bias_finish(b, k);
#endif
#ifdef PERSISTENT
    grid_sync_done(resident ? ceil_div(pc.B, TB) : 1u);
#endif
}
