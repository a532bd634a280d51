// Dropout scale shared by every shader that drops (embedding rows, hidden units).
// keep = rng_uniform(seed, stream, counter) >= p, exactly catchat.reference._keep (the uniform
// is exact in float32, so the comparison is bit-identical to numpy's).
// Streams (docs/model.md): 1 = embedding rows (counter = vocab row v),
//                          16 + layer = hidden units (counter = b * H + j).
#ifndef CATCHAT_DROPOUT_GLSL
#define CATCHAT_DROPOUT_GLSL
#include "common.glsl"

#define DROPOUT_STREAM_EMBEDDING 1u
#define DROPOUT_STREAM_HIDDEN 16u

bool dropout_keep(uint seed, uint stream, uint counter, float p) {
    return rng_uniform(seed, stream, counter) >= p;
}

// keep / (1 - p), or 0 when dropped; p = 0 gives exactly 1.
float dropout_scale(uint seed, uint stream, uint counter, float p) {
    return dropout_keep(seed, stream, counter, p) ? 1.0 / (1.0 - p) : 0.0;
}

#endif
