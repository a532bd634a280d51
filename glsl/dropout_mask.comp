#version 450
// Dropout keep masks as float scales: out[i] = keep / (1 - p) or 0, for i < n.
// Embedding rows: stream 1, counter = vocab row v (n = V).
// Hidden units of layer l: stream 16 + l, counter = b * H + j (n = B * H, out is [B,H]).
// The shaders that drop (embedding, rmsnorm) recompute the same value with dropout_scale();
// this kernel exists so parity tests can compare the GLSL RNG bit-for-bit with numpy's.
#include "common.glsl"
#include "slots.glsl"
#include "dropout.glsl"

layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer Hyper { uint hyper[]; };  // [HP_WORDS]
layout(set = 0, binding = 1) writeonly buffer Out { float mask[]; };   // [n] at out_off
layout(push_constant) uniform Push {
    uint n;        // elements: V, or B * H
    uint stream;   // 1 (embedding) or 16 + layer (hidden)
    uint p_slot;   // hyper slot of p: HP_P_EMB or HP_P_HID
    uint out_off;  // element offset of the mask in `mask`
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) return;
    mask[pc.out_off + i] = dropout_scale(HPU(hyper, HP_SEED), pc.stream, i, HPF(hyper, pc.p_slot));
}
