// glsl/include/gemm_coopmat.glsl's fragments emulated (EMU) for devices without cooperative matrices
// (lavapipe runs the kernel's staging, split and epilogue in the tests), in include/sweep_frag.glsl's
// layout: an operand fragment is a FragRef to its 16 x 16 block in the shared array `smem` (8-byte words
// of 4 halves), read when it is multiplied; an accumulator is 8 floats of an invocation of a virtual
// subgroup of 32. Included after `smem`.
#ifndef CATCHAT_GEMM_COOPMAT_EMU_GLSL
#define CATCHAT_GEMM_COOPMAT_EMU_GLSL

// Element i of the shared array counted in halves (4 a word, packFloat2x16's order).
float emu_half(uint i) {
    uvec2 w = smem[i >> 2u];
    return unpackHalf2x16((i & 2u) != 0u ? w.y : w.x)[i & 1u];
}

// Element (row, col) of an operand block.
float emu_at(FragRef m, uint row, uint col) {
    return emu_half(m.col ? m.off + col * m.stride + row : m.off + row * m.stride + col);
}

Acc emu_zero() { return Acc(float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)); }

// Invocation l of a virtual subgroup of 32 holds row l / 2, columns (l % 2) * 8 .. +7; sums in k order.
Acc emu_mul_add(FragRef a, FragRef b, Acc c) {
    uint lane = gl_LocalInvocationIndex % 32u, row = lane / 2u, c0 = (lane % 2u) * 8u;
    for (uint e = 0u; e < 8u; ++e) {
        float s = c.v[e];
        for (uint k = 0u; k < 16u; ++k) s += emu_at(a, row, k) * emu_at(b, k, c0 + e);
        c.v[e] = s;
    }
    return c;
}

#ifdef SPLIT
Acc emu_scale(Acc a, float s) {
    for (uint e = 0u; e < 8u; ++e) a.v[e] *= s;
    return a;
}
#endif

// Row-major at word `off` with a row pitch of `stride` words (2 floats a word).
void emu_store(Acc c, uint off, uint stride) {
    uint lane = gl_LocalInvocationIndex % 32u, f = 2u * off + (lane / 2u) * 2u * stride + (lane % 2u) * 8u;
    for (uint e = 0u; e < 8u; ++e) smem[(f + e) >> 1u][(f + e) & 1u] = floatBitsToUint(c.v[e]);
}

#endif
