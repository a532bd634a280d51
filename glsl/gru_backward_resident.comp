#version 450
// The GRU backward sweep with W_hh kept in registers (a persistent RNN, Diamos et al. 2016).
// Same maths, buffers and push constants as gru_backward.comp (read its header for step s); what
// differs is where W_hh lives. A tile is NK columns k x TB lanes; its workgroup holds W_hh[:, the
// tile's columns] (3H x NK) in registers for the whole sweep when every tile has its own
// workgroup (resident: one PERSISTENT dispatch of n_tiles co-resident workgroups), and with it
// each element's running gradient dhtot and z[s]: a step streams only dGh[s] of its lanes.
// Workgroups that walk several tiles (fewer workgroups than tiles, or one dispatch per step)
// reload all of it per tile from memory: same results, slower.
// Work split: thread (s, c) owns the 3H rows in vec4 groups s, s + KS, ... (KV of them) of the
// tile's columns c*RK .. +RK: 4*KV*RK registers of W. dGh[s] of the tile's lanes is staged in
// chunks of KS vec4 rows (chunk i = the vec4 rows KS*i ..: every thread's i-th group), double
// buffered. Each thread forms RK*TB partial sums; the SL slices of a subgroup reduce them by
// shuffles (transposed levels, then plain), the KS/SL slice groups through shared memory in group
// order (deterministic). Thread p < NK*TB then owns element (lane p / NK, column p % NK): it
// finishes dh, runs the gate backward of step s-1 and writes dGh[s-1] (what the next step reads)
// -> arrive -> dGi, dhtot and the next step's inputs while the others finish -> wait.
#extension GL_EXT_control_flow_attributes : require
// (defaults: a small valid tile, so the shader compiles on its own)
#ifndef NK
#define NK 16
#endif
#ifndef TB
#define TB 4
#endif
#ifndef RK
#define RK 2
#endif
#ifndef KV
#define KV 2
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
#include "slots.glsl"

// Compile-time (host: gru.resident_defines): NK columns and TB lanes per tile, RK columns per
// thread, KV vec4 row groups per thread, KS slices (KS*KV*4 >= 3H), SL slices reduced by shuffles
// (a power of two dividing KS, at most the subgroup size), LOG2SL, NTR transposed shuffle levels;
// GV4: 3H and dgh_off multiples of 4 (dGh rows as vec4).
const uint NCG = NK / RK;      // column groups
const uint KG = KS / SL;       // slice groups, summed through shared memory
const uint NV = RK * TB;       // partial sums per thread: index c * TB + bb
const uint NF = NV >> NTR;     // values a thread holds after the transposed levels
#include "slice_reduce.glsl"
const uint CH = TB * KS;       // vec4 per staged chunk
layout(local_size_x_id = 0) in;  // NCG * KS
const uint NT = gl_WorkGroupSize.x;
const uint NPRE = (CH + NT - 1u) / NT;  // staged vec4 per thread per chunk

