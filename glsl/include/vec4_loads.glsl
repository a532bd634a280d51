// VEC4 (H % 4 == 0, every offset a multiple of 4): lanes read 4 consecutive k at once as a vec4
// (VT), W floats per k step, DOT their products' sum; else one float per k step.
#ifndef CATCHAT_VEC4_LOADS_GLSL
#define CATCHAT_VEC4_LOADS_GLSL
#ifdef VEC4
#define VT vec4
#define DOT(a, b) dot(a, b)
const uint W = 4u;
#else
#define VT float
#define DOT(a, b) ((a) * (b))
const uint W = 1u;
#endif
#endif
