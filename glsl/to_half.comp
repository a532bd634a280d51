#version 450
// y[y_off + i] = float16(x[x_off + i]) for i < n, rounded to nearest even (or, with cols, in 16 x 16 blocks): the float16 copy of W_hh
// that the streamed sweeps multiply (glsl/gru_*_stream.comp), refreshed after every parameter
// change. Grid-stride, so any n fits the dispatch. LO: y = split_lo(x) instead (include/split_half.glsl:
// x = hi + 2^-11 lo, hi this shader's plain output), the lo part of the split copy the float32 forward
// on tensor cores multiplies (gru_forward_stream.comp's SPLIT).
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#ifdef LO
#include "split_half.glsl"
#endif

layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) writeonly buffer Y { float16_t y[]; };
layout(push_constant) uniform Push {
    uint n; uint x_off; uint y_off;
    uint cols;  // > 0: x is a matrix with rows of `cols`, y its 16 x 16 blocks (include/sweep_frag.glsl's BLOCKED_W)
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) {
        uint d = i;
        if (pc.cols > 0u) {  // element (r, c) -> block (r / 16, c / 16), row-major inside
            uint r = i / pc.cols, c = i % pc.cols;
            d = ((r / 16u) * (pc.cols / 16u) + c / 16u) * 256u + (r % 16u) * 16u + c % 16u;
        }
#ifdef LO
        y[pc.y_off + d] = split_lo(x[pc.x_off + i]);
#else
        y[pc.y_off + d] = float16_t(x[pc.x_off + i]);
#endif
    }
}
