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
// scratch of the epilogue reuses the slices' space (a row of a subgroup's fragments at a time, written
// out as quads of 4 columns: 16-byte stores with VEC4_C).
// STAGES = 2: two shared slices, one barrier per slice (the next slice is stored while the current
// one is multiplied from the other buffer; the loop is unrolled by two so that each buffer's offsets
// are constants); STAGES = 1: one shared slice (room for deeper or wider slices), two barriers per
// slice. Either way the next slice's global loads are in flight during the multiplication.
// Outside the matrix (any M, N, K, offset) the operands read as zero.
// The order of the sums inside a 16-deep fragment product is the hardware's: results match the
// float64 twin (of float16-rounded operands) to float32 accumulation error, not bit for bit.
// SPLIT (with FLOAT_IN, STAGES = 1; train.precision "fp32" on tensor cores): each float32 operand x is
// staged as two float16 parts, x * 2^e = hi + lo / 2^11 (hi x's top 11 bits, lo the rest, both exact
// where x * 2^e is in float16's normal range), and the products hi*hi go into one set of accumulators,
// hi*lo + lo*hi into a second, folded as acc + acc_lo / 2^11 in the epilogue: ~2^-22 per product, float32
// sums. 2^e is a power of two per operand and workgroup that puts the largest |x| the workgroup has
// staged so far in [2^13, 2^14): every slice's largest |x| (shared-memory atomicMax over the subgroups'
// maxima, beside the barrier the loop has) lowers e when it would pass 2^15 (2x headroom); the
// accumulators are then scaled down by the same power (exact) and the slice is loaded again at the new
// e. So small gradients keep their bits and nothing overflows float16; the epilogue multiplies by
// 2^-(e_a + e_b). Inf and NaN are left out of the maxima (they still reach their outputs).
// EMU: the fragments emulated (include/sweep_frag.glsl's layout: an accumulator is 8 floats of an
// invocation, operands read from shared memory when multiplied) on devices without cooperative
// matrices, so lavapipe runs this kernel's staging, split and epilogue in the tests.
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#ifndef EMU
#include "coopmat_ext.glsl"
#endif
#extension GL_KHR_shader_subgroup_basic : require
#ifdef SPLIT
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

