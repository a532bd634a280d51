#version 450
// One decode step of GRU layer l for B streams (generation: one token per stream, docs/generation.md).
// Everything between two layers' recurrent steps happens here, so a step is one dispatch per layer:
//   l = 0:  x = E[tok] * sqrt(H);                 gi = table0[tok] * sqrt(H) + b_ih     (table0 = E W_ih0^T)
//   l > 0:  y = ysum[l-1] (x + h of the layer below);  x = y * rstd(y) * g_{l-1};  gi = W_ih x + b_ih
//   gh = W_hh h_old[l] + b_hh;  r, z = sigmoid(gi + gh);  n = tanh(gi_n + r * gh_n);  h = (1-z) n + z h_old
// ysum[l] = x + h (the residual, before the next norm) is written for the layer above and the head;
// h goes to the other half of the ping-pong state (old = half `parity`, new = the other). A stream
// whose input token is <bos> starts from a zero state; a stream that has stopped (DS_DONE) keeps its
// state (h_new = h_old).
// The norm is folded in: gi = (W_ih (y * g)) * rstd(y), with sum(y^2) gathered in the same pass
// over k as the dot products, so no workgroup waits for another.
//
// Work split: a subgroup owns one unit j and a tile of SB streams; its lanes stride over k
// (coalesced weight rows), each lane keeps 6 x SB partial dot products (3 gates x {ih, hh}) in
// registers, and one subgroupAdd per partial ends it. No shared memory, no barriers.
// Workgroup w: units [(w % units_wgs) * NSUB, ...) of stream tile w / units_wgs. H and B are
// specialization constants (the k loop's trip count is known when the pipeline is built) and, with
// VEC4, lanes read 4 consecutive k as one vec4 (H % 4 == 0; every offset is then a multiple of 4).
// HALF (the "fused16" step, precision fp16): W_ih and W_hh come from a float16 copy (binding 6, the
// layout DecodeLayer's start makes: W_hh of layer l at l 3H^2 halves, W_ih of layer l > 0 at
// (L + l - 1) 3H^2; w_ih and w_hh in the push constants are offsets there), half the bytes a step
// reads, and the products' other operands are float16: the numerics of the tensor-core step, float32
// sums, the same twin. Those operands come from float16 shadows (binding 7, `a16`), each element
// rounded once where it is written, not in every unit's k loop: h16 [2 parities][L][B][H], the state
// (h_new written beside the float32 state; parity 0 from the state at a call's start), then y16
// [L][B][H] = float16((x + h) g_l), layer l's input to the layer above (g_self: layer l's norm weight).
// The sum of y^2 for the norm still comes from the float32 x + h.
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#ifdef HALF
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SB = 1;  // streams per subgroup (register tile)
layout(constant_id = 2) const uint H = 1;   // hidden size: compile-time, so the k loop unrolls
layout(constant_id = 3) const uint B = 1;   // streams

#include "vec4_loads.glsl"
#ifdef HALF
#ifdef VEC4
#define HT f16vec4
#else
#define HT float16_t
#endif
layout(set = 0, binding = 6) readonly buffer W16 { HT w16[]; };  // float16 W_hh, W_ih copies
layout(set = 0, binding = 7) buffer A16 { HT a16[]; };            // h16, then y16 (above)
layout(set = 0, binding = 7) buffer A16s { float16_t a16s[]; };   // the same, by half
#define WLOAD(i) VT(w16[i])
#else
#define WLOAD(i) params[i]
#endif

layout(set = 0, binding = 0) readonly buffer P { VT params[]; };      // flat ParamLayout
layout(set = 0, binding = 0) readonly buffer P1 { float params1[]; };  // the same, by float
layout(set = 0, binding = 1) readonly buffer T0 { float table0[]; };  // [V, 3H]  E W_ih0^T
layout(set = 0, binding = 2) buffer S { VT state[]; };                // [2, L, B, H] ping-pong
layout(set = 0, binding = 2) buffer S1 { float state1[]; };
layout(set = 0, binding = 3) buffer Y { VT ysum[]; };                 // [L, B, H] x + h_new of each layer
layout(set = 0, binding = 3) buffer Y1 { float ysum1[]; };
layout(set = 0, binding = 4) readonly buffer Tok { uint token[]; };   // [B] this step's input
layout(set = 0, binding = 5) readonly buffer Ctl { uint ctl[]; };     // [B, DS_WORDS]

layout(push_constant) uniform Push {
    uint layer, parity;  // state half `parity` is old, 1 - parity new
    uint L, V;
    uint w_ih, w_hh, b_ih, b_hh;  // offsets in params (w_ih unused for layer 0); HALF: the weights' in w16
    uint g_prev;  // offset of layer l-1's norm weight (l > 0); for l = 0, of embedding.weight
    uint units_wgs;  // workgroups along units: ceil(H / subgroups per workgroup)
    uint bos;
    float sqrt_h, eps;
    uint g_self;  // offset of layer l's norm weight (HALF: y16 for the layer above)
} pc;

uint st(uint half_, uint l, uint b) { return ((half_ * pc.L + l) * B + b) * H; }  // in floats
uint y16_at(uint l, uint b) { return ((2u * pc.L + l) * B + b) * H; }  // HALF: y16 in a16, in halves

// Layer 0's input side at unit j for token `tok`: gi (table0 row times sqrt(H)) and x = E[tok, j] sqrt(H).
// A token outside the vocabulary is a zero row (as the batched gather).
void layer0_input(uint tok, uint j, out float gi0, out float gi1, out float gi2, out float x) {
    float t0 = 0.0, t1 = 0.0, t2 = 0.0, e = 0.0;
    if (tok < pc.V) {
        t0 = table0[tok * 3u * H + j]; t1 = table0[tok * 3u * H + H + j];
        t2 = table0[tok * 3u * H + 2u * H + j]; e = params1[pc.g_prev + tok * H + j];
    }
    gi0 = t0 * pc.sqrt_h; gi1 = t1 * pc.sqrt_h; gi2 = t2 * pc.sqrt_h;
    x = e * pc.sqrt_h;
}

