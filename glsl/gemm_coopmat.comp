#version 450
// glsl/gemm.comp's product on cooperative matrices (VK_NV_cooperative_matrix: tensor cores on
// NVIDIA), float16 x float16 products with float32 accumulation:
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C[M,N] (+ bias[N])
// Same operands, transposes (TRANS_A, TRANS_B), push constants, split-K ranges and epilogue as
// gemm.comp, so catchat.vk.kernels.gemm.Gemm drives either. The operands are float16 in memory
// (gemm.comp's HALF: offsets and leading dimensions in halves) or, with FLOAT_IN, float32 rounded to
// float16 as they are staged (train.precision = "fp16": the weights and activations stay float32
// and only the products take float16 inputs). C and bias are float32; beta == 0 never reads C.
// Work split: a workgroup owns a BM x BN tile of C, BM = WM * FM * 16 and BN = WN * FN * 16: WM x WN
// subgroups, each FM x FN fragments of 16 x 16 accumulators. Per k-slice of BK, the threads load
// op(A) [BM][BK] and op(B) [BK][BN] from global memory into registers (VEC4_A / VEC4_B: 4 elements
// at a time along the operand's contiguous direction, as in gemm.comp), round them to float16 and
// store them into shared memory in that same direction (A stored [M,K] is staged m-major, [K,M]
// k-major, and its fragments are loaded row- or column-major to match), zero outside the matrix, so
// any M, N, K and offset work. Shared slices are double-buffered and the next slice's loads are in
// flight while the subgroups multiply the current one (PREFETCH2: the next two slices', in two
// register sets, so that each load has two multiplications' time to land). The epilogue goes fragment by fragment
// through a 16 x 16 scratch per subgroup, bounds-checking each element.
// The order of the sums inside a 16-deep fragment product is the hardware's: results match the
// float64 twin (of float16-rounded operands) to float32 accumulation error, not bit for bit.
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_shader_subgroup_basic : require

layout(local_size_x_id = 0) in;          // WM * WN * subgroup size threads
layout(constant_id = 1) const uint WM = 2;  // subgroups along m
layout(constant_id = 2) const uint WN = 4;  // subgroups along n
layout(constant_id = 3) const uint FM = 4;  // 16-row fragments per subgroup
layout(constant_id = 4) const uint FN = 2;  // 16-column fragments per subgroup
layout(constant_id = 5) const uint BK = 32; // k-slice staged per iteration (a multiple of 16)

#ifdef VEC4_A
#define AW 4
#else
#define AW 1
#endif
#ifdef VEC4_B
#define BW 4
#else
#define BW 1
#endif
#ifdef FLOAT_IN  // the operands' element types in memory
#define ET float
#define ET4 vec4
#else
#define ET float16_t
#define ET4 f16vec4
#endif
#if AW == 4
#define AS ET4
#else
#define AS ET
#endif
#if BW == 4
#define BS ET4
#else
#define BS ET
#endif
#define AT f16vec4  // a load in registers, already float16 (AW of its lanes used)
#define BT f16vec4

layout(set = 0, binding = 0) readonly buffer A_ { AS A[]; };  // op(A) [M,K]
layout(set = 0, binding = 1) readonly buffer B_ { BS B[]; };  // op(B) [K,N]
layout(set = 0, binding = 2) buffer C_ { float C[]; };        // [M,N] (split-K: [S,M,N])
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

const uint SG = 32;  // subgroup size: NVIDIA's (the host runs this shader only there)
const uint NT = WM * WN * SG;
const uint BM = WM * FM * 16;
const uint BN = WN * FN * 16;
// Shared slices, laid out along each operand's contiguous direction in memory; row strides in
// halves are padded by 8 (16 bytes: fragment loads need 16-byte aligned rows; the pad spreads banks).
#ifdef TRANS_A
const uint SA = BM + 8;  // As[k][m]: A stored [K,M]
const uint A_WORDS = BK * SA;
#else
const uint SA = BK + 8;  // As[m][k]
const uint A_WORDS = BM * SA;
#endif
#ifdef TRANS_B
const uint SB = BK + 8;  // Bs[n][k]: B stored [N,K]
const uint B_WORDS = BN * SB;
#else
const uint SB = BN + 8;  // Bs[k][n]
const uint B_WORDS = BK * SB;
#endif
const uint SC = 16 + 4;  // a subgroup's epilogue fragment rows, in floats
shared float16_t As[2 * A_WORDS];
shared float16_t Bs[2 * B_WORDS];
shared float Cs[WM * WN * 16 * SC];

