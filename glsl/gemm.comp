#version 450
// General matrix multiply over row-major operands addressed by (buffer, element offset, leading dim):
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C[M,N] (+ bias[N])
//   op(A)[m,k] = A[a_off + m*lda + k]   or, with TRANS_A, A[a_off + k*lda + m]   (A stored [K,M])
//   op(B)[k,n] = B[b_off + k*ldb + n]   or, with TRANS_B, B[b_off + n*ldb + k]   (B stored [N,K])
// beta == 0 never reads C (it may hold garbage). Each output sums k in increasing order inside one
// thread, so the result does not depend on the tile sizes (only on the split-K count).
//
// Main pass (default): workgroup (x, y, z) computes the BM x BN tile (x, y) of C over the k-range
// [z*k_split, (z+1)*k_split); split z writes at C + z*c_split_stride. Without split-K: z = 0, one
// range. With split-K the host points C at a workspace [S, M, N], alpha = 1, beta = 0, no bias,
// and a second dispatch (SPLITK_REDUCE) sums the S partials in order into the real C.
// Tiles: the A and B k-slices go through shared memory (k-major, padded against bank conflicts,
// double-buffered: the next slice is fetched into registers while the current one is multiplied);
// each thread owns a TM x TN register tile made of 4 x 4 blocks: rows g*4*RM + ty*4 + (0..3), cols
// h*4*RN + tx*4 + (0..3), so it reads its operands from shared memory as vec4s. TM and TN are
// multiples of 4. Measured on an H200 (tools/bench_gemm.py): vec4 shared reads alone changed
// nothing; vec4 global loads gave +3-7%; 128 threads of 16x8 outputs instead of 256 of 8x8 gave
// +10-17% (the compiler caps a 256-thread workgroup at 128 registers, 64 of them accumulators).
// HALF: A and B are stored as float16 (16-bit storage; offsets and leading dimensions count halves);
// they are widened on load, so staging, products, sums and C stay float32 (mixed precision's
// operands with FP32 accumulation, on any device with 16-bit storage).
// ROUND_HALF: A and B are float32 in memory and rounded to float16 (to nearest even, in integer
// arithmetic: no device feature needed) as they are staged; products and sums stay float32.
// That is train.precision = "fp16" where the device has no tensor cores: the numbers
// glsl/gemm_coopmat.comp's FLOAT_IN computes, up to the order of the float32 sums.
#extension GL_EXT_control_flow_attributes : enable
#ifdef HALF
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "common.glsl"

layout(local_size_x_id = 0) in;  // (BM/TM) * (BN/TN) threads (SPLITK_REDUCE: any size)

#ifndef SPLITK_REDUCE
layout(constant_id = 1) const uint BM = 64;  // tile rows of C
layout(constant_id = 2) const uint BN = 64;  // tile cols of C
layout(constant_id = 3) const uint BK = 8;   // k-slice staged per iteration
layout(constant_id = 4) const uint TM = 4;   // rows per thread
layout(constant_id = 5) const uint TN = 4;   // cols per thread
// WX > 0: a subgroup's 32 threads cover a block of WX thread columns x 32 / WX thread rows of the
// tile (fewer distinct shared words per load: 32 / WX of A, WX of B) instead of 32 consecutive
// threads along the rows of RN; only which thread owns which outputs changes, never a sum's order.
layout(constant_id = 6) const uint WX = 0;

// VEC4_A / VEC4_B: the operand is read as vec4s along its contiguous direction (A: k, or m with
// TRANS_A; B: n, or k with TRANS_B). The host sets it only when the offset, the leading dimension,
// the contiguous extent and the split-K k-range are multiples of 4, so a vec4 is wholly inside or
// wholly outside the matrix.
#ifdef VEC4_A
#define AW 4
#define AT vec4
#else
#define AW 1
#define AT float
#endif
#ifdef VEC4_B
#define BW 4
#define BT vec4
#else
#define BW 1
#define BT float
#endif
#if defined(HALF) && defined(VEC4_A)  // AS / BS: the operands' element types in memory
#define AS f16vec4
#elif defined(HALF)
#define AS float16_t
#else
#define AS AT
#endif
#if defined(HALF) && defined(VEC4_B)
#define BS f16vec4
#elif defined(HALF)
#define BS float16_t
#else
#define BS BT
#endif
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