// The GRU cell from the pre-activations with their biases added; hold is the state entering
// (already zero after a <bos>).
float gru_cell(float ai0, float ai1, float ai2, float ah0, float ah1, float ah2, float hold) {
    float r = sigmoid(ai0 + ah0), z = sigmoid(ai1 + ah1);
    float n = tanh_safe(ai2 + r * ah2);
    return (1.0 - z) * n + z * hold;
}

void main() {
    uint nsub = gl_NumSubgroups, lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
    uint wg = gl_WorkGroupID.x;
    uint j = (wg % pc.units_wgs) * nsub + gl_SubgroupID;
    uint b0 = (wg / pc.units_wgs) * SB;
    if (j >= H) return;  // whole subgroups only: the subgroup operations below stay uniform
    uint l = pc.layer, oldh = pc.parity, newh = 1u - pc.parity;
    bool first = l == 0u;
    const uint HW = H / W;  // k steps of W floats

    float ai[3][SB], ah[3][SB], ss[SB], keep[SB];
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        ss[s] = 0.0;
        uint b = b0 + s;
        keep[s] = (b < B && token[b] != pc.bos) ? 1.0 : 0.0;  // <bos>: the state entering is zero
        [[unroll]] for (uint g = 0u; g < 3u; ++g) { ai[g][s] = 0.0; ah[g][s] = 0.0; }
    }
    // what the end needs, loaded before the k loop so its latency hides behind the dot products
    float bi0 = params1[pc.b_ih + j], bi1 = params1[pc.b_ih + H + j], bi2 = params1[pc.b_ih + 2u * H + j];
    float bh0 = params1[pc.b_hh + j], bh1 = params1[pc.b_hh + H + j], bh2 = params1[pc.b_hh + 2u * H + j];
    float gj = first ? 0.0 : params1[pc.g_prev + j];
#ifdef HALF
    float g_self = params1[pc.g_self + j];
#endif
    float hold_j[SB], y_j[SB];
    bool done[SB];
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        uint b = min(b0 + s, B - 1u);
        hold_j[s] = state1[st(oldh, l, b) + j];
        y_j[s] = first ? 0.0 : ysum1[((l - 1u) * B + b) * H + j];
        done[s] = ctl[b * DS_WORDS + DS_DONE] != 0u;
    }
    uint wh = pc.w_hh / W + j * HW, wi = pc.w_ih / W + j * HW;
    [[unroll]] for (uint k = lane; k < HW; k += lanes) {
        VT wh0 = WLOAD(wh + k), wh1 = WLOAD(wh + H * HW + k), wh2 = WLOAD(wh + 2u * H * HW + k);
        VT wi0 = VT(0.0), wi1 = VT(0.0), wi2 = VT(0.0);
#ifndef HALF
        VT gk = first ? VT(0.0) : params[pc.g_prev / W + k];  // the norm weight at k (HALF: folded into y16)
#endif
        if (!first) { wi0 = WLOAD(wi + k); wi1 = WLOAD(wi + H * HW + k); wi2 = WLOAD(wi + 2u * H * HW + k); }
        [[unroll]] for (uint s = 0u; s < SB; ++s) {
            uint b = b0 + s;
            if (b >= B) break;  // uniform in the subgroup
#ifdef HALF
            VT hold = VT(a16[st(oldh, l, b) / W + k]) * keep[s];
#else
            VT hold = state[st(oldh, l, b) / W + k] * keep[s];
#endif
            ah[0][s] += DOT(wh0, hold); ah[1][s] += DOT(wh1, hold); ah[2][s] += DOT(wh2, hold);
            if (!first) {
                VT y = ysum[((l - 1u) * B + b) * HW + k];
                ss[s] += DOT(y, y);
#ifdef HALF
                VT yg = VT(a16[y16_at(l - 1u, b) / W + k]);
#else
                VT yg = y * gk;
#endif
                ai[0][s] += DOT(wi0, yg); ai[1][s] += DOT(wi1, yg); ai[2][s] += DOT(wi2, yg);
            }
        }
    }
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        uint b = b0 + s;
        if (b >= B) break;
        float gh0 = subgroupAdd(ah[0][s]), gh1 = subgroupAdd(ah[1][s]), gh2 = subgroupAdd(ah[2][s]);
        float gi0, gi1, gi2, x;
        if (first) {
            layer0_input(token[b], j, gi0, gi1, gi2, x);
        } else {
            float rstd = 1.0 / sqrt(subgroupAdd(ss[s]) / float(H) + pc.eps);
            gi0 = subgroupAdd(ai[0][s]) * rstd; gi1 = subgroupAdd(ai[1][s]) * rstd;
            gi2 = subgroupAdd(ai[2][s]) * rstd;
            x = y_j[s] * rstd * gj;
        }
        if (lane == 0u) {
            float h = done[s] ? hold_j[s]
                              : gru_cell(gi0 + bi0, gi1 + bi1, gi2 + bi2, gh0 + bh0, gh1 + bh1, gh2 + bh2,
                                         hold_j[s] * keep[s]);
            state1[st(newh, l, b) + j] = h;
            ysum1[(l * B + b) * H + j] = x + h;
#ifdef HALF
            a16s[st(newh, l, b) + j] = float16_t(h);
            a16s[y16_at(l, b) + j] = float16_t((x + h) * g_self);
#endif
        }
    }
}