const uint NA = BM * BK / AW;  // loads of an A / B slice
const uint NB = BK * BN / BW;
const uint LA = (NA + NT - 1) / NT;  // ... per thread
const uint LB = (NB + NT - 1) / NT;
AT ra0[LA];  // a slice in flight from global memory (PREFETCH2: two, in turn)
BT rb0[LB];
#ifdef PREFETCH2
AT ra1[LA];
BT rb1[LB];
#endif

// Load i of a slice -> (row m, first k) of op(A) / (first k, col n) of op(B); consecutive threads
// walk the operand's contiguous direction in global memory.
uvec2 a_at(uint i) {
#ifdef TRANS_A
    return uvec2(AW * (i % (BM / AW)), i / (BM / AW));
#else
    return uvec2(i / (BK / AW), AW * (i % (BK / AW)));
#endif
}
uvec2 b_at(uint i) {
#ifdef TRANS_B
    return uvec2(BW * (i % (BK / BW)), i / (BK / BW));
#else
    return uvec2(i / (BN / BW), BW * (i % (BN / BW)));
#endif
}

AT load_a(uint m, uint k, uint k_end) {
    if (m >= pc.M || k >= k_end) return AT(0.0);
#ifdef TRANS_A
    uint at = pc.a_off + k * pc.lda + m;
#else
    uint at = pc.a_off + m * pc.lda + k;
#endif
#if AW == 4
    return AT(A[at / 4]);
#else
    return AT(float16_t(A[at]), 0.0, 0.0, 0.0);
#endif
}
BT load_b(uint k, uint n, uint k_end) {
    if (n >= pc.N || k >= k_end) return BT(0.0);
#ifdef TRANS_B
    uint at = pc.b_off + n * pc.ldb + k;
#else
    uint at = pc.b_off + k * pc.ldb + n;
#endif
#if BW == 4
    return BT(B[at / 4]);
#else
    return BT(float16_t(B[at]), 0.0, 0.0, 0.0);
#endif
}

// Registers -> shared: the AW (BW) halves of a load are contiguous in the staged layout too.
void put_a(uint base, uvec2 mk, AT v) {
#ifdef TRANS_A
    uint at = base + mk.y * SA + mk.x;
#else
    uint at = base + mk.x * SA + mk.y;
#endif
    [[unroll]] for (uint e = 0; e < AW; ++e) As[at + e] = v[e];
}
void put_b(uint base, uvec2 kn, BT v) {
#ifdef TRANS_B
    uint at = base + kn.y * SB + kn.x;
#else
    uint at = base + kn.x * SB + kn.y;
#endif
    [[unroll]] for (uint e = 0; e < BW; ++e) Bs[at + e] = v[e];
}

// Global -> the register set (RA, RB): the slice at K0 of the tile (m0, n0).
// Diagnostics only (tools/bench_gemm.py --probe), to see where the time goes: PROBE_NO_GLOBAL
// stages made-up values instead of loading the operands; PROBE_MMA_ONLY also skips the stores to
// shared memory (the fragment loads, products and barriers alone). Their results are meaningless.
#if defined(PROBE_NO_GLOBAL) || defined(PROBE_MMA_ONLY)
#define FETCH(RA, RB, K0) { \
    [[unroll]] for (uint l = 0; l < LA; ++l) RA[l] = AT(float16_t(float(tid + l + (K0)))); \
    [[unroll]] for (uint l = 0; l < LB; ++l) RB[l] = BT(float16_t(float(m0 + l + (K0)))); }
#else
#define FETCH(RA, RB, K0) { \
    [[unroll]] for (uint l = 0; l < LA; ++l) { \
        uint i = tid + l * NT; \
        uvec2 mk = a_at(i); \
        RA[l] = i < NA ? load_a(m0 + mk.x, (K0) + mk.y, k_end) : AT(0.0); \
    } \
    [[unroll]] for (uint l = 0; l < LB; ++l) { \
        uint i = tid + l * NT; \
        uvec2 kn = b_at(i); \
        RB[l] = i < NB ? load_b((K0) + kn.x, n0 + kn.y, k_end) : BT(0.0); \
    } }

#endif

// The register set (RA, RB) -> shared buffer BUF.
#ifdef PROBE_MMA_ONLY
#define STORE(RA, RB, BUF) {}
#else
#define STORE(RA, RB, BUF) { \
    [[unroll]] for (uint l = 0; l < LA; ++l) { \
        uint i = tid + l * NT; \
        if (i < NA) put_a((BUF) * A_WORDS, a_at(i), RA[l]); \
    } \
    [[unroll]] for (uint l = 0; l < LB; ++l) { \
        uint i = tid + l * NT; \
        if (i < NB) put_b((BUF) * B_WORDS, b_at(i), RB[l]); \
    } }
