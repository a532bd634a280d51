// float32 as two float16 parts, x = hi + lo / SPLIT_SCALE: hi = x rounded to float16's 11 bits (to nearest
// even; 0 below float16's normal range, where lo carries x), lo = what hi left out, scaled into float16's
// range (catchat/vk/kernels/gru/stream.py's SPLIT_SCALE and split_halves, its twin). hi is rounded in
// integer arithmetic: NVIDIA's compiler (580.159) folded the round trip float(float16_t(x)) to x in
// to_half.comp, which left lo 0. Written by ToHalf's HI and LO (W_hh) and the split forward's gates (h),
// multiplied by its SPLIT.
#ifndef CATCHAT_SPLIT_HALF_GLSL
#define CATCHAT_SPLIT_HALF_GLSL
#define SPLIT_SCALE 2048.0
float split_hi32(float v) {
    uint u = floatBitsToUint(v);
    if ((u & 0x7F800000u) < (113u << 23u)) return 0.0;  // |v| < 2^-14
    return uintBitsToFloat((u + 0xFFFu + ((u >> 13u) & 1u)) & 0xFFFFE000u);  // 13 low bits to nearest even
}
float16_t split_hi(float v) { return float16_t(split_hi32(v)); }  // exact: split_hi32 is a float16
float16_t split_lo(float v) { return float16_t((v - split_hi32(v)) * SPLIT_SCALE); }  // v - hi exact
#endif