const uint RM = BM / TM;  // threads along m
const uint RN = BN / TN;  // threads along n
const uint NT = RM * RN;  // threads
const uint SA = BM / 4 + 1;  // padded shared row strides in vec4s (k-major; the pad keeps the
const uint SB = BN / 4 + 1;  // transposing stores of A free of bank conflicts)
const uint NA = BM * BK / AW;  // loads (floats or vec4s) of an A / B slice
const uint NB = BK * BN / BW;
const uint LA = (NA + NT - 1) / NT;  // ... per thread
const uint LB = (NB + NT - 1) / NT;
shared vec4 As[2 * BK * SA];  // two [BK][BM] slices of op(A), transposed (double buffer)
shared vec4 Bs[2 * BK * SB];  // two [BK][BN] slices of op(B)
AT ra[LA];                    // the next slices, in flight from global memory
BT rb[LB];

// Load i of a staged slice -> (row, first k) of op(A) / (first k, col) of op(B). Consecutive
// threads walk the operand's contiguous direction in global memory, AW / BW floats each.
uvec2 a_at(uint i) {
#ifdef TRANS_A
    return uvec2(AW * (i % (BM / AW)), i / (BM / AW));  // A rows are k: contiguous along m
#else
    return uvec2(i / (BK / AW), AW * (i % (BK / AW)));  // A rows are m: contiguous along k
#endif
}
uvec2 b_at(uint i) {
#ifdef TRANS_B
    return uvec2(BW * (i % (BK / BW)), i / (BK / BW));  // B rows are n: contiguous along k
#else
    return uvec2(i / (BN / BW), BW * (i % (BN / BW)));  // B rows are k: contiguous along n
#endif
}

// op(A) at (m, k) / op(B) at (k, n), AW / BW floats along the contiguous direction; zero outside
// [0,M) x [k0,k_end) / [k0,k_end) x [0,N).
AT load_a(uint m, uint k, uint k_end) {
    if (m >= pc.M || k >= k_end) return AT(0.0);
#ifdef TRANS_A
    return AT(A[(pc.a_off + k * pc.lda + m) / AW]);
#else
    return AT(A[(pc.a_off + m * pc.lda + k) / AW]);
#endif
}
BT load_b(uint k, uint n, uint k_end) {
    if (n >= pc.N || k >= k_end) return BT(0.0);
#ifdef TRANS_B
    return BT(B[(pc.b_off + n * pc.ldb + k) / BW]);
#else
    return BT(B[(pc.b_off + k * pc.ldb + n) / BW]);
#endif
}

#ifdef ROUND_HALF
#include "round_half.glsl"  // A and B as staged
#else
#define round_half(v) (v)
#endif

// Shared slices are k-major: As[k][m], Bs[k][n]. A load along m (B: along n) lands as it is; one
// along k is spread over AW (BW) k-rows.
void put_a(uint base, uvec2 mk, AT v) {
    v = round_half(v);
#if AW == 1
    As[base + mk.y * SA + mk.x / 4][mk.x % 4] = v;
#elif defined(TRANS_A)
    As[base + mk.y * SA + mk.x / 4] = v;
#else
    [[unroll]] for (uint e = 0; e < 4; ++e) As[base + (mk.y + e) * SA + mk.x / 4][mk.x % 4] = v[e];
#endif
}
void put_b(uint base, uvec2 kn, BT v) {
    v = round_half(v);
#if BW == 1
    Bs[base + kn.x * SB + kn.y / 4][kn.y % 4] = v;
#elif !defined(TRANS_B)
    Bs[base + kn.x * SB + kn.y / 4] = v;
#else
    [[unroll]] for (uint e = 0; e < 4; ++e) Bs[base + (kn.x + e) * SB + kn.y / 4][kn.y % 4] = v[e];
#endif
}

// Global -> registers: the slices at k0 of the tile (m0, n0).
void fetch(uint tid, uint m0, uint n0, uint k0, uint k_end) {
    [[unroll]] for (uint l = 0; l < LA; ++l) {
        uint i = tid + l * NT;
        uvec2 mk = a_at(i);
        ra[l] = i < NA ? load_a(m0 + mk.x, k0 + mk.y, k_end) : AT(0.0);
    }
    [[unroll]] for (uint l = 0; l < LB; ++l) {
        uint i = tid + l * NT;
        uvec2 kn = b_at(i);
        rb[l] = i < NB ? load_b(k0 + kn.x, n0 + kn.y, k_end) : BT(0.0);
    }
}