#endif

// acc += the slice in shared buffer BUF, 16 deep at a time.
#ifdef TRANS_A
#define LOAD_A(F, AT0, M, KK) coopMatLoadNV(F, As, (AT0) + (KK) * SA + (M), SA, true)
#else
#define LOAD_A(F, AT0, M, KK) coopMatLoadNV(F, As, (AT0) + (M) * SA + (KK), SA, false)
#endif
#ifdef TRANS_B
#define LOAD_B(F, BT0, N, KK) coopMatLoadNV(F, Bs, (BT0) + (N) * SB + (KK), SB, true)
#else
#define LOAD_B(F, BT0, N, KK) coopMatLoadNV(F, Bs, (BT0) + (KK) * SB + (N), SB, false)
#endif
#define MULTIPLY(BUF) { \
    [[unroll]] for (uint kk = 0; kk < BK; kk += 16) { \
        fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> fa[FM], fb[FN]; \
        [[unroll]] for (uint i = 0; i < FM; ++i) LOAD_A(fa[i], (BUF) * A_WORDS, (wm * FM + i) * 16, kk); \
        [[unroll]] for (uint j = 0; j < FN; ++j) LOAD_B(fb[j], (BUF) * B_WORDS, (wn * FN + j) * 16, kk); \
        [[unroll]] for (uint i = 0; i < FM; ++i) \
            [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = coopMatMulAddNV(fa[i], fb[j], acc[i][j]); \
    } }

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = tid / SG, lane = tid % SG, wm = sg / WN, wn = sg % WN;
    uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN, z = gl_WorkGroupID.z;
    uint k_begin = z * pc.k_split;
    uint k_end = min(pc.K, k_begin + pc.k_split);

    fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> acc[FM][FN];
    [[unroll]] for (uint i = 0; i < FM; ++i)
        [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);

#ifndef PREFETCH2
    // one slice in flight: its loads overlap the multiplication of the one before
    FETCH(ra0, rb0, k_begin);
    STORE(ra0, rb0, 0);
    barrier();
    uint buf = 0;
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        bool more = k0 + BK < k_end;  // uniform
        if (more) FETCH(ra0, rb0, k0 + BK);
        MULTIPLY(buf);
        if (more) STORE(ra0, rb0, buf ^ 1u);  // its last readers passed the previous barrier
        barrier();
        buf ^= 1u;
    }
#else
    // two slices in flight, in the register sets 0 and 1 by turns: a slice's loads have two
    // multiplications to land. Slice j is staged in shared buffer j % 2 from register set j % 2.
    FETCH(ra0, rb0, k_begin);
    STORE(ra0, rb0, 0);
    if (k_begin + BK < k_end) FETCH(ra1, rb1, k_begin + BK);
    barrier();
    for (uint k0 = k_begin; k0 < k_end; k0 += 2 * BK) {  // two slices per trip: static register sets
        if (k0 + 2 * BK < k_end) FETCH(ra0, rb0, k0 + 2 * BK);
        MULTIPLY(0);
        if (k0 + BK < k_end) STORE(ra1, rb1, 1);  // buffer 1's last readers passed the previous barrier
        barrier();
        if (k0 + BK >= k_end) break;  // uniform
        if (k0 + 3 * BK < k_end) FETCH(ra1, rb1, k0 + 3 * BK);
        MULTIPLY(1);
        if (k0 + 2 * BK < k_end) STORE(ra0, rb0, 0);
        barrier();
    }
#endif

    // Epilogue: each subgroup writes its fragments one at a time through its own scratch.
    uint cs = sg * 16 * SC;
    [[unroll]] for (uint i = 0; i < FM; ++i) {
        [[unroll]] for (uint j = 0; j < FN; ++j) {
            coopMatStoreNV(acc[i][j], Cs, cs, SC, false);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            uint mf = m0 + (wm * FM + i) * 16, nf = n0 + (wn * FN + j) * 16;
            [[unroll]] for (uint e = lane; e < 256; e += SG) {
                uint m = mf + e / 16, n = nf + e % 16;
                if (m < pc.M && n < pc.N) {
                    uint idx = pc.c_off + z * pc.c_split_stride + m * pc.ldc + n;
                    float v = pc.alpha * Cs[cs + (e / 16) * SC + e % 16];
                    if (pc.beta != 0.0) v += pc.beta * C[idx];
#ifdef HAS_BIAS
                    v += bias[pc.bias_off + n];
#endif
                    C[idx] = v;
                }
            }
            subgroupBarrier();  // the scratch is rewritten by the next fragment
        }
    }
}
