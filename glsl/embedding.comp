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
// Backward without float atomics: workgroup (x, y) owns columns [x*WG, (x+1)*WG) of vocab row
// v = y. It walks the tokens in chunks of WG: each thread tests one token, an ordered compaction
// (prefix sum in shared memory) lists the matching positions in increasing order, then every
// thread adds those rows of its column. Sums run in token order from dE's old value, as numpy's
// add.at does, so the result is deterministic and independent of the geometry.
// Cost: every workgroup scans all tokens: V * ceil(H/WG) * T*B token tests (log2(WG) barriers
// per chunk of WG tokens), plus one read of each dX element; dE is read and written once.
#include "common.glsl"
#include "slots.glsl"
#include "dropout.glsl"

layout(local_size_x_id = 0) in;

layout(push_constant) uniform Push {
    uint n_rows;  // T*B
    uint H, V;    // H: the row width
    uint tok_off, e_off, x_off;  // element offsets of tokens, the table E / dE, the rows X / dX
    float sqrt_h;  // sqrt of the model's hidden size
    uint bias_off;  // HAS_BIAS: element offset of bias [H] in binding 4
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

layout(set = 0, binding = 1) buffer dE_ { float dE[]; };          // [V,H] accumulated
layout(set = 0, binding = 2) readonly buffer dX_ { float dX[]; };  // [T*B,H]

shared uint scan[2][gl_WorkGroupSize.x];  // ping-pong inclusive prefix sum of the match flags
shared uint hits[gl_WorkGroupSize.x];     // matching token positions of this chunk, in order

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint lx = gl_LocalInvocationID.x;
    uint c = gl_WorkGroupID.x * WG + lx;  // column of dE / dX
    uint v = gl_WorkGroupID.y;            // vocab row
    float s = row_scale(v);
    float acc = c < pc.H ? dE[pc.e_off + v * pc.H + c] : 0.0;

    for (uint base = 0; base < pc.n_rows; base += WG) {
        uint i = base + lx;
        uint match = (i < pc.n_rows && tok[pc.tok_off + i] == v) ? 1u : 0u;
        scan[0][lx] = match;
        barrier();
        uint src = 0;
        for (uint d = 1; d < WG; d <<= 1) {  // Hillis-Steele inclusive scan
            uint x = scan[src][lx];
            if (lx >= d) x += scan[src][lx - d];
            scan[1 - src][lx] = x;
            barrier();
            src = 1 - src;
        }
        if (match != 0u) hits[scan[src][lx] - 1u] = i;
        uint count = scan[src][WG - 1u];
        barrier();
        if (c < pc.H)
            for (uint h = 0; h < count; ++h) acc += dX[pc.x_off + hits[h] * pc.H + c] * s;
        barrier();  // hits and scan are rewritten by the next chunk
    }
    if (c < pc.H) dE[pc.e_off + v * pc.H + c] = acc;
}
#endif
