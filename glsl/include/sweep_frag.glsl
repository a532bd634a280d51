// 16 x 16 fragments of the streamed sweeps (glsl/gru_*_stream.comp): float16 A and B operands
// loaded from storage buffers, float32 accumulators summed through shared memory. Real ones are
// cooperative-matrix fragments (tensor cores, subgroups of 32) on VK_NV_cooperative_matrix, or with KHR
// on VK_KHR_cooperative_matrix: include/coopmat_ext.glsl's types, which the includer enables before
// this file. With EMU they are emulated
// for devices without cooperative matrices (lavapipe: the tests run the sweeps' logic there):
// an operand fragment is only where its 16 x 16 block lies (offset, stride, layout), read when it
// is multiplied (the sweeps never write an operand between its load and its product), and an
// accumulator is 8 floats per invocation of a virtual subgroup of 32 (invocation l holds row
// l / 2, columns (l % 2) * 8 .. +7), so no subgroup operation is needed and any real subgroup size
// works. The sums of a product run in k order in float32 (the hardware's order is its own).
// The includer defines A_BUF and B_BUF (float16_t arrays the A and B operands are loaded from) and
// ACC_SHARED (the shared float array accumulators are stored to and loaded from); emulated, B_AT_REF(b, row,
// col) where the includer reads B operands itself (then B_BUF is never read); and B_SHARED (a
// shared float16_t array) where B operands also come from shared memory (LOAD_B_SHARED), A_SHARED
// likewise for A operands (LOAD_A_SHARED). ACC_STORE_BUF stores an accumulator into a float buffer.
// LOAD_B_FRAG loads a B operand from a copy in fragment order (glsl/frag_order.comp: one 16-byte load an
// invocation), at off halves of B_BUF, whose uvec4 view the includer names B_BUF_Q; LOAD_A_FRAG an A
// operand likewise from A_BUF_Q (a row-major load's order; emulated: the includer's A_FRAG_POS order where it
// defines one, else the block as it is).
#ifndef CATCHAT_SWEEP_FRAG_GLSL
#define CATCHAT_SWEEP_FRAG_GLSL

#ifdef EMU
struct FragRef { uint off; uint stride; bool col; bool sh; };  // sh: in B_SHARED (A: A_SHARED)
struct Acc { float v[8]; };
#define FRAG_A FragRef
#define FRAG_B FragRef
#define ACC_T Acc
#define LOAD_A(m, off, stride, col) m = FragRef(off, stride, col, false)
#define LOAD_B(m, off, stride, col) m = FragRef(off, stride, col, false)
#define LOAD_B_SHARED(m, off, stride, col) m = FragRef(off, stride, col, true)
#define LOAD_A_SHARED(m, off, stride, col) m = FragRef(off, stride, col, true)
#define LOAD_B_FRAG(m, off) m = FragRef(off, 16u, false, false)  // fragment order: the operand row-major
#ifdef A_FRAG_POS  // the includer's order of an A fragment's elements (logical i = row * 16 + col -> place)
#define LOAD_A_FRAG(m, off) m = FragRef(off, 0u, false, false)  // stride 0: in that order
#else
#define LOAD_A_FRAG(m, off) m = FragRef(off, 16u, false, false)
#endif

Acc acc_zero() { return Acc(float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)); }

// Element (row, col) of an operand block: row-major at off + row * stride + col, column-major at
// off + col * stride + row.
uint frag_index(FragRef m, uint row, uint col) {
#ifdef A_FRAG_POS
    if (m.stride == 0u) return m.off + A_FRAG_POS(row * 16u + col);
#endif
    return m.col ? m.off + col * m.stride + row : m.off + row * m.stride + col;
}

float b_at(FragRef b, uint row, uint col) {
#ifdef B_AT_REF  // the includer reads B operands its own way (e.g. from float32 weights, rounded)
    return B_AT_REF(b, row, col);
#else
#ifdef B_SHARED
#ifndef B_SHARED_AT  // element i of B_SHARED, counted in halves (the includer may pack them)
#define B_SHARED_AT(i) float(B_SHARED[i])
#endif
    if (b.sh) return B_SHARED_AT(frag_index(b, row, col));
#endif
    return float(B_BUF[frag_index(b, row, col)]);
#endif
}

