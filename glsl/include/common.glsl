// Shared helpers for catchat's compute shaders. Geometry arrives as specialization constants
// (constant_id 0 = workgroup size), shapes as push constants, per-step scalars in a buffer.
#ifndef CATCHAT_COMMON_GLSL
#define CATCHAT_COMMON_GLSL

// The counter-based RNG of docs/model.md, bit-identical to catchat.rng.mix32/rng_u32.
uint mix32(uint x) {
    x ^= x >> 16; x *= 0x7feb352du;
    x ^= x >> 15; x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
uint rng_u32(uint seed, uint stream, uint counter) { return mix32(mix32(mix32(counter) ^ stream) ^ seed); }
float rng_uniform(uint seed, uint stream, uint counter) { return float(rng_u32(seed, stream, counter) >> 8) * (1.0 / 16777216.0); }

uint ceil_div(uint a, uint b) { return (a + b - 1u) / b; }

// tanh that cannot produce NaN for large |a| (tanh(+-10) is +-1 in float32), and the sigmoid in
// catchat.reference's form.
float tanh_safe(float a) { return tanh(clamp(a, -10.0, 10.0)); }
float sigmoid(float a) { return 0.5 * (1.0 + tanh_safe(0.5 * a)); }

// A buffer that a persistent sweep (include/grid_sync.glsl) writes in one step and reads in the
// next from other workgroups of the same dispatch: coherent, so those reads bypass the
// non-coherent L1; nothing special in one-dispatch-per-step mode.
#ifdef PERSISTENT
#define SWEEP_COHERENT coherent
#else
#define SWEEP_COHERENT
#endif

// How the float16 streamed sweeps read W_hh's copy, which nothing writes during a sweep (W16_CACHE, a
// measurement knob: catchat/vk/kernels/gru/stream.py): 1 = readonly restrict, 2 = coherent (past L1).
#ifdef W16_CACHE
#if W16_CACHE == 1
#define W16_QUAL readonly restrict
#else
#define W16_QUAL coherent readonly
#endif
#else
#define W16_QUAL readonly
#endif

#endif
