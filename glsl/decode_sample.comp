#version 450
// The end of a decode step for stream b = workgroup: the choice of the next input token from
// logits[b] (with HEAD_PARTS first made here from glsl/decode_head.comp's parts; else written by the
// batched step's head and glsl/decode_carry.comp, or uploaded for the first choice of a call)
// (docs/generation.md; catchat.reference.sample_choice is the numpy twin, rule for rule). In order: a forced token while DS_FED < n_forced (feeding known text: nothing is emitted);
// else stop when DS_GEN = length; else sample:
//   allowed = not <pad>, not <bos>, not banned by n-gram blocking (stop tokens are never banned)
//   greedy:  the first largest allowed logit
//   else:    z = logit * inv_temp; keep the top_k largest (rank by z, ties to the lower index);
//            p = exp(z - max z); keep tokens whose mass ranked before them is < top_p * sum p;
//            c = running sum of kept p in index order (any summation order: the twin is float64); u = rng_uniform(seed_b, STREAM_DECODE, gen);
//            token = the first v with c[v] > u * c[V-1] (else the last kept v)
// The token is the next step's input, is written to out[k, b] and to the n-gram history, and the
// stream stops after a stop token or its length-th token. A stopped stream writes NONE and nothing else.
// N-gram blocking: after the last n-1 generated tokens, every token that once followed those n-1
// tokens in this call is banned (the lanes scan the history in parallel).
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0) in;  // >= V: thread v owns token v in the choice

#ifdef HEAD_PARTS  // the fused decode steps: this dispatch adds glsl/decode_head.comp's parts into logits first
layout(set = 0, binding = 0) buffer Lg { float logits[]; };            // [B, V]
#else
layout(set = 0, binding = 0) readonly buffer Lg { float logits[]; };   // [B, V]
#endif
layout(set = 0, binding = 1) buffer Tok { uint token[]; };             // [B] next step's input
layout(set = 0, binding = 2) buffer Ctl { uint ctl[]; };               // [B, DS_WORDS]
layout(set = 0, binding = 3) readonly buffer Cfg { uint cfg[]; };      // [DC_WORDS]
layout(set = 0, binding = 4) readonly buffer Forced { uint forced[]; };  // [F, B]
layout(set = 0, binding = 5) buffer Hist { uint hist[]; };             // [cap, B] generated tokens
layout(set = 0, binding = 6) writeonly buffer Out { uint outp[]; };    // [K, B]
#ifdef RESETS  // the batched decode step: the next step's reset (1 = <bos>: a zero state) beside its token
layout(set = 0, binding = 7) writeonly buffer Rs { uint resets[]; };   // [B]
#define SET_TOKEN(b, t) token[b] = (t); resets[b] = uint((t) == pc.bos)
#else
#define SET_TOKEN(b, t) token[b] = (t)
#endif
#ifdef HEAD_PARTS  // the binding after the last one
#ifdef RESETS
#define HP_BINDING 8
#else
#define HP_BINDING 7
#endif
layout(set = 0, binding = HP_BINDING) readonly buffer Hp { float parts[]; };  // [KP, B, V] sums, then [KP, B] ss
#endif

layout(push_constant) uniform Push {
    uint k;  // row of out written by this dispatch
    uint B, V;
    uint cap;  // rows of the n-gram history
    uint pad, bos, eos;
    uint H;     // HEAD_PARTS: the hidden size and the norm's eps
    float eps;
} pc;
layout(constant_id = 1) const uint KP = 1;  // HEAD_PARTS: the head's parts

#include "decode_sample_body.glsl"

void main() { decode_choose(gl_WorkGroupID.x, pc.k); }
