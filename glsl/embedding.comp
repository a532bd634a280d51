#version 450
// Embedding lookup with whole-row dropout (docs/model.md), forward and backward side by side.
//   scale(v) = sqrt(H) * keep(v) / (1 - p_emb),  keep(v) = rng_uniform(seed, 1, v) >= p_emb
//   seed = hyper[HP_SEED], p_emb = hyper[HP_P_EMB]; sqrt(H) comes rounded to float32 from the host.
// FORWARD (default):  X[i,:]  = E[tok[i],:] * scale(tok[i]) (+ bias)      i < n_rows = T*B
// BACKWARD:           dE[v,:] += sum over i with tok[i] == v of dX[i,:] * scale(v), i in order
// A token >= V (never produced by the vocabulary) gives a zero row (just the bias) and no gradient.
// Rows are `width` floats (H for the embedding itself; 3H for the layer-0 input-projection table
// E @ W_ih0^T, whose rows scale the same way: its gather with bias b_ih0 is layer 0's gi).
//
// Backward without float atomics: workgroup (x, y, z) owns columns [x*WG, (x+1)*WG) of vocab row
// v = y over part z of the tokens (rows [z*rows_per_part, (z+1)*rows_per_part)). It walks its
// part in chunks of 4*WG tokens: each thread tests 4 and sets their bits in a shared mask, the mask's
// words (popcounts before them) list the matching rows in order (two barriers a chunk, where a
// prefix-sum compaction of WG tokens took log2(WG)), then every thread adds those rows of its column,
// UNROLL loads at a time before their adds: the walk waits on memory once per UNROLL rows, not per
// row (on an H100, 1.2-1.9x faster than chunks of WG tokens, 1.6-3x than batches within a mask word).
// One part (accumulate = 1) sums in token order from dE's old value, as numpy's add.at does. P parts
// (accumulate = 0) write part z's sum, from 0, to partials [P,V,H] (at e_off), and SUM_PARTS adds
// dE[v,c] + part 0 + part 1 + ... in part order: deterministic and independent of the geometry for a
// given P (the parts split the frequent characters' long walks, ~10-17% of the rows each, over P
// workgroups).
// Cost: V * ceil(H/WG) * T*B token tests (two barriers per chunk of 4*WG tokens), one read of each dX
// element; dE is read and written once (with parts, plus P*V*H partials written and read).
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "slots.glsl"
#include "dropout.glsl"
#define UNROLL 8u  // loads a thread issues before their adds (the adds stay in order)

layout(local_size_x_id = 0) in;

#ifdef SUM_PARTS  // the parts' second pass: dE[e] = dE[e] + part 0 [e] + part 1 [e] + ..., e < V*H

layout(push_constant) uniform Push {
    uint n;      // V*H: elements of dE (and of each part)
    uint parts;  // P
    uint e_off;  // element offset of dE
} pc;

layout(set = 0, binding = 0) buffer dE_ { float dE[]; };               // [V,H] accumulated
layout(set = 0, binding = 1) readonly buffer Parts_ { float part[]; };  // [P,V,H]

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint e = gl_GlobalInvocationID.x; e < pc.n; e += stride) {  // grid-stride: any V*H
        float acc = dE[pc.e_off + e];
        uint p = 0u;
        for (; p + UNROLL <= pc.parts; p += UNROLL) {  // UNROLL parts' loads, then their adds in order
            float d[UNROLL];
            [[unroll]] for (uint u = 0u; u < UNROLL; ++u) d[u] = part[(p + u) * pc.n + e];
            [[unroll]] for (uint u = 0u; u < UNROLL; ++u) acc += d[u];
        }
        for (; p < pc.parts; ++p) acc += part[p * pc.n + e];
        dE[pc.e_off + e] = acc;
    }
}

#else  // the gather and its token sums

layout(push_constant) uniform Push {
    uint n_rows;  // T*B
    uint H, V;    // H: the row width
    uint tok_off, e_off, x_off;  // element offsets of tokens, the table E / dE (or the partials), the rows X / dX
    float sqrt_h;  // sqrt of the model's hidden size
    uint bias_off;  // HAS_BIAS: element offset of bias [H] in binding 4
#ifdef BACKWARD
    uint rows_per_part;  // tokens of each part (gl_WorkGroupID.z); n_rows with one part
    uint accumulate;     // 1: one part, added into dE; 0: part z's sum written to the partials [P,V,H]
#endif
} pc;

layout(set = 0, binding = 0) readonly buffer Tok_ { uint tok[]; };       // [T*B]
layout(set = 0, binding = 3) readonly buffer Hyper_ { uint hyper[]; };   // [HP_WORDS]

float row_scale(uint v) {
    float p = HPF(hyper, HP_P_EMB);
    return pc.sqrt_h * dropout_scale(HPU(hyper, HP_SEED), DROPOUT_STREAM_EMBEDDING, v, p);
}

#ifndef BACKWARD

