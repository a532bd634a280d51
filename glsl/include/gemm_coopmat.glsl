// glsl/gemm.comp's product on cooperative matrices (VK_NV_cooperative_matrix: tensor cores on
// NVIDIA), float16 x float16 products with float32 accumulation:
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C[M,N] (+ bias[N])
// Same operands, transposes (TRANS_A, TRANS_B), push constants, split-K ranges and epilogue as
// gemm.comp, so catchat.vk.kernels.gemm.Gemm drives either. The operands are float16 in memory
// (gemm.comp's HALF: offsets and leading dimensions in halves) or, with FLOAT_IN, float32 rounded to
// float16 as they are staged (train.precision = "fp16": the weights and activations stay float32
// and only the products take float16 inputs). C and bias are float32; beta == 0 never reads C.
//
// Work split: a workgroup owns a BM x BN tile of C, BM = WM * FM * 16 and BN = WN * FN * 16: WM x WN
// subgroups, each FM x FN fragments of 16 x 16 accumulators. Per k-slice of BK the threads copy
// op(A) [BM][BK] and op(B) [BK][BN] from global memory to shared memory in quads of 4 elements
// along each operand's contiguous direction in memory (one 16-byte load of float32, 8 of float16,
// with VEC4_A / VEC4_B; single elements otherwise), consecutive threads on consecutive quads; a quad
// stays raw in registers while the previous slice is multiplied, then is rounded to float16 and
// written as one 8-byte word. Shared memory is one array of 8-byte words (uvec2, 4 halves): rows
// padded by 16 bytes, so fragment loads of 8 rows hit 8 distinct bank groups, and the accumulator
// scratch of the epilogue reuses the slices' space.
// STAGES = 2: two shared slices, one barrier per slice (the next slice is stored while the current
// one is multiplied from the other buffer; the loop is unrolled by two so that each buffer's offsets
// are constants); STAGES = 1: one shared slice (room for deeper or wider slices), two barriers per
// slice. Either way the next slice's global loads are in flight during the multiplication.
// Outside the matrix (any M, N, K, offset) the operands read as zero.
// The order of the sums inside a 16-deep fragment product is the hardware's: results match the
// float64 twin (of float16-rounded operands) to float32 accumulation error, not bit for bit.
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#ifdef KHR
#extension GL_KHR_cooperative_matrix : require
#else
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_KHR_shader_subgroup_basic : require

// The fragment types and operations of either extension: VK_NV_cooperative_matrix (gemm_coopmat.comp)
// or VK_KHR_cooperative_matrix (gemm_coopmat_khr.comp, compiled by the newer glslc): the same product,
// for the driver's code generation to be compared (tools/bench_gemm.py --operands coopmat-khr).
#ifdef KHR
#define ACC_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define LAYOUT(col) ((col) ? gl_CooperativeMatrixLayoutColumnMajor : gl_CooperativeMatrixLayoutRowMajor)
#define MAT_LOAD(m, arr, off, stride, col) coopMatLoad(m, arr, off, stride, LAYOUT(col))
#define MAT_STORE(m, arr, off, stride, col) coopMatStore(m, arr, off, stride, LAYOUT(col))
#define MAT_MULADD(a, b, c) coopMatMulAdd(a, b, c)
#else
#define ACC_T fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define FRAG_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define FRAG_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_LOAD(m, arr, off, stride, col) coopMatLoadNV(m, arr, off, stride, col)
#define MAT_STORE(m, arr, off, stride, col) coopMatStoreNV(m, arr, off, stride, col)
#define MAT_MULADD(a, b, c) coopMatMulAddNV(a, b, c)
#endif

layout(local_size_x_id = 0) in;          // WM * WN * subgroup size threads
layout(constant_id = 1) const uint WM = 2;  // subgroups along m
layout(constant_id = 2) const uint WN = 2;  // subgroups along n
layout(constant_id = 3) const uint FM = 4;  // 16-row fragments per subgroup
layout(constant_id = 4) const uint FN = 4;  // 16-column fragments per subgroup
layout(constant_id = 5) const uint BK = 32; // k-slice staged per iteration (a multiple of 16)
layout(constant_id = 6) const uint STAGES = 2;  // shared slices: 1 or 2

// A raw quad in registers: 4 elements along the operand's contiguous direction, as loaded.
#ifdef FLOAT_IN
#define RAW vec4
#else
#define RAW uvec2   // 4 packed halves
#endif