// The fragment types and operations of either extension (include/coopmat_ext.glsl's CM_ ones):
// VK_NV_cooperative_matrix (gemm_coopmat.comp) or VK_KHR_cooperative_matrix (gemm_coopmat_khr.comp,
// compiled by the newer glslc): the same product, for the driver's code generation to be compared
// (tools/bench_gemm.py --operands coopmat-khr); or emulated (EMU: include/gemm_coopmat_emu.glsl, after
// the shared array).
#ifdef EMU
struct FragRef { uint off; uint stride; bool col; };  // an operand block in shared memory, in halves
struct Acc { float v[8]; };
#define ACC_T Acc
#define FRAG_A FragRef
#define FRAG_B FragRef
#define ACC_ZERO emu_zero()
#define MAT_LOAD(m, arr, off, stride, col) m = FragRef(4u * (off), 4u * (stride), col)
#define MAT_STORE(m, arr, off, stride, col) emu_store(m, off, stride)
#define MAT_MULADD(a, b, c) emu_mul_add(a, b, c)
#define ACC_MUL(a, s) emu_scale(a, s)
#define SG_SYNC() barrier()  // a virtual subgroup of 32 may be several real ones
#define SG_WAIT() barrier()
#else
#define ACC_T CM_ACC
#define FRAG_A CM_A
#define FRAG_B CM_B
#define MAT_LOAD(m, arr, off, stride, col) CM_LOAD(m, arr, off, stride, col)
#define MAT_STORE(m, arr, off, stride, col) CM_STORE(m, arr, off, stride, col)
#define MAT_MULADD(a, b, c) CM_MULADD(a, b, c)
#define ACC_ZERO ACC_T(0.0)
#define ACC_MUL(a, s) ((a) * (s))
#define SG_SYNC() subgroupMemoryBarrierShared(); subgroupBarrier()
#define SG_WAIT() subgroupBarrier()
#endif
#ifdef SPLIT
#if !defined(FLOAT_IN)
#error SPLIT splits float32 operands (FLOAT_IN)
#endif
#include "split_half.glsl"
const float ACC_LO_WEIGHT = 1.0 / SPLIT_SCALE;  // lo is SPLIT_SCALE x what hi left out
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
#ifdef VEC4_C  // the host's promise: N, ldc, c_off, c_split_stride and bias_off multiples of 4
layout(set = 0, binding = 2) buffer C4_ { vec4 C4[]; };
#ifdef HAS_BIAS
layout(set = 0, binding = 3) readonly buffer Bias4_ { vec4 bias4[]; };
#endif
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
// The epilogue's scratch, a subgroup's: FE of its FN fragments side by side (a row of them, 16 rows of
// 16 FE floats, each row padded by two words). SPLIT: one fragment, its scratch twice (acc's, acc_lo's).
#ifdef SPLIT
const uint FE = 1;
#else
const uint FE = FN;
#endif
const uint PC = FE * 8 + 2;                // its row pitch in words (2 floats a word)
const uint SCRATCH_WORDS = WM * WN * 16 * PC;
#ifdef SPLIT
const uint SLICE_WORDS = 2 * STAGE_WORDS;      // the slice's hi words, then its lo words (STAGES = 1)
const uint SCRATCH_ALL = 2 * SCRATCH_WORDS;    // acc's scratch, then acc_lo's
#else
const uint SLICE_WORDS = STAGES * STAGE_WORDS;
const uint SCRATCH_ALL = SCRATCH_WORDS;
#endif
shared uvec2 smem[SLICE_WORDS > SCRATCH_ALL ? SLICE_WORDS : SCRATCH_ALL];

#ifdef EMU
#include "gemm_coopmat_emu.glsl"
#endif

const uint NA = BM * BK / 4;  // quads of an A / B slice
const uint NB = BK * BN / 4;
const uint LA = (NA + NT - 1) / NT;  // ... per thread
const uint LB = (NB + NT - 1) / NT;
RAW ra[LA];  // the next slice, in flight from global memory
RAW rb[LB];
#ifdef SPLIT
uvec4 sa[LA];  // ... split and scaled: its hi word (xy) and lo word (zw), waiting to be stored
uvec4 sb[LB];
#endif

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

#ifdef SPLIT
// The split's stores: hi words at the slice, lo words STAGE_WORDS later (sa, sb: `split_slice`).
#define STORE_A(w, l) { smem[w] = sa[l].xy; smem[(w) + STAGE_WORDS] = sa[l].zw; }
#define STORE_B(w, l) { smem[w] = sb[l].xy; smem[(w) + STAGE_WORDS] = sb[l].zw; }
#else
#define STORE_A(w, l) smem[w] = pack_quad(ra[l])
#define STORE_B(w, l) smem[w] = pack_quad(rb[l])
#endif

void stage(uint tid, uint buf) {
#ifndef PROBE_MMA_ONLY
    uint base = buf * STAGE_WORDS;
    [[unroll]] for (uint l = 0; l < LA; ++l) {
        uint i = tid + l * NT;
        if (i < NA) { uvec2 rw = a_at(i); STORE_A(base + rw.x * PA + rw.y, l); }
    }
    base += A_WORDS;
    [[unroll]] for (uint l = 0; l < LB; ++l) {
        uint i = tid + l * NT;
        if (i < NB) { uvec2 rw = b_at(i); STORE_B(base + rw.x * PB + rw.y, l); }
    }
#endif
}

ACC_T acc[FM][FN];

