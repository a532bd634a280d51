#version 450
// The head of a decode step for B streams: logits[b, v] = W_head[v] . (y * g) * rstd(y), with
// y = ysum[L-1] (x + h of the last layer) and g its norm weight. Spread over the GPU like the layer
// kernel (glsl/decode_layer.comp): a subgroup owns RB vocabulary rows and a tile of SB streams (each
// y it loads feeds RB rows' dot products: at 64 streams and RB = 1 every stream's y is read once per
// row), its lanes stride over k, sum(y^2) is gathered in the same pass. A row's logit is the same
// operations in the same order whatever RB. The choice of the next token
// (glsl/decode_sample.comp) reads the logits in the next dispatch.
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#include "slots.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SB = 1;  // streams per subgroup (register tile)
layout(constant_id = 2) const uint H = 1;
layout(constant_id = 3) const uint B = 1;
layout(constant_id = 4) const uint RB = 1;  // vocabulary rows per subgroup

#include "vec4_loads.glsl"

layout(set = 0, binding = 0) readonly buffer P { VT params[]; };
layout(set = 0, binding = 1) readonly buffer Y { VT ysum[]; };   // [L, B, H]
layout(set = 0, binding = 2) writeonly buffer Lg { float logits[]; };  // [B, V]
layout(set = 0, binding = 3) readonly buffer Ctl { uint ctl[]; };  // [B, DS_WORDS]

layout(push_constant) uniform Push {
    uint L, V;
    uint w_head, g_last;  // offsets (multiples of 4 with VEC4)
    uint rows_wgs;  // workgroups along rows: ceil(V / (RB x subgroups per workgroup))
    float eps;
} pc;

void main() {
    uint lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize, wg = gl_WorkGroupID.x;
    uint v0 = ((wg % pc.rows_wgs) * gl_NumSubgroups + gl_SubgroupID) * RB;
    uint b0 = (wg / pc.rows_wgs) * SB;
    if (v0 >= pc.V) return;  // whole subgroups only
    const uint HW = H / W;
    float acc[RB * SB], ss[SB];  // acc[r * SB + s]: row v0 + r, stream b0 + s
    [[unroll]] for (uint s = 0u; s < SB; ++s) ss[s] = 0.0;
    [[unroll]] for (uint i = 0u; i < RB * SB; ++i) acc[i] = 0.0;
    uint rows = min(RB, pc.V - v0), y0 = (pc.L - 1u) * B * HW;
    [[unroll]] for (uint k = lane; k < HW; k += lanes) {
        VT g = params[pc.g_last / W + k], wk[RB];
        [[unroll]] for (uint r = 0u; r < RB; ++r)
            if (r < rows) wk[r] = params[pc.w_head / W + (v0 + r) * HW + k] * g;
        [[unroll]] for (uint s = 0u; s < SB; ++s) {
            uint b = b0 + s;
            if (b >= B) break;  // uniform in the subgroup
            VT y = ysum[y0 + b * HW + k];
            ss[s] += DOT(y, y);
            [[unroll]] for (uint r = 0u; r < RB; ++r)
                if (r < rows) acc[r * SB + s] += DOT(wk[r], y);
        }
    }
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        uint b = b0 + s;
        if (b >= B) break;
        float rstd = 1.0 / sqrt(subgroupAdd(ss[s]) / float(H) + pc.eps);
        bool live = ctl[b * DS_WORDS + DS_DONE] == 0u;  // a stopped stream keeps the logits it stopped with
        [[unroll]] for (uint r = 0u; r < RB; ++r) {
            if (r >= rows) break;
            float l = subgroupAdd(acc[r * SB + s]) * rstd;
            if (lane == 0u && live) logits[b * pc.V + v0 + r] = l;
        }
    }
}