#ifdef VEC4_A
#ifdef FLOAT_IN
layout(set = 0, binding = 0) readonly buffer A_ { vec4 A[]; };    // op(A) [M,K], 4 floats a word
#else
layout(set = 0, binding = 0) readonly buffer A_ { uvec2 A[]; };   // 4 halves a word
#endif
#else
#ifdef FLOAT_IN
layout(set = 0, binding = 0) readonly buffer A_ { float A[]; };
#else
layout(set = 0, binding = 0) readonly buffer A_ { float16_t A[]; };
#endif
#endif
#ifdef VEC4_B
#ifdef FLOAT_IN
layout(set = 0, binding = 1) readonly buffer B_ { vec4 B[]; };    // op(B) [K,N]
#else
layout(set = 0, binding = 1) readonly buffer B_ { uvec2 B[]; };
#endif
#else
#ifdef FLOAT_IN
layout(set = 0, binding = 1) readonly buffer B_ { float B[]; };
#else
layout(set = 0, binding = 1) readonly buffer B_ { float16_t B[]; };
#endif
#endif
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
// Row pitches of the shared slices in 8-byte words (4 halves), each padded by two words (16 bytes:
// rows stay 16-byte aligned for the fragment loads, and 8 rows of a fragment hit 8 bank groups).
#ifdef TRANS_A
const uint PA = BM / 4 + 2;  // As[k][m]: A stored [K,M]
const uint A_WORDS = BK * PA;
#else
const uint PA = BK / 4 + 2;  // As[m][k]
const uint A_WORDS = BM * PA;
#endif
#ifdef TRANS_B
const uint PB = BK / 4 + 2;  // Bs[n][k]: B stored [N,K]
const uint B_WORDS = BN * PB;
#else
const uint PB = BN / 4 + 2;  // Bs[k][n]
const uint B_WORDS = BK * PB;
#endif
const uint STAGE_WORDS = A_WORDS + B_WORDS;
const uint PC = 16 / 2 + 2;                // epilogue scratch: a 16 x 16 float fragment, rows of 8 words + 2
const uint SCRATCH_WORDS = WM * WN * 16 * PC;
const uint SLICE_WORDS = STAGES * STAGE_WORDS;
shared uvec2 smem[SLICE_WORDS > SCRATCH_WORDS ? SLICE_WORDS : SCRATCH_WORDS];

const uint NA = BM * BK / 4;  // quads of an A / B slice
const uint NB = BK * BN / 4;
const uint LA = (NA + NT - 1) / NT;  // ... per thread
const uint LB = (NB + NT - 1) / NT;
RAW ra[LA];  // the next slice, in flight from global memory
RAW rb[LB];

// Quad i of a slice -> (row, word) in its shared layout: consecutive threads walk the operand's
// contiguous direction, 4 elements (one word) each: each warp's loads are 512 (256) contiguous bytes.
uvec2 a_at(uint i) { return uvec2(i / (PA - 2), i % (PA - 2)); }
uvec2 b_at(uint i) { return uvec2(i / (PB - 2), i % (PB - 2)); }

RAW zero_raw() {
#ifdef FLOAT_IN
    return vec4(0.0);
#else
    return uvec2(0);
#endif
}

#ifdef FLOAT_IN
#define ELEM_A(j) A[j]
#define ELEM_B(j) B[j]
#else
#define ELEM_A(j) float(A[j])
#define ELEM_B(j) float(B[j])
#endif

// The quad at element `at` with `valid` of its elements inside the matrix: one 16-byte (8-byte)
// load with VEC4_A / VEC4_B (extents are multiples of 4 there: a quad is all in or all out).
#define LOAD_VEC(BUF, at, valid, r) { r = BUF[(at) / 4]; }
#ifdef FLOAT_IN
#define LOAD_SCALAR(ELEM, at, valid, r) { \
    [[unroll]] for (uint e = 0; e < 4; ++e) r[e] = e < valid ? ELEM((at) + e) : 0.0; }
#else
#define LOAD_SCALAR(ELEM, at, valid, r) { \
    vec4 q; \
    [[unroll]] for (uint e = 0; e < 4; ++e) q[e] = e < valid ? ELEM((at) + e) : 0.0; \
    r = uvec2(packFloat2x16(f16vec2(q.xy)), packFloat2x16(f16vec2(q.zw))); }
