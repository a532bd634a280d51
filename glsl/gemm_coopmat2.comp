#version 450
// glsl/gemm.comp's product on workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2 with
// VK_KHR_cooperative_matrix: tensor cores, fed by the driver), float16 x float16 products with
// float32 accumulation:
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C[M,N] (+ bias[N])
// Same operands, transposes (TRANS_A, TRANS_B), push constants, split-K ranges and epilogue as
// gemm.comp and gemm_coopmat.comp, so catchat.vk.kernels.gemm.Gemm drives any of them. Operands are
// float16 in memory (offsets and leading dimensions in halves) or, with FLOAT_IN, float32 loaded as
// float32 matrices and converted to float16 in registers (train.precision = "fp16"). C and bias are
// float32; beta == 0 never reads C.
//
// Why this is short: a workgroup owns one BM x BN accumulator, a single matrix of the whole
// workgroup, and each k-slice of A and B is one matrix load through a tensor layout (the operand's
// extent, leading dimension and, for a transposed operand, a transposed view). How those loads are
// staged (through shared memory, asynchronously) and how the products are spread over the
// subgroups is the driver's, which knows the hardware's fastest path; gemm_coopmat.comp does all of
// that by hand on VK_NV_cooperative_matrix's subgroup fragments. A tile wholly inside the operands,
// at 16-byte aligned offsets and strides, loads through unclamped layouts in an unrolled k loop (the
// fast path of llama.cpp's mul_mm_cm2, which always clamping had cost). Any other tile clamps:
// elements outside [M, K] / [K, N] (and past the split's k range) load as zero; stores outside
// [M, N] are dropped, so any size, offset and leading dimension works.
// Needs SPIR-V 1.6 and a glslang that knows GL_NV_cooperative_matrix2 (catchat.vk.shaders compiles
// it with the newer compiler `make setup` fetches; Debian 12's glslc cannot).
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require

layout(local_size_x_id = 0) in;            // the workgroup size the driver's workgroup-scope matrices take
layout(constant_id = 1) const uint BM = 128;  // rows of C per workgroup
layout(constant_id = 2) const uint BN = 128;  // columns of C per workgroup
layout(constant_id = 3) const uint BK = 32;   // k-slice per product
// k-slices per iteration of the in-bounds loop, so the next slices' loads are issued before a product
// waits on the one before it (llama.cpp's mul_mm_cm2 unrolls 8; 1 until the H200 has timed more)
layout(constant_id = 4) const uint UNROLL = 1;
// 0: every tile takes the clamped loop (what the workgroup-scope GEMM measured first), for comparison
layout(constant_id = 5) const bool UNCLAMPED = true;

#ifdef FLOAT_IN
#define ELEM float
#else
#define ELEM float16_t
#endif
layout(set = 0, binding = 0) readonly buffer A_ { ELEM A[]; };  // op(A) [M,K] (TRANS_A: stored [K,M])
layout(set = 0, binding = 1) readonly buffer B_ { ELEM B[]; };  // op(B) [K,N] (TRANS_B: stored [N,K])
layout(set = 0, binding = 2) buffer C_ { float C[]; };          // [M,N] (split-K: [S,M,N])
#ifdef HAS_BIAS
layout(set = 0, binding = 3) readonly buffer Bias_ { float bias[]; };  // [N]
#endif

layout(push_constant) uniform Push {
    uint M, N, K;
    uint a_off, lda, b_off, ldb, c_off, ldc, bias_off;
    float alpha, beta;
    uint k_split;         // k-range per z (>= K when not split)
    uint c_split_stride;  // elements between the C blocks of consecutive z (0 when not split)
} pc;

#define CLAMP gl_CooperativeMatrixClampModeConstantNV
#define ACC coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>

#ifdef HAS_BIAS
// bias[n] added to column `col` of the workgroup's tile (columns past N are dropped by the store)
float add_bias(const in uint row, const in uint col, const in float v, const in uint n0) {
    uint n = min(n0 + col, pc.N - 1u);
    return v + bias[pc.bias_off + n];
}
#endif

