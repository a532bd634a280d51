// float32 as two float16 parts, x = hi + lo / SPLIT_SCALE: hi = float16(x), lo = what hi left out,
// scaled into float16's range (catchat/vk/kernels/gru/stream.py's SPLIT_SCALE and split_halves, its
// twin). Written by ToHalf's LO (W_hh) and the split forward's gates (h), multiplied by its SPLIT.
#ifndef CATCHAT_SPLIT_HALF_GLSL
#define CATCHAT_SPLIT_HALF_GLSL
#define SPLIT_SCALE 2048.0
float16_t split_lo(float v) { return float16_t((v - float(float16_t(v))) * SPLIT_SCALE); }
#endif
