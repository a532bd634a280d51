// Where each element of a 16 x 16 A operand block goes when the block is kept in its fragment's own
// order (a row-major load's): a_pos[row * 16 + col] = 8 i + e for element e of invocation i, as the
// driver holds them (VK_KHR_cooperative_matrix leaves it open; glsl/frag_order.comp does the same for
// copies of whole B blocks). A shader whose threads write such a block one element each (the streamed
// forward's gates, FRAG_H) calls a_pos_init first thing and writes element (row, col) of the block at
// `a_frag_at`; its product reads the block with include/sweep_frag.glsl's LOAD_A_FRAG. Included before
// sweep_frag.glsl, after include/coopmat_ext.glsl (real fragments). Emulated fragments (EMU): the block as
// it is, or with EMU_A_PERM (a test's: lavapipe compiles the emulated product's lookups slowly) a
// stand-in for a driver's order, so a real permutation runs: PTX's mma.m16n8k16 A layout (invocation
// (row % 8) * 4 + (col % 8) / 2, element col % 2 + 2 (row / 8) + 4 (col / 8)), which the emulated
// fragments then read through A_FRAG_POS.
#ifndef CATCHAT_A_ORDER_GLSL
#define CATCHAT_A_ORDER_GLSL
shared uint a_pos[256];

// the place of block element `at % 256` (`at` counted in halves from a block-aligned start)
uint a_frag_at(uint at) { return at - at % 256u + a_pos[at % 256u]; }

#ifdef EMU
#ifdef EMU_A_PERM
#define A_FRAG_POS(i) a_pos[i]
#endif
void a_pos_init(uint tid) {
    for (uint i = tid; i < 256u; i += gl_WorkGroupSize.x) {
#ifdef EMU_A_PERM
        uint r = i / 16u, c = i % 16u;
        a_pos[i] = ((r % 8u) * 4u + (c % 8u) / 2u) * 8u + c % 2u + 2u * (r / 8u) + 4u * (c / 8u);
#else
        a_pos[i] = i;
#endif
    }
    barrier();
}
#else
shared float16_t a_ids[256];

// the driver's own order: the numbers 0..255 (exact in float16) loaded as an A fragment by subgroup 0
void a_pos_init(uint tid) {
    for (uint i = tid; i < 256u; i += gl_WorkGroupSize.x) a_ids[i] = float16_t(i);
    barrier();
    if (tid < 32u) {
        CM_A m;
        CM_LOAD(m, a_ids, 0u, 16u, false);
        [[unroll]] for (uint e = 0u; e < 8u; ++e) a_pos[uint(m[e])] = tid * 8u + e;
    }
    barrier();
}
#endif
#endif
