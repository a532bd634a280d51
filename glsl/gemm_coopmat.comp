#version 450
// glsl/gemm.comp's product on cooperative matrices (VK_NV_cooperative_matrix: tensor cores on
// NVIDIA), for float16 operands with float32 accumulation:
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C[M,N] (+ bias[N])
// Same operands, transposes (TRANS_A, TRANS_B), push constants, split-K ranges and epilogue as
// gemm.comp's HALF variant (A and B float16 with offsets and leading dimensions in halves; C and
// bias float32; beta == 0 never reads C), so catchat.vk.kernels.gemm.Gemm drives either.
// Work split: a workgroup owns a BM x BN tile of C, BM = WM * FM * 16 and BN = WN * FN * 16: WM x WN
// subgroups, each FM x FN fragments of 16 x 16 accumulators. Per k-slice of BK, every thread stages
// op(A) [BM][BK] and op(B) [BK][BN] as float16 in shared memory (zero outside the matrix, so any
// M, N, K and offset work), then each subgroup multiplies its fragments 16 deep at a time. At the
// end the accumulators go through shared memory to the epilogue, which bounds-checks each element.
// The order of the sums inside a 16-deep fragment product is the hardware's: results match the
// float64 twin to float32 accumulation error, not bit for bit across devices.
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x_id = 0) in;          // WM * WN * subgroup size threads
layout(constant_id = 1) const uint WM = 2;  // subgroups along m
layout(constant_id = 2) const uint WN = 2;  // subgroups along n
layout(constant_id = 3) const uint FM = 2;  // 16-row fragments per subgroup
layout(constant_id = 4) const uint FN = 2;  // 16-column fragments per subgroup
layout(constant_id = 5) const uint BK = 32; // k-slice staged per iteration (a multiple of 16)

layout(set = 0, binding = 0) readonly buffer A_ { float16_t A[]; };  // op(A) [M,K]
layout(set = 0, binding = 1) readonly buffer B_ { float16_t B[]; };  // op(B) [K,N]
layout(set = 0, binding = 2) buffer C_ { float C[]; };               // [M,N] (split-K: [S,M,N])
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

const uint BM = WM * FM * 16;
const uint BN = WN * FN * 16;
const uint SA = BK + 8;  // shared row strides in halves: 16-byte multiples (fragment loads need
const uint SB = BN + 8;  // 16-byte alignment), padded against bank conflicts
const uint SC = BN + 4;  // the accumulators' rows, in floats
shared float16_t As[BM * SA];  // op(A) slice [BM][BK]
shared float16_t Bs[BK * SB];  // op(B) slice [BK][BN]
shared float Cs[BM * SC];      // the tile's sums, for the epilogue

float16_t load_a(uint m, uint k, uint k_end) {
    if (m >= pc.M || k >= k_end) return float16_t(0.0);
#ifdef TRANS_A
    return A[pc.a_off + k * pc.lda + m];
#else
    return A[pc.a_off + m * pc.lda + k];
#endif
}

float16_t load_b(uint k, uint n, uint k_end) {
    if (n >= pc.N || k >= k_end) return float16_t(0.0);
#ifdef TRANS_B
    return B[pc.b_off + n * pc.ldb + k];
#else
    return B[pc.b_off + k * pc.ldb + n];
#endif
}

void main() {
    uint tid = gl_LocalInvocationID.x, threads = gl_WorkGroupSize.x;
    uint sg = gl_SubgroupID, wm = sg / WN, wn = sg % WN;
    uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN, z = gl_WorkGroupID.z;
    uint k_begin = z * pc.k_split;
    uint k_end = min(pc.K, k_begin + pc.k_split);

    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
    [[unroll]] for (uint i = 0; i < FM; ++i)
        [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);

    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        // consecutive threads walk each operand's contiguous direction in global memory
        for (uint e = tid; e < BM * BK; e += threads) {
#ifdef TRANS_A
            uint m = e % BM, k = e / BM;
#else
            uint m = e / BK, k = e % BK;
#endif
            As[m * SA + k] = load_a(m0 + m, k0 + k, k_end);
        }
        for (uint e = tid; e < BK * BN; e += threads) {
#ifdef TRANS_B
            uint k = e % BK, n = e / BK;
#else
            uint k = e / BN, n = e % BN;
#endif
            Bs[k * SB + n] = load_b(k0 + k, n0 + n, k_end);
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {
            fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[FM], fb[FN];
            [[unroll]] for (uint i = 0; i < FM; ++i)
                coopMatLoadNV(fa[i], As, ((wm * FM + i) * 16) * SA + kk, SA, false);
            [[unroll]] for (uint j = 0; j < FN; ++j)
                coopMatLoadNV(fb[j], Bs, kk * SB + (wn * FN + j) * 16, SB, false);
            [[unroll]] for (uint i = 0; i < FM; ++i)
                [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]);
        }
        barrier();  // the next slice overwrites As / Bs
    }

    [[unroll]] for (uint i = 0; i < FM; ++i)
        [[unroll]] for (uint j = 0; j < FN; ++j)
            coopMatStoreNV(acc[i][j], Cs, ((wm * FM + i) * 16) * SC + (wn * FN + j) * 16, SC, false);
    barrier();
    for (uint e = tid; e < BM * BN; e += threads) {
        uint m = m0 + e / BN, n = n0 + e % BN;
        if (m >= pc.M || n >= pc.N) continue;
        uint idx = pc.c_off + z * pc.c_split_stride + m * pc.ldc + n;
        float v = pc.alpha * Cs[(e / BN) * SC + e % BN];
        if (pc.beta != 0.0) v += pc.beta * C[idx];
#ifdef HAS_BIAS
        v += bias[pc.bias_off + n];
#endif
        C[idx] = v;
    }
}
