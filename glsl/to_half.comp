#version 450
// y[y_off + i] = float16(x[x_off + i]) for i < n, rounded to nearest even: the float16 copy of W_hh
// that the streamed sweeps multiply (glsl/gru_*_stream.comp), refreshed after every parameter
// change. Grid-stride, so any n fits the dispatch.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) writeonly buffer Y { float16_t y[]; };
layout(push_constant) uniform Push { uint n; uint x_off; uint y_off; } pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) y[pc.y_off + i] = float16_t(x[pc.x_off + i]);
}
