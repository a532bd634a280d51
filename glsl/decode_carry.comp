#version 450
// The end of a batched decode step (catchat/vk/program/decoder.py: the step as the batched forward
// at T = 1), between the head and the choice: for every stream still live (DS_DONE = 0) the state
// the step left (hT) becomes the next step's carried state (h0), and its logits become the ones
// the choice reads (and the call's last logits); a stream that has stopped keeps both, as the
// fused step (glsl/decode_layer.comp, decode_head.comp) keeps them. Thread i < L*B*H: a state
// word; the next B*V threads: a logit.
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) readonly buffer HT { float hT[]; };        // [L,B,H] the step's new state
layout(set = 0, binding = 1) buffer H0 { float h0[]; };                 // [L,B,H] the next step's carry
layout(set = 0, binding = 2) readonly buffer Lg { float logits[]; };    // [B,V] the step's logits
layout(set = 0, binding = 3) buffer Kept { float kept[]; };             // [B,V] what the choice reads
layout(set = 0, binding = 4) readonly buffer Ctl { uint ctl[]; };       // [B, DS_WORDS]

layout(push_constant) uniform Push { uint L, B, H, V; } pc;

bool live(uint b) { return ctl[b * DS_WORDS + DS_DONE] == 0u; }

void main() {
    uint i = gl_GlobalInvocationID.x, words = pc.L * pc.B * pc.H;
    if (i < words) {
        if (live((i / pc.H) % pc.B)) h0[i] = hT[i];
    } else if (i < words + pc.B * pc.V) {
        uint j = i - words;
        if (live(j / pc.V)) kept[j] = logits[j];
    }
}