layout(set = 0, binding = 1) readonly buffer E_ { float E[]; };   // [V,H]
layout(set = 0, binding = 2) writeonly buffer X_ { float X[]; };  // [T*B,H]
#ifdef HAS_BIAS
layout(set = 0, binding = 4) readonly buffer Bias_ { float bias[]; };  // [H] at bias_off
#endif

#ifdef VEC4  // H and the offsets multiples of 4: a thread per 4 elements of a row, 16-byte loads and stores
layout(set = 0, binding = 1) readonly buffer E4_ { vec4 E4[]; };
layout(set = 0, binding = 2) writeonly buffer X4_ { vec4 X4[]; };
#ifdef HAS_BIAS
layout(set = 0, binding = 4) readonly buffer Bias4_ { vec4 bias4[]; };
#endif
#define T_ vec4
#define W_ 4u
#define E_(i) E4[(i) / 4u]
#define X_(i) X4[(i) / 4u]
#define BIAS_(i) bias4[(i) / 4u]
#else
#define T_ float
#define W_ 1u
#define E_(i) E[i]
#define X_(i) X[i]
#define BIAS_(i) bias[i]
#endif

void main() {
    uint n = pc.n_rows * pc.H;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x * W_;
    for (uint e = gl_GlobalInvocationID.x * W_; e < n; e += stride) {  // grid-stride: any T*B*H
        uint i = e / pc.H, j = e % pc.H;
        uint v = tok[pc.tok_off + i];
        T_ x = v < pc.V ? E_(pc.e_off + v * pc.H + j) * row_scale(v) : T_(0.0);
#ifdef HAS_BIAS
        x += BIAS_(pc.bias_off + j);
#endif
        X_(pc.x_off + e) = x;
    }
}

#else  // BACKWARD

layout(set = 0, binding = 1) buffer dE_ { float dE[]; };          // [V,H] accumulated, or partials [P,V,H]
layout(set = 0, binding = 2) readonly buffer dX_ { float dX[]; };  // [T*B,H]

// A chunk is TPT*WG tokens; bit j of mask[w] is token base + 32w + j. Two mask buffers in turn: a chunk
// sets its buffer's bits (barrier), lists its matching rows in token order in `hits` (barrier), clears
// its buffer (set again two chunks on, after the next chunk's first barrier: no barrier of its own) and
// walks the list, which the next chunk rewrites only after its first barrier.
#define TPT 4u  // tokens a thread tests per chunk: longer lists, so fuller batches of loads
#define CHUNK (TPT * gl_WorkGroupSize.x)
#define MASK_WORDS ((CHUNK + 31u) / 32u)
shared uint mask[2][MASK_WORDS];
shared uint hits[CHUNK];
shared uint n_hits;

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint lx = gl_LocalInvocationID.x;
    uint c = gl_WorkGroupID.x * WG + lx;  // column of dE / dX
    uint v = gl_WorkGroupID.y;            // vocab row
    uint begin = gl_WorkGroupID.z * pc.rows_per_part;  // this part's tokens: [begin, end)
    uint end = min(pc.n_rows, begin + pc.rows_per_part);
    uint o = pc.e_off + (gl_WorkGroupID.z * pc.V + v) * pc.H + c;  // dE[v,c], or part z's [v,c]
    float s = row_scale(v);
    float acc = (c < pc.H && pc.accumulate != 0u) ? dE[o] : 0.0;
    for (uint w = lx; w < 2u * MASK_WORDS; w += WG) mask[w / MASK_WORDS][w % MASK_WORDS] = 0u;
    barrier();

    uint k = 0u;  // this chunk's mask buffer
    for (uint base = begin; base < end; base += CHUNK) {
        [[unroll]] for (uint q = 0u; q < TPT; ++q) {  // coalesced: thread lx tests tokens lx, lx + WG, ...
            uint j = q * WG + lx, i = base + j;
            if (i < end && tok[pc.tok_off + i] == v) atomicOr(mask[k][j / 32u], 1u << (j % 32u));
        }
        barrier();
        for (uint w = lx; w < MASK_WORDS; w += WG) {  // word w's rows go after the words before it
            uint at = 0u;
            for (uint x = 0u; x < w; ++x) at += uint(bitCount(mask[k][x]));
            for (uint m = mask[k][w]; m != 0u; m &= m - 1u) hits[at++] = base + w * 32u + uint(findLSB(m));
            if (w == MASK_WORDS - 1u) n_hits = at;
        }
        barrier();
        for (uint w = lx; w < MASK_WORDS; w += WG) mask[k][w] = 0u;
        uint count = n_hits;
        if (c < pc.H)
            for (uint h = 0u; h < count; h += UNROLL) {  // UNROLL rows' loads, then their adds in token order
                float d[UNROLL];
                [[unroll]] for (uint u = 0u; u < UNROLL; ++u)
                    if (h + u < count) d[u] = dX[pc.x_off + hits[h + u] * pc.H + c];
                [[unroll]] for (uint u = 0u; u < UNROLL; ++u)
                    if (h + u < count) acc += d[u] * s;
            }
        k = 1u - k;
    }
    if (c < pc.H) dE[o] = acc;
}
#endif
#endif  // SUM_PARTS