layout(set = 0, binding = 0) readonly buffer Do { float dO[]; };        // [T,B,H] at do_off
layout(set = 0, binding = 1) readonly buffer Save { float save[]; };    // [T,B,4H] at save_off: r, z, n, ghn
layout(set = 0, binding = 2) readonly buffer Hprev { float hprev[]; };  // [T,B,H] at hprev_off
layout(set = 0, binding = 3) readonly buffer Resets { uint resets[]; }; // [T,B]
layout(set = 0, binding = 4) readonly buffer P { float params[]; };     // W_hh [3H,H] at w_off
layout(set = 0, binding = 5) readonly buffer Hyper { uint hyper[]; };   // HP_GRADH_CLAMP
layout(set = 0, binding = 6) buffer Dhtot { float dhtot[]; };           // [B,H] scratch
layout(set = 0, binding = 7) writeonly buffer Dgi { float dgi[]; };     // [T,B,3H] at dgi_off
#ifdef GV4  // dGh[s] rows read as vec4, written by component
layout(set = 0, binding = 8) SWEEP_COHERENT buffer Dgh { vec4 dgh4[]; };  // [T,B,3H] at dgh_off
#define DGH_STORE(i, v) dgh4[(i) / 4u][(i) % 4u] = (v)
#else
layout(set = 0, binding = 8) SWEEP_COHERENT buffer Dgh { float dgh[]; };
#define DGH_STORE(i, v) dgh[i] = (v)
#endif
layout(set = 0, binding = 9) writeonly buffer Dh0 { float dh0[]; };     // [B,H] at dh0_off
layout(set = 0, binding = 10) buffer Stats { uint stats[]; };           // ST_CLAMP_HITS (+=)
layout(push_constant) uniform Push {
    uint s; uint T; uint B; uint H;
    uint w_off; uint do_off; uint save_off; uint hprev_off; uint dgi_off; uint dgh_off; uint dh0_off;
    uint n_steps;  // steps s, s-1, ..., s-n_steps+1
} pc;
#define SYNC_BINDING 11
#include "grid_sync.glsl"

shared vec4 gs[2u * CH];        // gs[(i % 2) * CH + bb * KS + q] = dGh[s, b0 + bb, 4(KS*i + q) .. +3]
shared float red[KG * TB * NK];  // red[(kg * TB + bb) * NK + col]: slice group kg's sums

vec4 w[KV][RK];  // w[i][c][m] = W_hh[4(s + KS*i) + m, k0 + c0 + c] (0 past 3H, H)

void load_w(uint k0, uint c0, uint s) {
    uint R3 = 3u * pc.H;
    [[unroll]] for (uint i = 0u; i < KV; ++i) {
        [[unroll]] for (uint c = 0u; c < RK; ++c) {
            uint r = 4u * (s + KS * i), k = k0 + c0 + c;
            vec4 v = vec4(0.0);
            [[unroll]] for (uint m = 0u; m < 4u; ++m) {
                if (r + m < R3 && k < pc.H) v[m] = params[pc.w_off + (r + m) * pc.H + k];
            }
            w[i][c] = v;
        }
    }
}

// dGh[s, b, 4q .. 4q+3] (0 past 3H).
vec4 dgh_row4(uint s, uint b, uint q) {
    uint R3 = 3u * pc.H, base = pc.dgh_off + (s * pc.B + b) * R3;
#ifdef GV4
    return dgh4[base / 4u + q];
#else
    vec4 v = vec4(0.0);
    [[unroll]] for (uint m = 0u; m < 4u; ++m) if (4u * q + m < R3) v[m] = dgh[base + 4u * q + m];
    return v;
#endif
}

// Element e of chunk i of step s: lane e / KS, vec4 row KS*i + e % KS (0 past B, 3H).
vec4 stage_elem(uint s, uint b0, uint i, uint e) {
    uint b = b0 + e / KS, q = KS * i + e % KS;
    return (e < CH && b < pc.B && 4u * q < 3u * pc.H) ? dgh_row4(s, b, q) : vec4(0.0);
}

