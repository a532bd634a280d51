// The register-resident tensor-core sweeps' fragments (gru_forward_resident.comp and
// gru_backward_resident.comp, COOP): include/sweep_frag.glsl's, real or emulated (EMU: lavapipe, where
// the tests run these sweeps' logic). Real W_hh fragments are loaded once a sweep from params through a
// shared scratch, rounded to float16 as stored; an emulated one refers to its block of params
// (`w_frag_ref`) and rounds each element as the product reads it, so both multiply the same float16
// operands. The includer declares params, pc (H, w_off) and the shared arrays, and defines A_SHARED (the
// A operands' shared float16 array) and ACC_SHARED (the accumulators' shared float array) first.
#ifndef CATCHAT_RESIDENT_FRAG_GLSL
#define CATCHAT_RESIDENT_FRAG_GLSL
#define FRAG_ONLY
#define A_BUF A_SHARED  // emulated A operands are read through A_SHARED (LOAD_A_SHARED); real ones never name it
#ifdef EMU
// An emulated W_hh block: rows r .. r + 15, columns c0 .. c0 + 15 of W_hh [3H, H] (packed as r * 65536 + c0:
// emulation runs H < 21845), the operand's element (row, col) the block's (row, col), or (col, row)
// transposed (col: the product's B is W_hh^T); lo: SPLIT's lo part of each element (include/split_half.glsl,
// which the includer includes for SPLIT), else float16(x). Elements past a gate's H units or past column H are 0.
#define W_FRAG_REF(r, c0, col, lo) FragRef((r) * 65536u + (c0), 0u, col, lo)
float w16_element(uint ref, uint wr, uint wc, bool lo) {
    uint r = ref >> 16u, c = (ref & 0xFFFFu) + wc;
    if (r % pc.H + wr >= pc.H || c >= pc.H) return 0.0;
    float x = params[pc.w_off + (r + wr) * pc.H + c];
#ifdef SPLIT
    if (lo) return float(split_lo(x));
#endif
    return float(float16_t(x));
}
#define B_AT_REF(b, row, col) w16_element((b).off, (b).col ? (col) : (row), (b).col ? (row) : (col), (b).sh)
#define B_BUF A_SHARED  // never read: B_AT_REF reads every B operand
#endif
#include "sweep_frag.glsl"
#endif
