#version 450
// Which elements of a 16 x 16 cooperative matrix each invocation of a subgroup holds, for the three uses
// (A, B, accumulator) and both load layouts. VK_KHR_cooperative_matrix leaves that mapping to the driver;
// a copy of the weights laid out in it would load a fragment with one 16-byte load per invocation instead
// of several short ones (tools/coopmat_layout.py). The 256 values loaded are 0..255, exact in float16:
// invocation l writes its m.length() elements in order at ((slot * 32 + l) * MAXLEN + i), slot = use * 2 +
// (1 for column-major), then the six lengths after the 6 * 32 * MAXLEN values.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require

layout(local_size_x = 32) in;
layout(set = 0, binding = 0) readonly buffer Src16 { float16_t src16[]; };  // 0..255
layout(set = 0, binding = 1) readonly buffer Src32 { float src32[]; };      // 0..255
layout(set = 0, binding = 2) writeonly buffer Dst { float dst[]; };

const uint MAXLEN = 32u;  // elements per invocation at most (256 / 32 = 8 on subgroups of 32)

void put(uint slot, uint i, float v) { dst[(slot * 32u + gl_LocalInvocationIndex) * MAXLEN + i] = v; }

#define PROBE(T, USE, SRC, slot, LAYOUT) { \
    coopmat<T, gl_ScopeSubgroup, 16, 16, USE> m; \
    coopMatLoad(m, SRC, 0, 16, LAYOUT); \
    uint n = uint(m.length()); \
    for (uint i = 0u; i < n && i < MAXLEN; ++i) put(slot, i, float(m[i])); \
    if (gl_LocalInvocationIndex == 0u) dst[6u * 32u * MAXLEN + (slot)] = float(n); }

void main() {
    PROBE(float16_t, gl_MatrixUseA, src16, 0u, gl_CooperativeMatrixLayoutRowMajor)
    PROBE(float16_t, gl_MatrixUseA, src16, 1u, gl_CooperativeMatrixLayoutColumnMajor)
    PROBE(float16_t, gl_MatrixUseB, src16, 2u, gl_CooperativeMatrixLayoutRowMajor)
    PROBE(float16_t, gl_MatrixUseB, src16, 3u, gl_CooperativeMatrixLayoutColumnMajor)
    PROBE(float, gl_MatrixUseAccumulator, src32, 4u, gl_CooperativeMatrixLayoutRowMajor)
    PROBE(float, gl_MatrixUseAccumulator, src32, 5u, gl_CooperativeMatrixLayoutColumnMajor)
}