// Fragment i of a subgroup's A rows (B columns: j) at k-offset kk of the slice whose A (B) words start at
// word a0 (b0). Word offsets: a fragment's rows (or columns) start on whole words (16-element steps
// are 4 words).
#ifdef TRANS_A
#define LOAD_FA(f, a0, i) { uint m = (wm * FM + i) * 16; MAT_LOAD(f, smem, a0 + kk * PA + m / 4, PA, true); }
#else
#define LOAD_FA(f, a0, i) { uint m = (wm * FM + i) * 16; MAT_LOAD(f, smem, a0 + m * PA + kk / 4, PA, false); }
#endif
#ifdef TRANS_B
#define LOAD_FB(f, b0, j) { uint n = (wn * FN + j) * 16; MAT_LOAD(f, smem, b0 + n * PB + kk / 4, PB, true); }
#else
#define LOAD_FB(f, b0, j) { uint n = (wn * FN + j) * 16; MAT_LOAD(f, smem, b0 + kk * PB + n / 4, PB, false); }
#endif

#ifdef SPLIT
ACC_T acc_lo[FM][FN];  // hi * lo + lo * hi, 2^11 times their weight
#endif

// acc += the slice in shared buffer `buf`, 16 deep at a time (SPLIT: acc += hi * hi, acc_lo += hi * lo +
// lo * hi, the lo words STAGE_WORDS after the hi ones).
void multiply(uint buf, uint wm, uint wn) {
    uint a0 = buf * STAGE_WORDS, b0 = a0 + A_WORDS;
    [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {
        FRAG_A fa[FM];
        FRAG_B fb[FN];
        [[unroll]] for (uint i = 0; i < FM; ++i) LOAD_FA(fa[i], a0, i);
        [[unroll]] for (uint j = 0; j < FN; ++j) LOAD_FB(fb[j], b0, j);
#ifdef SPLIT
        FRAG_A fa_lo[FM];
        FRAG_B fb_lo[FN];
        [[unroll]] for (uint i = 0; i < FM; ++i) LOAD_FA(fa_lo[i], (a0 + STAGE_WORDS), i);
        [[unroll]] for (uint j = 0; j < FN; ++j) LOAD_FB(fb_lo[j], (b0 + STAGE_WORDS), j);
        [[unroll]] for (uint i = 0; i < FM; ++i) {
            [[unroll]] for (uint j = 0; j < FN; ++j) {
                acc[i][j] = MAT_MULADD(fa[i], fb[j], acc[i][j]);
                acc_lo[i][j] = MAT_MULADD(fa[i], fb_lo[j], acc_lo[i][j]);
                acc_lo[i][j] = MAT_MULADD(fa_lo[i], fb[j], acc_lo[i][j]);
            }
        }
#else
        [[unroll]] for (uint i = 0; i < FM; ++i)
            [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = MAT_MULADD(fa[i], fb[j], acc[i][j]);
#endif
    }
}

#ifdef SPLIT
// The operands' scales 2^ea, 2^eb (the header: per workgroup, only ever lowered) and the slices' largest
// |x| as float32 bits, A's then B's, for two slices at a time (the one being split, the one after).
int ea = 126, eb = 126;
shared uint split_max[4];

float pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23u); }  // -126 <= e <= 127

// The largest finite |x| of a quad, as bits (they order as the values do).
uint quad_max(vec4 x) {
    uvec4 b = floatBitsToUint(abs(x));
    b = mix(b, uvec4(0u), greaterThanEqual(b, uvec4(0x7F800000u)));
    return max(max(b.x, b.y), max(b.z, b.w));
}

// The raw slice's largest |x| of A and of B into split_max's `slot` (zero before: `main`).
void note_max(uint tid, uint slot) {
    uint ma = 0u, mb = 0u;
    [[unroll]] for (uint l = 0; l < LA; ++l)
        if (tid + l * NT < NA) ma = max(ma, quad_max(ra[l]));
    [[unroll]] for (uint l = 0; l < LB; ++l)
        if (tid + l * NT < NB) mb = max(mb, quad_max(rb[l]));
    ma = subgroupMax(ma);
    mb = subgroupMax(mb);
    if (subgroupElect()) {
        atomicMax(split_max[2u * slot], ma);
        atomicMax(split_max[2u * slot + 1u], mb);
    }
}