// One k-slice of the product through layouts LA and LB (clamped or not), starting at k0.
#ifdef TRANS_A
#define LOAD_A(a, LA, A_OFF, k0) coopMatLoadTensorNV(a, A, A_OFF, sliceTensorLayoutNV(LA, k0, BK, m0, BM), transposed)
#else
#define LOAD_A(a, LA, A_OFF, k0) coopMatLoadTensorNV(a, A, A_OFF, sliceTensorLayoutNV(LA, m0, BM, k0, BK))
#endif
#ifdef TRANS_B
#define LOAD_B(b, LB, B_OFF, k0) coopMatLoadTensorNV(b, B, B_OFF, sliceTensorLayoutNV(LB, n0, BN, k0, BK), transposed)
#else
#define LOAD_B(b, LB, B_OFF, k0) coopMatLoadTensorNV(b, B, B_OFF, sliceTensorLayoutNV(LB, k0, BK, n0, BN))
#endif
#ifdef FLOAT_IN
// rounded to nearest even, as gemm.comp's ROUND_HALF and gemm_coopmat.comp's staging do
#define MUL_ADD(a, b) acc = coopMatMulAdd(coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>(a), \
                                          coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>(b), acc)
#else
#define MUL_ADD(a, b) acc = coopMatMulAdd(a, b, acc)
#endif
#define K_SLICE(LA, LB, A_OFF, B_OFF, k0) { \
    coopmat<ELEM, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a; \
    coopmat<ELEM, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b; \
    LOAD_A(a, LA, A_OFF, k0); \
    LOAD_B(b, LB, B_OFF, k0); \
    MUL_ADD(a, b); }

// Operand dimensions as stored: rows x columns of A and B, the k extent cut at the split's end.
#ifdef TRANS_A
#define A_DIMS(k_end) k_end, pc.M
#else
#define A_DIMS(k_end) pc.M, k_end
#endif
#ifdef TRANS_B
#define B_DIMS(k_end) pc.N, k_end
#else
#define B_DIMS(k_end) k_end, pc.N
#endif

void main() {
    uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN, z = gl_WorkGroupID.z;
    uint k_begin = z * pc.k_split;
    uint k_end = min(pc.K, k_begin + pc.k_split);
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);
    ACC acc = ACC(0.0);

    // The fast path, llama.cpp's: where the tile and every k-slice lie inside the operands and the
    // offsets and strides are whole 16-byte groups, the loads need no bounds checks (an unclamped
    // layout), the masks tell the compiler the alignment, and the k loop is unrolled.
    bool aligned = ((pc.a_off | pc.lda | pc.b_off | pc.ldb) & 7u) == 0u;
    if (UNCLAMPED && m0 + BM <= pc.M && n0 + BN <= pc.N && (k_end - k_begin) % BK == 0u && aligned) {
        uint a_off = pc.a_off & ~7u, b_off = pc.b_off & ~7u;
        tensorLayoutNV<2> uA = createTensorLayoutNV(2);
        tensorLayoutNV<2> uB = createTensorLayoutNV(2);
        uA = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(uA, A_DIMS(k_end)), pc.lda & ~7u, 1);
        uB = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(uB, B_DIMS(k_end)), pc.ldb & ~7u, 1);
        uint k0 = k_begin;
        for (; k0 + UNROLL * BK <= k_end; k0 += UNROLL * BK) {
            [[unroll]] for (uint j = 0; j < UNROLL; ++j) K_SLICE(uA, uB, a_off, b_off, k0 + j * BK)
        }
        for (; k0 < k_end; k0 += BK) K_SLICE(uA, uB, a_off, b_off, k0)
    } else {
        // Clamped layouts: elements outside the operands (and past the split's k range) load as zero.
        tensorLayoutNV<2, CLAMP> tA = createTensorLayoutNV(2, CLAMP);
        tensorLayoutNV<2, CLAMP> tB = createTensorLayoutNV(2, CLAMP);
        tA = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(tA, A_DIMS(k_end)), pc.lda, 1);
        tB = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(tB, B_DIMS(k_end)), pc.ldb, 1);
        for (uint k0 = k_begin; k0 < k_end; k0 += BK) K_SLICE(tA, tB, pc.a_off, pc.b_off, k0)
    }

    // Epilogue: alpha * acc (+ beta * C) (+ bias), stored through C's layout (clamped to [M, N]).
    tensorLayoutNV<2, CLAMP> tC = createTensorLayoutNV(2, CLAMP);
    tC = setTensorLayoutDimensionNV(tC, pc.M, pc.N);
    tC = setTensorLayoutStrideNV(tC, pc.ldc, 1);
    uint c_base = pc.c_off + z * pc.c_split_stride;
    if (pc.alpha != 1.0) acc = acc * pc.alpha;
    if (pc.beta != 0.0) {
        ACC c;
        coopMatLoadTensorNV(c, C, c_base, sliceTensorLayoutNV(tC, m0, BM, n0, BN));
        acc = acc + c * pc.beta;
    }
#ifdef HAS_BIAS
    coopMatPerElementNV(acc, acc, add_bias, n0);
#endif
    coopMatStoreTensorNV(acc, C, c_base, sliceTensorLayoutNV(tC, m0, BM, n0, BN));
}
