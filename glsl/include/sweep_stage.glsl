// Staging of a streamed sweep's A operand (glsl/gru_*_stream.comp with STAGE_A): chunk c of its BP
// rows, k in [c * CK, +CK), copied from the uvec4 view A_SRC4 of its float16 shadow into buffer
// `buf` of `smem` ([2][BP][CK] halves, 4 to a uvec2), 16 bytes a thread at a time: coherent vector
// loads, then fragment loads from shared memory, instead of every fragment from memory.
#ifndef CATCHAT_SWEEP_STAGE_GLSL
#define CATCHAT_SWEEP_STAGE_GLSL
// src0: the shadow's first half of row 0; row_len: halves between rows (both multiples of 8).
void stage_chunk(uint src0, uint row_len, uint c, uint buf) {
    const uint QR = CK / 8u;  // uvec4 per staged row
    for (uint e = gl_LocalInvocationIndex; e < BP * QR; e += gl_WorkGroupSize.x) {
        uint row = e / QR, q = e % QR;
        uvec4 v = A_SRC4[(src0 + row * row_len + c * CK) / 8u + q];
        uint d = (buf * BP + row) * (CK / 4u) + 2u * q;
        smem[d] = v.xy;
        smem[d + 1u] = v.zw;
    }
}
#endif