// The tile's matmul sum_r dGh[s, b, r] W_hh[r, k]: slice group kg's partial sums into red.
void matmul(uint s, uint b0, uint cg, uint sl, uint kg, uint slice) {
    uint tid = gl_LocalInvocationIndex;
    vec4 pre[NPRE];  // this thread's elements of the next chunk, in flight during this one's FMAs
    [[unroll]] for (uint j = 0u; j < NPRE; ++j) pre[j] = stage_elem(s, b0, 0u, tid + j * NT);
    float acc[NV];
    [[unroll]] for (uint a = 0u; a < NV; ++a) acc[a] = 0.0;
    [[unroll]] for (uint i = 0u; i < KV; ++i) {
        [[unroll]] for (uint j = 0u; j < NPRE; ++j) {
            uint e = tid + j * NT;
            if (e < CH) gs[(i % 2u) * CH + e] = pre[j];
        }
        barrier();  // chunk i staged; every thread is done with chunk i-2 (same buffer)
        if (i + 1u < KV) {
            [[unroll]] for (uint j = 0u; j < NPRE; ++j) pre[j] = stage_elem(s, b0, i + 1u, tid + j * NT);
        }
        [[unroll]] for (uint bb = 0u; bb < TB; ++bb) {
            vec4 g = gs[(i % 2u) * CH + bb * KS + slice];
            [[unroll]] for (uint c = 0u; c < RK; ++c) {
                vec4 wv = w[i][c];
                uint a = c * TB + bb;
                acc[a] = fma(wv.w, g.w, fma(wv.z, g.z, fma(wv.y, g.y, fma(wv.x, g.x, acc[a]))));
            }
        }
    }
    uint off = slice_reduce(acc, sl);
    if (slice_writes(sl)) {
        [[unroll]] for (uint f = 0u; f < NF; ++f) {
            uint a = off + f;
            red[(kg * TB + a % TB) * NK + cg * RK + a / TB] = acc[f];
        }
    }
    barrier();
}

// What the gate backward of step u needs for one element: do, r, z, n, ghn, hprev.
float[6] gate_inputs(uint u, uint b, uint k) {
    uint H = pc.H, row = u * pc.B + b, sb = pc.save_off + row * 4u * H;
    return float[6](dO[pc.do_off + row * H + k], save[sb + k], save[sb + H + k], save[sb + 2u * H + k],
                    save[sb + 3u * H + k], hprev[pc.hprev_off + row * H + k]);
}

// Element (b, k) of step s, given mm = its row of the matmul (s < T), its running gradient dht
// and z = z[s]: finishes dh into h_{s-1} (clamp, dh0) and runs the gate backward of step s-1,
// writing dGh[s-1]. Returns dGi[s-1] (r, z, n) for the caller to write later; updates dht, z.
vec3 element(uint s, uint b, uint k, float mm, inout float dht, inout float z, float[6] in_u, inout uint hits) {
    uint H = pc.H;
    float d = 0.0;
    if (s < pc.T) {
        d = (dht * z + mm) * (1.0 - float(resets[s * pc.B + b]));
        float c = HPF(hyper, HP_GRADH_CLAMP);
        if (c > 0.0 && s >= 1u && abs(d) > c) { hits += 1u; d = clamp(d, -c, c); }
        if (s == 0u) dh0[pc.dh0_off + b * H + k] = d;
    }
    if (s == 0u) return vec3(0.0);
    float r = in_u[1], n = in_u[3];
    z = in_u[2];
    dht = d + in_u[0];
    float dn = dht * (1.0 - z);
    float dz = dht * (in_u[5] - n);
    float dan = dn * (1.0 - n * n);
    float daz = dz * z * (1.0 - z);
    float dar = dan * in_u[4] * r * (1.0 - r);
    uint gb = pc.dgh_off + ((s - 1u) * pc.B + b) * 3u * H;
    DGH_STORE(gb + k, dar);
    DGH_STORE(gb + H + k, daz);
    DGH_STORE(gb + 2u * H + k, dan * r);
    return vec3(dar, daz, dan);
}

void put_dgi(uint u, uint b, uint k, vec3 v) {
    uint H = pc.H, gb = pc.dgi_off + (u * pc.B + b) * 3u * H;
    dgi[gb + k] = v.x;
    dgi[gb + H + k] = v.y;
    dgi[gb + 2u * H + k] = v.z;
}

// Element p's row of the matmul: the slice groups' sums in order.
float row_sum(uint p) {
    float mm = 0.0;
    for (uint q = 0u; q < KG; ++q) mm += red[(q * TB + p / NK) * NK + p % NK];
    return mm;
}

// Element p of a tile: (lane b0 + p / NK, column k0 + p % NK), inside the matrices?
bool live_at(uint k0, uint b0, uint p) { return p < NK * TB && k0 + p % NK < pc.H && b0 + p / NK < pc.B; }

