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

#include "decode_layer_body.glsl"

void main() {
    decode_layer_wg(gl_WorkGroupID.x, DecodeLayerArgs(pc.layer, pc.parity, pc.w_ih, pc.w_hh, pc.b_ih, pc.b_hh,
                                                      pc.g_prev, pc.g_self), LAYER_FULL);
}
