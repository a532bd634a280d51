// float32 as two float16 parts, x = hi + lo / SPLIT_SCALE: hi = float16(x) (the store's rounding, to
// nearest even), lo = what hi left out, scaled into float16's range (catchat/vk/kernels/gru/stream.py's
// SPLIT_SCALE and split_halves, its twin). lo takes hi from round_half.glsl, not from float(float16_t(x)):
// NVIDIA's compiler (580.159) folded that round trip to x in to_half.comp and left lo 0. Written by
// ToHalf's LO (W_hh) and the split forward's gates (h), multiplied by its SPLIT.
#ifndef CATCHAT_SPLIT_HALF_GLSL
#define CATCHAT_SPLIT_HALF_GLSL
#include "round_half.glsl"
#define SPLIT_SCALE 2048.0
float16_t split_lo(float v) { return float16_t((v - round_half(v)) * SPLIT_SCALE); }  // v - hi is exact
#endif