#endif

RAW load_a(uvec2 rw, uint m0, uint k0, uint k_end) {
    RAW r = zero_raw();
#ifdef TRANS_A
    uint k = k0 + rw.x, m = m0 + 4 * rw.y;  // A stored [K,M]: contiguous along m
    if (k >= k_end || m >= pc.M) return r;
    uint at = pc.a_off + k * pc.lda + m, valid = pc.M - m;
#else
    uint m = m0 + rw.x, k = k0 + 4 * rw.y;  // A stored [M,K]: contiguous along k
    if (m >= pc.M || k >= k_end) return r;
    uint at = pc.a_off + m * pc.lda + k, valid = k_end - k;
#endif
#ifdef VEC4_A
    LOAD_VEC(A, at, valid, r);
#else
    LOAD_SCALAR(ELEM_A, at, valid, r);
#endif
    return r;
}

RAW load_b(uvec2 rw, uint n0, uint k0, uint k_end) {
    RAW r = zero_raw();
#ifdef TRANS_B
    uint n = n0 + rw.x, k = k0 + 4 * rw.y;  // B stored [N,K]: contiguous along k
    if (n >= pc.N || k >= k_end) return r;
    uint at = pc.b_off + n * pc.ldb + k, valid = k_end - k;
#else
    uint k = k0 + rw.x, n = n0 + 4 * rw.y;  // B stored [K,N]: contiguous along n
    if (k >= k_end || n >= pc.N) return r;
    uint at = pc.b_off + k * pc.ldb + n, valid = pc.N - n;
#endif
#ifdef VEC4_B
    LOAD_VEC(B, at, valid, r);
#else
    LOAD_SCALAR(ELEM_B, at, valid, r);
#endif
    return r;
}

// A raw quad as one shared word of 4 halves (rounded to nearest even where it was float32).
uvec2 pack_quad(RAW r) {
#ifdef FLOAT_IN
    f16vec4 h = f16vec4(r);
    return uvec2(packFloat2x16(h.xy), packFloat2x16(h.zw));
#else
    return r;
#endif
}

// Diagnostics only (tools/bench_gemm.py --probe), to see where the time goes: PROBE_NO_GLOBAL
// stages made-up values instead of loading the operands; PROBE_MMA_ONLY also skips the stores to
// shared memory (the fragment loads, products and barriers alone).
#if defined(PROBE_NO_GLOBAL) || defined(PROBE_MMA_ONLY)
void fetch(uint tid, uint m0, uint n0, uint k0, uint k_end) {
    [[unroll]] for (uint l = 0; l < LA; ++l) {
#ifdef FLOAT_IN
        ra[l] = vec4(float(tid + l + k0), float(m0 + l), 1.0, 2.0);
#else
        ra[l] = uvec2(tid + l + k0, m0 + l);
#endif
    }
    [[unroll]] for (uint l = 0; l < LB; ++l) rb[l] = ra[l % LA];
}
#else
void fetch(uint tid, uint m0, uint n0, uint k0, uint k_end) {
    [[unroll]] for (uint l = 0; l < LA; ++l) {
        uint i = tid + l * NT;
        if (i < NA) ra[l] = load_a(a_at(i), m0, k0, k_end);
    }
    [[unroll]] for (uint l = 0; l < LB; ++l) {
        uint i = tid + l * NT;
        if (i < NB) rb[l] = load_b(b_at(i), n0, k0, k_end);
    }
}
#endif

void stage(uint tid, uint buf) {
#ifndef PROBE_MMA_ONLY
    uint base = buf * STAGE_WORDS;
    [[unroll]] for (uint l = 0; l < LA; ++l) {
        uint i = tid + l * NT;
        if (i < NA) { uvec2 rw = a_at(i); smem[base + rw.x * PA + rw.y] = pack_quad(ra[l]); }
    }
    base += A_WORDS;
    [[unroll]] for (uint l = 0; l < LB; ++l) {
        uint i = tid + l * NT;
        if (i < NB) { uvec2 rw = b_at(i); smem[base + rw.x * PB + rw.y] = pack_quad(rb[l]); }
    }
#endif
}

ACC_T acc[FM][FN];