// The exponent that puts a largest |x| (bits) in [2^13, 2^14); no limit for 0.
int scale_for(uint bits) { return bits == 0u ? 126 : clamp(140 - int(bits >> 23u), -126, 126); }

// After the barrier that follows note_max(slot): lower ea or eb where the slice's largest |x| would
// pass 2^15, scaling the accumulators down to match (powers of two: exact). True when they fell (the
// slice split at the old scales must be split again).
bool rescale(uint slot) {
    int na = scale_for(split_max[2u * slot]), nb = scale_for(split_max[2u * slot + 1u]);
    int da = ea > na + 1 ? ea - na : 0, db = eb > nb + 1 ? eb - nb : 0;
    if (da + db == 0) return false;
    ea -= da;
    eb -= db;
    for (int d = da + db; d > 0; d -= 126) {
        float f = pow2(-min(d, 126));
        [[unroll]] for (uint i = 0; i < FM; ++i) {
            [[unroll]] for (uint j = 0; j < FN; ++j) {
                acc[i][j] = ACC_MUL(acc[i][j], f);
                acc_lo[i][j] = ACC_MUL(acc_lo[i][j], f);
            }
        }
    }
    return true;
}

// The raw slice split at the current scales (split_half.glsl's `split_normal`: the scales put it in
// float16's normal range), ready for `stage`.
void split_slice(uint tid) {
    float s_a = pow2(ea), s_b = pow2(eb);
    [[unroll]] for (uint l = 0; l < LA; ++l)
        if (tid + l * NT < NA) sa[l] = split_normal(ra[l] * s_a);
    [[unroll]] for (uint l = 0; l < LB; ++l)
        if (tid + l * NT < NB) sb[l] = split_normal(rb[l] * s_b);
}

// The k loop of the split (STAGES = 1): the next slice is loaded, split and its maxima noted while the
// current one is multiplied; the loop's second barrier also publishes the maxima.
void split_loop(uint tid, uint wm, uint wn, uint m0, uint n0, uint k_begin, uint k_end) {
    if (tid < 4u) split_max[tid] = 0u;
    barrier();
    fetch(tid, m0, n0, k_begin, k_end);
    note_max(tid, 0u);
    barrier();
    rescale(0u);  // the accumulators are zero: only the scales
    split_slice(tid);
    uint slot = 0u;
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        stage(tid, 0);
        barrier();
        if (tid == 0u) split_max[2u * slot] = split_max[2u * slot + 1u] = 0u;  // everyone read it before the barrier
        bool more = k0 + BK < k_end;  // uniform
        if (more) fetch(tid, m0, n0, k0 + BK, k_end);
        multiply(0, wm, wn);
        if (more) {
            note_max(tid, slot ^ 1u);
            split_slice(tid);
        }
        barrier();  // every subgroup has read the slice before it is overwritten; the maxima are in
        slot ^= 1u;
        if (more && rescale(slot)) {
            fetch(tid, m0, n0, k0 + BK, k_end);
            split_slice(tid);
        }
    }
}
#endif

// STAGES = 2: multiply the slice in `buf` while the slice at k_next (if any) goes to the other buffer,
// then the one barrier. buf is a literal at each call (constant shared offsets).
void slice2(uint tid, uint wm, uint wn, uint m0, uint n0, uint buf, uint k_next, uint k_end) {
    bool more = k_next < k_end;  // uniform
    if (more) fetch(tid, m0, n0, k_next, k_end);
    multiply(buf, wm, wn);
    if (more) stage(tid, buf ^ 1u);  // its last readers passed the previous barrier
    barrier();
}