// Registers -> shared buffer `buf`.
void store(uint tid, uint buf) {
    [[unroll]] for (uint l = 0; l < LA; ++l) {
        uint i = tid + l * NT;
        if (i < NA) put_a(buf * BK * SA, a_at(i), ra[l]);
    }
    [[unroll]] for (uint l = 0; l < LB; ++l) {
        uint i = tid + l * NT;
        if (i < NB) put_b(buf * BK * SB, b_at(i), rb[l]);
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % RN, ty = tid / RN;
    if (WX > 0u) {
        uint lane = tid % 32u, sg = tid / 32u, sg_cols = RN / WX;
        tx = (sg % sg_cols) * WX + lane % WX;
        ty = (sg / sg_cols) * (32u / WX) + lane / WX;
    }
    uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN, z = gl_WorkGroupID.z;
    uint k_begin = z * pc.k_split;
    uint k_end = min(pc.K, k_begin + pc.k_split);

    float acc[TM * TN];
    [[unroll]] for (uint i = 0; i < TM * TN; ++i) acc[i] = 0.0;
    vec4 a[TM / 4], b[TN / 4];

    fetch(tid, m0, n0, k_begin, k_end);
    store(tid, 0);
    barrier();
    uint buf = 0;
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        bool more = k0 + BK < k_end;  // uniform
        if (more) fetch(tid, m0, n0, k0 + BK, k_end);  // next slice loads overlap the math
        [[unroll]] for (uint kk = 0; kk < BK; ++kk) {
            uint ka = buf * BK * SA + kk * SA, kb = buf * BK * SB + kk * SB;
            [[unroll]] for (uint g = 0; g < TM / 4; ++g) a[g] = As[ka + g * RM + ty];
            [[unroll]] for (uint h = 0; h < TN / 4; ++h) b[h] = Bs[kb + h * RN + tx];
            [[unroll]] for (uint i = 0; i < TM; ++i)
                [[unroll]] for (uint j = 0; j < TN; ++j) acc[i * TN + j] += a[i / 4][i % 4] * b[j / 4][j % 4];
        }
        if (more) store(tid, buf ^ 1u);  // its last readers passed the previous barrier
        barrier();
        buf ^= 1u;
    }

    [[unroll]] for (uint i = 0; i < TM; ++i) {
        uint m = m0 + (i / 4) * 4 * RM + ty * 4 + i % 4;
        [[unroll]] for (uint j = 0; j < TN; ++j) {
            uint n = n0 + (j / 4) * 4 * RN + tx * 4 + j % 4;
            if (m >= pc.M || n >= pc.N) continue;
            uint idx = pc.c_off + z * pc.c_split_stride + m * pc.ldc + n;
            float v = pc.alpha * acc[i * TN + j];
            if (pc.beta != 0.0) v += pc.beta * C[idx];
#ifdef HAS_BIAS
            v += bias[pc.bias_off + n];
#endif
            C[idx] = v;
        }
    }
}

#else  // SPLITK_REDUCE: C[m,n] = alpha * sum_s W[s,m,n] + beta * C[m,n] (+ bias[n]), s in order

layout(set = 0, binding = 0) readonly buffer W_ { float W[]; };  // [S,M,N] split-K partials
layout(set = 0, binding = 1) buffer C_ { float C[]; };           // [M,N] at c_off, leading dim ldc
#ifdef HAS_BIAS
layout(set = 0, binding = 2) readonly buffer Bias_ { float bias[]; };  // [N]
#endif

layout(push_constant) uniform Push {
    uint M, N, S;
    uint c_off, ldc, bias_off;
    float alpha, beta;
} pc;

void main() {
    uint mn = pc.M * pc.N;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint e = gl_GlobalInvocationID.x; e < mn; e += stride) {  // grid-stride: any M*N
        float s = 0.0;
        for (uint z = 0; z < pc.S; ++z) s += W[z * mn + e];
        uint m = e / pc.N, n = e % pc.N;
        uint idx = pc.c_off + m * pc.ldc + n;
        float v = pc.alpha * s;
        if (pc.beta != 0.0) v += pc.beta * C[idx];
#ifdef HAS_BIAS
        v += bias[pc.bias_off + n];
#endif
        C[idx] = v;
    }
}
#endif
