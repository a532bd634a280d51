#version 450
// The head of a decode step for B streams: logits[b, v] = W_head[v] . (y * g) * rstd(y), with
// y = ysum[L-1] (x + h of the last layer) and g its norm weight. Spread over the GPU like the layer
// kernel (glsl/decode_layer.comp): a subgroup owns one vocabulary row v and a tile of SB streams,
// its lanes stride over k, sum(y^2) is gathered in the same pass. The choice of the next token
// (glsl/decode_sample.comp) reads the logits in the next dispatch.
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#include "slots.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SB = 1;  // streams per subgroup (register tile)
layout(constant_id = 2) const uint H = 1;
layout(constant_id = 3) const uint B = 1;

#include "vec4_loads.glsl"

layout(set = 0, binding = 0) readonly buffer P { VT params[]; };
layout(set = 0, binding = 1) readonly buffer Y { VT ysum[]; };   // [L, B, H]
layout(set = 0, binding = 2) writeonly buffer Lg { float logits[]; };  // [B, V]
layout(set = 0, binding = 3) readonly buffer Ctl { uint ctl[]; };  // [B, DS_WORDS]

layout(push_constant) uniform Push {
    uint L, V;
    uint w_head, g_last;  // offsets (multiples of 4 with VEC4)
    uint rows_wgs;  // workgroups along rows: ceil(V / subgroups per workgroup)
    float eps;
} pc;

void main() {
    uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize, wg = gl_WorkGroupID.x;
    uint v = (wg % pc.rows_wgs) * gl_NumSubgroups + gl_SubgroupID;
    uint b0 = (wg / pc.rows_wgs) * SB;
    if (v >= pc.V) return;  // whole subgroups only
    const uint HW = H / W;
    float acc[SB], ss[SB];
    [[unroll]] for (uint s = 0u; s < SB; ++s) { acc[s] = 0.0; ss[s] = 0.0; }
    uint wrow = pc.w_head / W + v * HW, y0 = (pc.L - 1u) * B * HW;
    [[unroll]] for (uint k = lane; k < HW; k += lanes) {
        VT wk = params[wrow + k] * params[pc.g_last / W + k];
        [[unroll]] for (uint s = 0u; s < SB; ++s) {
            uint b = b0 + s;
            if (b >= B) break;  // uniform in the subgroup
            VT y = ysum[y0 + b * HW + k];
            ss[s] += DOT(y, y);
            acc[s] += DOT(wk, y);
        }
    }
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        uint b = b0 + s;
        if (b >= B) break;
        float l = subgroupAdd(acc[s]) * (1.0 / sqrt(subgroupAdd(ss[s]) / float(H) + pc.eps));
        bool live = ctl[b * DS_WORDS + DS_DONE] == 0u;  // a stopped stream keeps the logits it stopped with
        if (lane == 0u && live) logits[b * pc.V + v] = l;
    }
}
