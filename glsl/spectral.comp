#version 450
// Spectral-norm projection of every [H,H] gate block of every layer's weight_ih / weight_hh:
// one power iteration with the persistent unit vector u, exactly catchat.reference.spectral_project
// (docs/model.md). Blocks are numbered b = (l * 2 + k) * 3 + gate (k: 0 = weight_ih, 1 = weight_hh),
// the order of u [L,2,3,H]; dispatch y = block. Four phases, one define each:
//   SPECTRAL_PHASE 1 (default)  a    = W^T u                     grid (ceil(H / WG), blocks)
//   SPECTRAL_PHASE 2            wv   = W (a / max(|a|, 1e-12))   grid (ceil(H / ROWS), blocks)
//   SPECTRAL_PHASE 3            u    = wv / max(|wv|, 1e-12); sigma = u . wv;
//                               factor = sigma > bound ? bound / sigma : 1    grid (1, blocks)
//   SPECTRAL_PHASE 4            W   *= factor (blocks with factor != 1)  grid (tiles, blocks)
// Norms are recomputed by each workgroup that needs them, in one fixed order (identical bits).
// Nothing runs when the bound (hyper[HP_SPECTRAL_BOUND]) is 0 or the optimizer skipped the step.
#include "common.glsl"
#include "slots.glsl"

#ifndef SPECTRAL_PHASE
#define SPECTRAL_PHASE 1
#endif

layout(local_size_x_id = 0) in;                // WG threads, a power of two
layout(constant_id = 1) const uint ROWS = 1u;  // phase 2: rows of W per workgroup

layout(set = 0, binding = 0) buffer Params { float params[]; };        // flat parameters [total]
layout(set = 0, binding = 1) buffer U { float u[]; };                  // [L,2,3,H] unit vectors
layout(set = 0, binding = 2) buffer Work { float work[]; };            // [2 blocks H + blocks] (a, wv, factor)
layout(set = 0, binding = 3) readonly buffer Hyper { uint hyper[]; };  // [HP_WORDS]
layout(set = 0, binding = 4) readonly buffer Stats { uint stats[]; };  // [ST_WORDS]
layout(push_constant) uniform Push {
    uint H;
    uint blocks;        // 6 L
    uint ih0;           // offset of layers.0.gru.weight_ih
    uint hh_delta;      // offset of weight_hh minus offset of weight_ih (same layer)
    uint layer_stride;  // offset of layers.{l+1}.gru.weight_ih minus layers.{l}'s
    uint tiles;         // phase 4: workgroups per block along x (grid-stride over H*H)
} pc;

#define WG gl_WorkGroupSize.x

shared float red[WG * ROWS];  // [ROWS, WG] per-thread partial sums

// First float of block b's [H,H] rows in params.
uint block_offset(uint b) {
    uint l = b / 6u, k = (b / 3u) % 2u, gate = b % 3u;
    return pc.ih0 + l * pc.layer_stride + k * pc.hh_delta + gate * pc.H * pc.H;
}
uint a_at(uint b) { return b * pc.H; }                       // work: a [blocks,H]
uint wv_at(uint b) { return (pc.blocks + b) * pc.H; }        // work: wv [blocks,H]
uint factor_at(uint b) { return 2u * pc.blocks * pc.H + b; } // work: factor [blocks]

// Fixed-order workgroup sum of every thread's x (all threads must call it).
float workgroup_sum(float x) {
    uint t = gl_LocalInvocationID.x;
    red[t] = x;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) red[t] += red[t + s];
        barrier();
    }
    float r = red[0];
    barrier();  // red is reused by the caller's next reduction
    return r;
}

// |x[at : at+H]| floored at 1e-12 (reference._normalise), the same bits in every workgroup.
float norm_floor(uint at) {
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.H; i += WG) ss += work[at + i] * work[at + i];
    return max(sqrt(workgroup_sum(ss)), 1e-12);
}

void main() {
    float bound = HPF(hyper, HP_SPECTRAL_BOUND);
    if (!(bound > 0.0) || stats[ST_SKIPPED] == 1u) return;  // uniform: every workgroup leaves
    uint H = pc.H, b = gl_WorkGroupID.y, t = gl_LocalInvocationID.x;
    uint W = block_offset(b);
    uint ub = b * H;  // u of this block

#if SPECTRAL_PHASE == 1
    // a[j] = sum_i W[i,j] u[i]: thread per column, rows in order (coalesced along j).
    uint j = gl_GlobalInvocationID.x;
    if (j < H) {
        float s = 0.0;
        for (uint i = 0u; i < H; ++i) s += params[W + i * H + j] * u[ub + i];
        work[a_at(b) + j] = s;
    }

#elif SPECTRAL_PHASE == 2
    // wv[row] = sum_j W[row,j] v[j] for ROWS rows; v = a / |a| formed on the fly.
    float na = norm_floor(a_at(b));
    uint row0 = gl_WorkGroupID.x * ROWS;
    float acc[ROWS];
    for (uint r = 0u; r < ROWS; ++r) acc[r] = 0.0;
    for (uint j = t; j < H; j += WG) {
        float vj = work[a_at(b) + j] / na;
        for (uint r = 0u; r < ROWS; ++r)
            if (row0 + r < H) acc[r] += params[W + (row0 + r) * H + j] * vj;
    }
    for (uint r = 0u; r < ROWS; ++r) red[r * WG + t] = acc[r];
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s)
            for (uint r = 0u; r < ROWS; ++r) red[r * WG + t] += red[r * WG + t + s];
        barrier();
    }
    if (t < ROWS && row0 + t < H) work[wv_at(b) + row0 + t] = red[t * WG];

#elif SPECTRAL_PHASE == 3
    // u = wv / |wv|; sigma = u . wv; the block's scale factor.
    float nw = norm_floor(wv_at(b));
    float dot = 0.0;
    for (uint i = t; i < H; i += WG) {
        float ui = work[wv_at(b) + i] / nw;
        u[ub + i] = ui;
        dot += ui * work[wv_at(b) + i];
    }
    float sigma = workgroup_sum(dot);
    if (t == 0u) work[factor_at(b)] = sigma > bound ? bound / sigma : 1.0;

#elif SPECTRAL_PHASE == 4
    // W *= factor over the block's H*H floats (grid-stride over pc.tiles workgroups).
    float f = work[factor_at(b)];
    if (f == 1.0) return;
    for (uint e = gl_GlobalInvocationID.x; e < H * H; e += pc.tiles * WG) params[W + e] *= f;

#else
#error "SPECTRAL_PHASE must be 1, 2, 3 or 4"
#endif
}
