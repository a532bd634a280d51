// float32 as two float16 parts, x = hi + lo / SPLIT_SCALE: hi = float16(x) (the store's rounding, to
// nearest even), lo = what hi left out, scaled into float16's range (catchat/vk/kernels/gru/stream.py's
// SPLIT_SCALE and split_halves, its twin). lo takes hi from round_half.glsl, not from float(float16_t(x)):
// NVIDIA's compiler (580.159) folded that round trip to x in to_half.comp and left lo 0. Written by
// ToHalf's LO (W_hh) and the split forward's gates (h), multiplied by its SPLIT; `split_normal` by the
// tensor-core GEMM's SPLIT (include/gemm_coopmat.glsl).
#ifndef CATCHAT_SPLIT_HALF_GLSL
#define CATCHAT_SPLIT_HALF_GLSL
#include "round_half.glsl"
#define SPLIT_SCALE 2048.0
float16_t split_lo(float v) { return float16_t((v - round_half(v)) * SPLIT_SCALE); }  // v - hi is exact

// The same split where every x lies in float16's normal range (gemm_coopmat.glsl's SPLIT scales its
// operands there first): hi = x's top 11 bits rounded half away from zero, two integer operations where
// round_half's ties-to-even and range checks take a dozen (hi's rounding is free to choose: lo takes what
// it left, exactly); hi then converts to float16 exactly, and nothing here is a round trip to fold.
// Returns hi's and lo's float16 words (packFloat2x16: xy hi, zw lo).
uvec4 split_normal(vec4 x) {
    vec4 hi = uintBitsToFloat((floatBitsToUint(x) + 0x1000u) & 0xFFFFE000u);
    vec4 lo = (x - hi) * SPLIT_SCALE;
    return uvec4(packFloat2x16(f16vec2(hi.xy)), packFloat2x16(f16vec2(hi.zw)),
                 packFloat2x16(f16vec2(lo.xy)), packFloat2x16(f16vec2(lo.zw)));
}
#endif
