#version 450
// The head of a decode step for B streams, in KP parts of k: part p holds, for each stream b and
// vocabulary row v, sum over its k range of (W_head[v, k] g[k]) y[b, k], and sum(y[b, k]^2) over the
// same range, with y = ysum[L-1] (x + h of the last layer) and g its norm weight. The choice
// (glsl/decode_sample.comp's HEAD_PARTS) adds the parts in order p = 0 .. KP-1 and scales by the rstd
// of the sum of squares: logits[b, v] = sum_p acc_p[b, v] / sqrt(sum_p ss_p[b] / H + eps).
// Why parts: a vocabulary row per subgroup (the kernel before) spread 101 rows over ~50 workgroups,
// each reading every stream's y: 52 MB of L2 reads a step at v5's 64 streams, 35 us. Here workgroup
// (p, sb) stages its SB streams' y over its k range once in shared memory (read there as a broadcast:
// every thread reads the same element), each thread walks one vocabulary row of W_head over the range,
// and KP x ceil(B / SB) workgroups cover the GPU: W_head and y are read about once.
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x_id = 0) in;  // threads >= V: a vocabulary row each
layout(constant_id = 1) const uint SB = 1;  // streams per workgroup (registers: SB partial sums a thread)
layout(constant_id = 2) const uint H = 1;
layout(constant_id = 3) const uint B = 1;
layout(constant_id = 4) const uint KR = 1;  // k steps (vec4 with VEC4, else floats) per part, held in registers

#include "vec4_loads.glsl"

layout(set = 0, binding = 0) readonly buffer P { VT params[]; };
layout(set = 0, binding = 1) readonly buffer Y { VT ysum[]; };          // [L, B, H]
layout(set = 0, binding = 2) writeonly buffer Hp { float parts[]; };   // [KP, B, V] sums, then [KP, B] ss

layout(push_constant) uniform Push {
    uint L, V;
    uint w_head, g_last;  // offsets (multiples of 4 with VEC4)
    uint kp;              // parts: KP * KR >= H / W
} pc;

#include "decode_head_body.glsl"

void main() { decode_head_wg(gl_WorkGroupID.x); }