// Element p's running state entering step s from memory (non-resident, or a dispatch's first step).
void load_state(uint s, uint b, uint k, out float dht, out float z) {
    bool mid = s < pc.T;
    dht = mid ? dhtot[b * pc.H + k] : 0.0;
    z = mid ? save[pc.save_off + (s * pc.B + b) * 4u * pc.H + pc.H + k] : 0.0;
}

// Element p of step s with its state read from memory and written back (not resident).
void element_from_memory(uint s, uint k0, uint b0, uint p, inout uint hits) {
    uint b = b0 + p / NK, k = k0 + p % NK;
    float dht, z;
    load_state(s, b, k, dht, z);
    float[6] in_u = s > 0u ? gate_inputs(s - 1u, b, k) : float[6](0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    vec3 g = element(s, b, k, row_sum(p), dht, z, in_u, hits);
    if (s > 0u) {
        put_dgi(s - 1u, b, k, g);
        dhtot[b * pc.H + k] = dht;
    }
}

void main() {
    uint tid = gl_LocalInvocationIndex;
    uint sl = tid % SL, cg = (tid / SL) % NCG, kg = tid / (SL * NCG), slice = kg * SL + sl;
    uint n_tk = ceil_div(pc.H, NK), n_tiles = n_tk * ceil_div(pc.B, TB);
    uint wg = gl_WorkGroupID.x, n_wg = gl_NumWorkGroups.x;
    bool resident = n_tiles <= n_wg;  // one tile per workgroup: W and the element state stay put
    uint group = resident ? wg / n_tk : 0u, group_n = resident ? n_tk : n_wg;
    uint k0 = (wg % n_tk) * NK, b0 = (wg / n_tk) * TB;
    uint b = b0 + tid / NK, k = k0 + tid % NK;  // this thread's element (when live)
    float dht = 0.0, z = 0.0;
    float in_u[6] = float[6](0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    uint hits = 0u;
    bool live = false;
    if (resident && wg < n_tiles) {
        load_w(k0, cg * RK, slice);
        live = live_at(k0, b0, tid);
        if (live) {
            load_state(pc.s, b, k, dht, z);
            if (pc.s > 0u) in_u = gate_inputs(pc.s - 1u, b, k);
        }
    }
    for (uint i = 0u; i < pc.n_steps && wg < n_tiles; ++i) {
        uint s = pc.s - i;
        bool more = i + 1u < pc.n_steps;
        for (uint tile = wg; tile < n_tiles; tile += n_wg) {
            if (!resident) {
                k0 = (tile % n_tk) * NK;
                b0 = (tile / n_tk) * TB;
                load_w(k0, cg * RK, slice);
            }
            if (s < pc.T) matmul(s, b0, cg, sl, kg, slice);  // uniform: s is
            vec3 g = vec3(0.0);
            if (resident && live) g = element(s, b, k, row_sum(tid), dht, z, in_u, hits);
            for (uint p = resident ? tid + NT : tid; p < NK * TB; p += NT) {  // state from memory
                if (live_at(k0, b0, p)) element_from_memory(s, k0, b0, p, hits);
            }
            if (resident && more) {
#ifdef PERSISTENT
                group_arrive(group);  // dGh[s-1] of this workgroup published
#endif
                if (live && s >= 2u) in_u = gate_inputs(s - 2u, b, k);
            }
            if (resident && live && s > 0u) {
                put_dgi(s - 1u, b, k, g);
                dhtot[b * pc.H + k] = dht;
            }
#ifdef PERSISTENT
            if (!resident || !more) barrier();  // red and gs are reused by the next tile
#else
            barrier();
#endif
        }
#ifdef PERSISTENT
        if (more && !(resident ? group_wait(i + 1u, group, group_n) : grid_sync(i + 1u))) break;
#endif
    }
    if (hits > 0u) atomicAdd(stats[ST_CLAMP_HITS], hits);
#ifdef PERSISTENT
    grid_sync_done(resident ? ceil_div(pc.B, TB) : 1u);
#endif
}