// C's quad at row m, columns n .. n+3 (those inside [M, N]) from the sums v (their scales undone):
// alpha * v (+ beta * C) (+ bias), per element as in gemm.comp; one 16-byte store with VEC4_C.
void write_quad(uint m, uint n, uint z, vec4 v) {
    if (m >= pc.M || n >= pc.N) return;
    uint idx = pc.c_off + z * pc.c_split_stride + m * pc.ldc + n;
#ifdef VEC4_C  // N a multiple of 4: the quad is whole
    vec4 out_v = pc.alpha * v;
    if (pc.beta != 0.0) out_v += pc.beta * C4[idx / 4];
#ifdef HAS_BIAS
    out_v += bias4[(pc.bias_off + n) / 4];
#endif
    C4[idx / 4] = out_v;
#else
    [[unroll]] for (uint e = 0; e < 4; ++e) {
        if (n + e < pc.N) {
            float out_v = pc.alpha * v[e];
            if (pc.beta != 0.0) out_v += pc.beta * C[idx + e];
#ifdef HAS_BIAS
            out_v += bias[pc.bias_off + n + e];
#endif
            C[idx + e] = out_v;
        }
    }
#endif
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = tid / SG, lane = tid % SG, wm = sg / WN, wn = sg % WN;
    uint m0 = gl_WorkGroupID.x * BM, n0 = gl_WorkGroupID.y * BN, z = gl_WorkGroupID.z;
    uint k_begin = z * pc.k_split;
    uint k_end = min(pc.K, k_begin + pc.k_split);

    [[unroll]] for (uint i = 0; i < FM; ++i)
        [[unroll]] for (uint j = 0; j < FN; ++j) acc[i][j] = ACC_ZERO;

#ifdef SPLIT
    [[unroll]] for (uint i = 0; i < FM; ++i)
        [[unroll]] for (uint j = 0; j < FN; ++j) acc_lo[i][j] = ACC_ZERO;
    split_loop(tid, wm, wn, m0, n0, k_begin, k_end);
    ivec4 unscale = ivec4(-(ea + eb));
#define UNSCALED(x) ldexp(x, unscale)  // the operands' scales undone (before alpha: either may be large)
#else
#define UNSCALED(x) (x)
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
#endif

    // Epilogue: each subgroup writes a row of FE fragments at a time through its own scratch, which
    // reuses the slices' words (every subgroup passed the loop's last barrier), then its lanes take the
    // rows' quads of 4 columns in order (`write_quad`: the 32 lanes' stores cover 8 / FE rows of 64 FE
    // contiguous bytes each). SPLIT: acc_lo's through a second scratch after every subgroup's first,
    // folded into acc's as float32.
    uint cs = sg * 16 * PC;
    const uint QR = 4 * FE;  // quads of a scratch row
    [[unroll]] for (uint i = 0; i < FM; ++i) {
        [[unroll]] for (uint j = 0; j < FN; j += FE) {
            [[unroll]] for (uint e = 0; e < FE; ++e) {
                MAT_STORE(acc[i][j + e], smem, cs + 8 * e, PC, false);
#ifdef SPLIT
                MAT_STORE(acc_lo[i][j + e], smem, SCRATCH_WORDS + cs + 8 * e, PC, false);
#endif
            }
            SG_SYNC();
            uint mf = m0 + (wm * FM + i) * 16, nf = n0 + (wn * FN + j) * 16;
            [[unroll]] for (uint q = lane; q < 16 * QR; q += SG) {
                uint r = q / QR, c = 4 * (q % QR), w = cs + r * PC + c / 2;  // row r, columns c .. c+3
                vec4 v = vec4(uintBitsToFloat(smem[w]), uintBitsToFloat(smem[w + 1]));
#ifdef SPLIT
                uint wl = SCRATCH_WORDS + w;
                v += vec4(uintBitsToFloat(smem[wl]), uintBitsToFloat(smem[wl + 1])) * ACC_LO_WEIGHT;  // the fold
#endif
                write_quad(mf + r, nf + c, z, UNSCALED(v));
            }
            SG_WAIT();  // the scratch is rewritten by the next row of fragments
        }
    }
}