#ifdef A_SHARED
#ifndef A_SHARED_AT  // element i of A_SHARED, counted in halves (the includer may pack them)
#define A_SHARED_AT(i) float(A_SHARED[i])
#endif
#define A_AT(a, row, col) ((a).sh ? A_SHARED_AT(frag_index(a, row, col)) : float(A_BUF[frag_index(a, row, col)]))
#else
#define A_AT(a, row, col) float(A_BUF[frag_index(a, row, col)])
#endif

Acc mul_add(FragRef a, FragRef b, Acc c) {
    uint lane = gl_LocalInvocationIndex % 32u, row = lane / 2u, c0 = (lane % 2u) * 8u;
    for (uint e = 0u; e < 8u; ++e) {
        float s = c.v[e];
        for (uint k = 0u; k < 16u; ++k) s += A_AT(a, row, k) * b_at(b, k, c0 + e);
        c.v[e] = s;
    }
    return c;
}

Acc acc_add(Acc a, Acc b) {
    for (uint e = 0u; e < 8u; ++e) a.v[e] += b.v[e];
    return a;
}

Acc acc_scale(Acc a, float s) {
    for (uint e = 0u; e < 8u; ++e) a.v[e] *= s;
    return a;
}

// Row-major at off with this row stride, in ACC_SHARED.
void acc_store(Acc c, uint off, uint stride) {
    uint lane = gl_LocalInvocationIndex % 32u, base = off + (lane / 2u) * stride + (lane % 2u) * 8u;
    for (uint e = 0u; e < 8u; ++e) ACC_SHARED[base + e] = c.v[e];
}

Acc acc_load(uint off, uint stride) {
    uint lane = gl_LocalInvocationIndex % 32u, base = off + (lane / 2u) * stride + (lane % 2u) * 8u;
    Acc c;
    for (uint e = 0u; e < 8u; ++e) c.v[e] = ACC_SHARED[base + e];
    return c;
}

#define ACC_ZERO() acc_zero()
#define MUL_ADD(a, b, c) mul_add(a, b, c)
#define ACC_ADD(a, b) acc_add(a, b)
#define ACC_SCALE(a, s) acc_scale(a, s)
#define ACC_ADD_SCALED(a, b, s) a = acc_add(a, acc_scale(b, s))
#define ACC_STORE(m, off, stride) acc_store(m, off, stride)
#define ACC_LOAD(m, off, stride) m = acc_load(off, stride)
#define ACC_STORE_BUF(m, BUF, off, stride) { \
    uint l_ = gl_LocalInvocationIndex % 32u, at_ = (off) + (l_ / 2u) * (stride) + (l_ % 2u) * 8u; \
    for (uint e_ = 0u; e_ < 8u; ++e_) BUF[at_ + e_] = (m).v[e_]; }
