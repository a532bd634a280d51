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
// each thread owns a TM x TN register tile, rows ty + i*(BM/TM), cols tx + j*(BN/TN) (coalesced
// stores).
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"

layout(local_size_x_id = 0) in;  // (BM/TM) * (BN/TN) threads (SPLITK_REDUCE: any size)

#ifndef SPLITK_REDUCE
layout(constant_id = 1) const uint BM = 64;  // tile rows of C
layout(constant_id = 2) const uint BN = 64;  // tile cols of C
layout(constant_id = 3) const uint BK = 8;   // k-slice staged per iteration
layout(constant_id = 4) const uint TM = 4;   // rows per thread
layout(constant_id = 5) const uint TN = 4;   // cols per thread

layout(set = 0, binding = 0) readonly buffer A_ { float A[]; };  // op(A) [M,K]
layout(set = 0, binding = 1) readonly buffer B_ { float B[]; };  // op(B) [K,N]
layout(set = 0, binding = 2) buffer C_ { float C[]; };           // [M,N] (split-K: [S,M,N])
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
const uint SA = BM + 4;   // padded shared row strides (k-major)
const uint SB = BN + 4;
const uint LA = (BM * BK + NT - 1) / NT;  // elements of an A / B slice staged per thread
const uint LB = (BK * BN + NT - 1) / NT;
shared float As[2 * BK * SA];  // two [BK][BM] slices of op(A), transposed (double buffer)
shared float Bs[2 * BK * SB];  // two [BK][BN] slices of op(B)
float ra[LA], rb[LB];          // the next slices, in flight from global memory

// op(A)[m,k] / op(B)[k,n], zero outside [0,M) x [k0,k_end) / [k0,k_end) x [0,N).
float load_a(uint m, uint k, uint k_end) {
    if (m >= pc.M || k >= k_end) return 0.0;
#ifdef TRANS_A
    return A[pc.a_off + k * pc.lda + m];
#else
    return A[pc.a_off + m * pc.lda + k];
#endif
}
float load_b(uint k, uint n, uint k_end) {
    if (n >= pc.N || k >= k_end) return 0.0;
#ifdef TRANS_B
    return B[pc.b_off + n * pc.ldb + k];
#else
    return B[pc.b_off + k * pc.ldb + n];
#endif
}

// Element i of a staged slice -> (row, k) of A / (k, col) of B. Consecutive threads walk the
// operand's contiguous direction in global memory.
uvec2 a_at(uint i) {
#ifdef TRANS_A
    return uvec2(i % BM, i / BM);  // A rows are k: contiguous along m
#else
    return uvec2(i / BK, i % BK);  // A rows are m: contiguous along k
#endif
}
uvec2 b_at(uint i) {
#ifdef TRANS_B
    return uvec2(i % BK, i / BK);  // B rows are n: contiguous along k
#else
    return uvec2(i / BN, i % BN);  // B rows are k: contiguous along n
#endif
}

// Global -> registers: the slices at k0 of the tile (m0, n0).
void fetch(uint tid, uint m0, uint n0, uint k0, uint k_end) {
    [[unroll]] for (uint l = 0; l < LA; ++l) {
        uint i = tid + l * NT;
        uvec2 mk = a_at(i);
        ra[l] = i < BM * BK ? load_a(m0 + mk.x, k0 + mk.y, k_end) : 0.0;
    }
    [[unroll]] for (uint l = 0; l < LB; ++l) {
        uint i = tid + l * NT;
        uvec2 kn = b_at(i);
        rb[l] = i < BK * BN ? load_b(k0 + kn.x, n0 + kn.y, k_end) : 0.0;
    }
}

// Registers -> shared buffer `buf`.
void store(uint tid, uint buf) {
    [[unroll]] for (uint l = 0; l < LA; ++l) {
        uint i = tid + l * NT;
        uvec2 mk = a_at(i);
        if (i < BM * BK) As[buf * BK * SA + mk.y * SA + mk.x] = ra[l];
    }
    [[unroll]] for (uint l = 0; l < LB; ++l) {
        uint i = tid + l * NT;
        uvec2 kn = b_at(i);
        if (i < BK * BN) Bs[buf * BK * SB + kn.x * SB + kn.y] = rb[l];
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % RN, ty = tid / RN;
    uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN, z = gl_WorkGroupID.z;
    uint k_begin = z * pc.k_split;
    uint k_end = min(pc.K, k_begin + pc.k_split);

    float acc[TM * TN];
    [[unroll]] for (uint i = 0; i < TM * TN; ++i) acc[i] = 0.0;
    float a[TM], b[TN];

    fetch(tid, m0, n0, k_begin, k_end);
    store(tid, 0);
    barrier();
    uint buf = 0;
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        bool more = k0 + BK < k_end;  // uniform
        if (more) fetch(tid, m0, n0, k0 + BK, k_end);  // next slice loads overlap the math
        [[unroll]] for (uint kk = 0; kk < BK; ++kk) {
            uint ka = buf * BK * SA + kk * SA, kb = buf * BK * SB + kk * SB;
            [[unroll]] for (uint i = 0; i < TM; ++i) a[i] = As[ka + i * RM + ty];
            [[unroll]] for (uint j = 0; j < TN; ++j) b[j] = Bs[kb + j * RN + tx];
            [[unroll]] for (uint i = 0; i < TM; ++i)
                [[unroll]] for (uint j = 0; j < TN; ++j) acc[i * TN + j] += a[i] * b[j];
        }
        if (more) store(tid, buf ^ 1u);  // its last readers passed the previous barrier
        barrier();
        buf ^= 1u;
    }

    [[unroll]] for (uint i = 0; i < TM; ++i) {
        uint m = m0 + i * RM + ty;
        [[unroll]] for (uint j = 0; j < TN; ++j) {
            uint n = n0 + j * RN + tx;
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
