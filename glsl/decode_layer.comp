#version 450
// One decode step of GRU layer l for B streams (generation: one token per stream, docs/generation.md).
// Everything between two layers' recurrent steps happens here, so a step is one dispatch per layer:
//   l = 0:  x = E[tok] * sqrt(H);                 gi = table0[tok] * sqrt(H) + b_ih     (table0 = E W_ih0^T)
//   l > 0:  y = xin[l-1] + h_new[l-1];  x = y * rstd(y) * g_{l-1};   gi = W_ih x + b_ih
//   gh = W_hh h_old[l] + b_hh;  r, z = sigmoid(gi + gh);  n = tanh(gi_n + r * gh_n);  h = (1-z) n + z h_old
// xin[l] = x is written for the next layer's residual; h goes to the other half of the ping-pong
// state (old = half `parity`, new = the other). A stream whose input token is <bos> starts from a
// zero state; a stream that has stopped (DS_DONE) keeps its state (h_new = h_old).
// The norm is folded in: gi = (W_ih (y * g)) * rstd(y), with sum(y^2) gathered in the same pass
// over k as the dot products, so no workgroup waits for another.
//
// Work split: a subgroup owns one unit j and a tile of SB streams; its lanes stride over k
// (coalesced weight rows), each lane keeps 6 x SB partial dot products (3 gates x {ih, hh}) in
// registers, and one subgroupAdd per partial ends it. No shared memory, no barriers.
// Workgroup w: units [(w % units_wgs) * NSUB, ...) of stream tile w / units_wgs.
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SB = 1;  // streams per subgroup (register tile)

layout(set = 0, binding = 0) readonly buffer P { float params[]; };   // flat ParamLayout
layout(set = 0, binding = 1) readonly buffer T0 { float table0[]; };  // [V, 3H]  E W_ih0^T
layout(set = 0, binding = 2) buffer S { float state[]; };             // [2, L, B, H] ping-pong
layout(set = 0, binding = 3) buffer X { float xin[]; };               // [L, B, H] each layer's input
layout(set = 0, binding = 4) readonly buffer Tok { uint token[]; };   // [B] this step's input
layout(set = 0, binding = 5) readonly buffer Ctl { uint ctl[]; };     // [B, DS_WORDS]

layout(push_constant) uniform Push {
    uint layer, parity;  // state half `parity` is old, 1 - parity new
    uint H, B, L, V;
    uint w_ih, w_hh, b_ih, b_hh;  // offsets in params (w_ih unused for layer 0)
    uint g_prev;  // offset of layer l-1's norm weight (l > 0); for l = 0, of embedding.weight
    uint units_wgs;  // workgroups along units: ceil(H / subgroups per workgroup)
    uint bos;
    float sqrt_h, eps;
} pc;

uint st(uint half_, uint l, uint b) { return ((half_ * pc.L + l) * pc.B + b) * pc.H; }

void main() {
    uint nsub = gl_NumSubgroups, lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
    uint wg = gl_WorkGroupID.x;
    uint j = (wg % pc.units_wgs) * nsub + gl_SubgroupID;
    uint b0 = (wg / pc.units_wgs) * SB;
    if (j >= pc.H) return;  // whole subgroups only: the subgroup operations below stay uniform
    uint H = pc.H, l = pc.layer, oldh = pc.parity, newh = 1u - pc.parity;
    bool first = l == 0u;

    float ai[3][SB], ah[3][SB], ss[SB], keep[SB];
    for (uint s = 0u; s < SB; ++s) {
        ss[s] = 0.0;
        uint b = b0 + s;
        keep[s] = (b < pc.B && token[b] != pc.bos) ? 1.0 : 0.0;  // <bos>: the state entering is zero
        for (uint g = 0u; g < 3u; ++g) { ai[g][s] = 0.0; ah[g][s] = 0.0; }
    }
    for (uint k = lane; k < H; k += lanes) {
        float wh0 = params[pc.w_hh + j * H + k], wh1 = params[pc.w_hh + (H + j) * H + k],
              wh2 = params[pc.w_hh + (2u * H + j) * H + k];
        float wi0 = 0.0, wi1 = 0.0, wi2 = 0.0, gk = 0.0;
        if (!first) {
            wi0 = params[pc.w_ih + j * H + k]; wi1 = params[pc.w_ih + (H + j) * H + k];
            wi2 = params[pc.w_ih + (2u * H + j) * H + k]; gk = params[pc.g_prev + k];
        }
        for (uint s = 0u; s < SB; ++s) {
            uint b = b0 + s;
            if (b >= pc.B) break;  // uniform in the subgroup
            float hold = state[st(oldh, l, b) + k] * keep[s];
            ah[0][s] += wh0 * hold; ah[1][s] += wh1 * hold; ah[2][s] += wh2 * hold;
            if (!first) {
                float y = xin[(l - 1u) * pc.B * H + b * H + k] + state[st(newh, l - 1u, b) + k];
                ss[s] += y * y;
                float yg = y * gk;
                ai[0][s] += wi0 * yg; ai[1][s] += wi1 * yg; ai[2][s] += wi2 * yg;
            }
        }
    }
    for (uint s = 0u; s < SB; ++s) {
        uint b = b0 + s;
        if (b >= pc.B) break;
        float gh0 = subgroupAdd(ah[0][s]), gh1 = subgroupAdd(ah[1][s]), gh2 = subgroupAdd(ah[2][s]);
        float gi0, gi1, gi2, x;
        if (first) {
            uint tok = token[b];
            float t0 = 0.0, t1 = 0.0, t2 = 0.0, e = 0.0;
            if (tok < pc.V) {  // a token outside the vocabulary is a zero row (as the batched gather)
                t0 = table0[tok * 3u * H + j]; t1 = table0[tok * 3u * H + H + j];
                t2 = table0[tok * 3u * H + 2u * H + j]; e = params[pc.g_prev + tok * H + j];
            }
            gi0 = t0 * pc.sqrt_h; gi1 = t1 * pc.sqrt_h; gi2 = t2 * pc.sqrt_h;
            x = e * pc.sqrt_h;
        } else {
            float rstd = 1.0 / sqrt(subgroupAdd(ss[s]) / float(H) + pc.eps);
            gi0 = subgroupAdd(ai[0][s]) * rstd; gi1 = subgroupAdd(ai[1][s]) * rstd;
            gi2 = subgroupAdd(ai[2][s]) * rstd;
            float y = xin[(l - 1u) * pc.B * H + b * H + j] + state[st(newh, l - 1u, b) + j];
            x = y * rstd * params[pc.g_prev + j];
        }
        if (lane == 0u) {
            gi0 += params[pc.b_ih + j]; gi1 += params[pc.b_ih + H + j]; gi2 += params[pc.b_ih + 2u * H + j];
            gh0 += params[pc.b_hh + j]; gh1 += params[pc.b_hh + H + j]; gh2 += params[pc.b_hh + 2u * H + j];
            float hold = state[st(oldh, l, b) + j] * keep[s];
            float r = sigmoid(gi0 + gh0), z = sigmoid(gi1 + gh1);
            float n = tanh_safe(gi2 + r * gh2);
            float h = (1.0 - z) * n + z * hold;
            bool done = ctl[b * DS_WORDS + DS_DONE] != 0u;
            state[st(newh, l, b) + j] = done ? state[st(oldh, l, b) + j] : h;
            xin[l * pc.B * H + b * H + j] = x;
        }
    }
}