#else  // real fragments, on the extension include/coopmat_ext.glsl enabled (its CM_ types and operations)
#define FRAG_A CM_A
#define FRAG_B CM_B
#define ACC_T CM_ACC
#define LOAD_A(m, off, stride, col) CM_LOAD(m, A_BUF, off, stride, col)
#define LOAD_B(m, off, stride, col) CM_LOAD(m, B_BUF, off, stride, col)
#define LOAD_B_SHARED(m, off, stride, col) CM_LOAD(m, B_SHARED, off, stride, col)
#define LOAD_A_SHARED(m, off, stride, col) CM_LOAD(m, A_SHARED, off, stride, col)
// invocation i's 8 elements at 8 i of the block (subgroups of 32 in invocation order, as everywhere here)
#define LOAD_B_FRAG(m, off) CM_FROM_WORDS(m, B_BUF_Q[(off) / 8u + gl_LocalInvocationIndex % 32u])
#define LOAD_A_FRAG(m, off) CM_FROM_WORDS(m, A_BUF_Q[(off) / 8u + gl_LocalInvocationIndex % 32u])
#define ACC_ZERO() ACC_T(0.0)
#define MUL_ADD(a, b, c) CM_MULADD(a, b, c)
#define ACC_ADD(a, b) ((a) + (b))
#define ACC_SCALE(a, s) ((a) * float(s))
// a += b * s element by element (both of one type, so one layout): the same sums as ACC_ADD(a, ACC_SCALE(b, s)),
// which Debian 12's glslc (2023.2) crashed optimizing on NV fragments in gru_forward_resident.comp's SPLIT
#define ACC_ADD_SCALED(a, b, s) for (int i_ = 0; i_ < (a).length(); ++i_) (a)[i_] += (b)[i_] * float(s)
#define ACC_STORE(m, off, stride) CM_STORE(m, ACC_SHARED, off, stride, false)
#define ACC_LOAD(m, off, stride) CM_LOAD(m, ACC_SHARED, off, stride, false)
#define ACC_STORE_BUF(m, BUF, off, stride) CM_STORE(m, BUF, off, stride, false)
#endif

#ifndef FRAG_ONLY  // the sweeps' layouts (an includer with its own, e.g. decode_layer_coop.comp, defines FRAG_ONLY)
// The float16 shadows of h_prev and dGh (the A operands): [2 parities][LF lane fragments][cols / 16]
// blocks of 16 lanes x 16 columns, each 512 contiguous bytes, row-major inside (a fragment is one
// run of memory: loaded row by row at stride `cols` they were what bounded the sweeps). Element
// (lane b, column c) of parity p, and fragment kf of lane fragment lf (stride 16); LF is the includer's.
uint shadow_at(uint p, uint b, uint c, uint cols) {
    return ((p * LF + b / 16u) * (cols / 16u) + c / 16u) * 256u + (b % 16u) * 16u + c % 16u;
}
uint shadow_frag(uint p, uint lf, uint kf, uint cols) { return ((p * LF + lf) * (cols / 16u) + kf) * 256u; }
#ifdef FRAG_H  // a shadow block in its A fragment's order (include/a_order.glsl), else row-major
#define LOAD_SHADOW(m, off) LOAD_A_FRAG(m, off)
#else
#define LOAD_SHADOW(m, off) LOAD_A(m, off, 16u, false)
#endif

// W_hh's 16 x 16 block at rows r0, columns c0 (multiples of 16) in the float16 copy w16 at pc.w_off:
// where it starts, and W_LD, the stride of its rows. BLOCKED_W: the copy holds W_hh as 16 x 16
// blocks of 512 contiguous bytes (block (R, C) at (R * H/16 + C) * 256, row-major inside), so a
// fragment load reads one run of memory; else row-major [3H][H]. The includer's push constants
// hold w_off and H.
#ifdef BLOCKED_W
uint w_block(uint r0, uint c0) { return pc.w_off + ((r0 / 16u) * (pc.H / 16u) + c0 / 16u) * 256u; }
#define W_LD 16u
#else
uint w_block(uint r0, uint c0) { return pc.w_off + r0 * pc.H + c0; }
#define W_LD pc.H
#endif
#ifdef FRAG_W  // the copy's blocks in the fragment order of the load they were made for (glsl/frag_order.comp)
#define LOAD_W_BLOCK(m, off, col) LOAD_B_FRAG(m, off)
#else
#define LOAD_W_BLOCK(m, off, col) LOAD_B(m, off, W_LD, col)
#endif

#ifdef B_SHARED
// W_hh's 16 x 16 block at rows r0, columns c0 into B_SHARED at dst, row-major (stride 16), by the 32
// invocations of a subgroup (lane = the caller's index in it); the caller syncs before any reads it.
void w_block_to_shared(uint r0, uint c0, uint dst, uint lane) {
    uint src = w_block(r0, c0);
    for (uint e = lane; e < 256u; e += 32u) B_SHARED[dst + e] = B_BUF[src + (e / 16u) * W_LD + e % 16u];
}
#endif
#endif  // FRAG_ONLY
#endif