// acc += the slice in shared buffer `buf`, 16 deep at a time. Word offsets: a fragment's rows (or
// columns) start on whole words (16-element steps are 4 words).
void multiply(uint buf, uint wm, uint wn) {
    uint a0 = buf * STAGE_WORDS, b0 = a0 + A_WORDS;
    [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {
        FRAG_A fa[FM];
        FRAG_B fb[FN];
        [[unroll]] for (uint i = 0; i < FM; ++i) {
            uint m = (wm * FM + i) * 16;
#ifdef TRANS_A
            MAT_LOAD(fa[i], smem, a0 + kk * PA + m / 4, PA, true);
#else
            MAT_LOAD(fa[i], smem, a0 + m * PA + kk / 4, PA, false);
#endif
        }
        [[unroll]] for (uint j = 0; j < FN; ++j) {
            uint n = (wn * FN + j) * 16;
#ifdef TRANS_B
            MAT_LOAD(fb[j], smem, b0 + n * PB + kk / 4, PB, true);
#else
            MAT_LOAD(fb[j], smem, b0 + kk * PB + n / 4, PB, false);
#endif
        }
        [[unroll]] for (uint i = 0; i < FM; ++i)
            [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = MAT_MULADD(fa[i], fb[j], acc[i][j]);
    }
}

// STAGES = 2: multiply the slice in `buf` while the slice at k_next (if any) goes to the other buffer,
// then the one barrier. buf is a literal at each call (constant shared offsets).
void slice2(uint tid, uint wm, uint wn, uint m0, uint n0, uint buf, uint k_next, uint k_end) {
    bool more = k_next < k_end;  // uniform
    if (more) fetch(tid, m0, n0, k_next, k_end);
    multiply(buf, wm, wn);
    if (more) stage(tid, buf ^ 1u);  // its last readers passed the previous barrier
    barrier();
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = tid / SG, lane = tid % SG, wm = sg / WN, wn = sg % WN;
    uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN, z = gl_WorkGroupID.z;
    uint k_begin = z * pc.k_split;
    uint k_end = min(pc.K, k_begin + pc.k_split);

    [[unroll]] for (uint i = 0; i < FM; ++i)
        [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = ACC_T(0.0);

    fetch(tid, m0, n0, k_begin, k_end);
    if (STAGES == 2) {
        stage(tid, 0);
        barrier();
        for (uint k0 = k_begin; k0 < k_end; k0 += 2 * BK) {  // two slices an iteration: buffer 0, then 1
            slice2(tid, wm, wn, m0, n0, 0u, k0 + BK, k_end);
            if (k0 + BK >= k_end) break;
            slice2(tid, wm, wn, m0, n0, 1u, k0 + 2 * BK, k_end);
        }
    } else {
        for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
            stage(tid, 0);
            barrier();
            if (k0 + BK < k_end) fetch(tid, m0, n0, k0 + BK, k_end);
            multiply(0, wm, wn);
            barrier();  // every subgroup has read the slice before it is overwritten
        }
    }

    // Epilogue: each subgroup writes its fragments one at a time through its own scratch, which
    // reuses the slices' words (every subgroup passed the loop's last barrier).
    uint cs = sg * 16 * PC;
    [[unroll]] for (uint i = 0; i < FM; ++i) {
        [[unroll]] for (uint j = 0; j < FN; ++j) {
            MAT_STORE(acc[i][j], smem, cs, PC, false);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            uint mf = m0 + (wm * FM + i) * 16, nf = n0 + (wn * FN + j) * 16;
            [[unroll]] for (uint w = lane; w < 128; w += SG) {  // 128 words of 2 floats: row w / 8
                uint r = w / 8, c = 2 * (w % 8);
                vec2 v = uintBitsToFloat(smem[cs + r * PC + c / 2]);
                uint m = mf + r;
                [[unroll]] for (uint e = 0; e < 2; ++e) {
                    uint n = nf + c + e;
                    if (m < pc.M && n < pc.N) {
                        uint idx = pc.c_off + z * pc.c_split_stride + m * pc.ldc + n;
                        float out_v = pc.alpha * v[e];
                        if (pc.beta != 0.0) out_v += pc.beta * C[idx];
#ifdef HAS_BIAS
                        out_v += bias[pc.bias_off + n];
#endif
                        C[idx] = out_v;
                    }
                }
            }
            subgroupBarrier();  // the scratch is rewritten by the next fragment
        }
    }
}
