// x rounded to the nearest float16 value (ties to even), kept as float32, in integer and exact float
// arithmetic: gemm.comp's ROUND_HALF (fp16 operands staged from float32 where there are no tensor
// cores). A float32 -> float16 -> float32 conversion in registers is folded away by NVIDIA's compiler
// (H200: gemm.comp's rounded rows matched unrounded products; H100: the fused16 decode step's parity
// rows, when it rounded that way, as far from the float16 twin as from the float32 one), and nothing
// may fold this. A value stored to a 16-bit buffer is rounded by the store (decode_layer.comp's HALF
// now writes float16 shadows instead). Normal range: drop 13 mantissa bits (the carry may bump the
// exponent; past 65504 is inf); below 2^-14: a multiple of 2^-24, as float16's subnormals; inf and NaN unchanged. Selects, no
// branches: it sits in k loops.
#ifndef CATCHAT_ROUND_HALF_GLSL
#define CATCHAT_ROUND_HALF_GLSL

float round_half(float x) {
    uint u = floatBitsToUint(x);
    uint r = (u + 0xFFFu + ((u >> 13u) & 1u)) & 0xFFFFE000u;
    r = (r & 0x7FFFFFFFu) > 0x477FE000u ? (r & 0x80000000u) | 0x7F800000u : r;
    float normal = (u & 0x7F800000u) == 0x7F800000u ? x : uintBitsToFloat(r);
    return abs(x) < 6.103515625e-05 ? roundEven(x * 16777216.0) * 5.9604644775390625e-08 : normal;
}

vec4 round_half(vec4 v) { return vec4(round_half(v.x), round_half(v.y), round_half(v.z), round_half(v.w)); }

#endif
