#version 450
// One decode step of GRU layer l for B streams with both products on tensor cores: the throughput
// form of decode_layer.comp (read its header for the maths), for many streams at once. Its products
// take float16 operands with float32 sums, as an fp16 training step's do:
//   gh = h16_old @ W_hh^T            (h16: float16 shadow of the state; a <bos> stream's gh = b_hh)
//   gi = (y16 @ W_ih^T) * rstd(y)    (y16 = float16((x + h) * g) of the layer below, l > 0)
// where W_hh and W_ih are float16 copies in 16 x 16 blocks (w16: [L] W_hh, then [L-1] W_ih of layers
// 1..L-1, each 3H x H; ToHalf at a call's start) and rstd(y) comes from the layer below's sums of
// y^2 over each slice of 16 units (ssq). So every weight is read once per step for each tile of up
// to 64 streams, as a GEMM reads it, and each workgroup still does all its layer's work for its
// units: no grid barrier, no second dispatch. Layer 0's input side is table0's row, as in
// decode_layer.comp. Workgroup (u, st): units [16 u, 16 u + 16) of the stream tile [16 SF st,
// 16 SF (st + 1)) (SF 16-stream fragments; the host picks SF and KS, catchat.vk.kernels.decode.CoopShape:
// the more fragments, the fewer k parts shared memory holds); subgroup s owns stream fragment s % SF
// and k part s / SF (KS parts): its 3 (layer 0) or 6 accumulators of 16 streams x 16 units walk its k part,
// each operand fragment one 512-byte block (include/sweep_frag.glsl), the next PD - 1 fragments'
// loads issued before each product (a ring of PD stages: the loads' latency, not the tensor
// cores, bounds a step). The k parts meet in shared memory (in a fixed order), then every thread
// takes elements (stream, unit) of the gates: the state h (float32, ping-pong halves as in
// decode_layer.comp), x + h, and for the step after and the layer above the float16 shadows
// h16_new and y16 = float16((x + h) * g_l), and this slice's sum of (x + h)^2 per stream.
// FRAG_W: w16's blocks in their fragments' own order (glsl/frag_order.comp, made after ToHalf's copy).
// PROBE (timing only, wrong results; on real fragments): 1 = no W loads (constant W
// fragments), 2 = no h16 / y16 loads: what a step costs without those bytes (tools/gpu-check.sh).
// Shadows: act16 = [2 parities][L][SP/16 stream fragments][H/16][16 x 16] then [L][SP/16][H/16][16 x
// 16] for y16 (SP = B rounded up to 16; rows past B are zeros the host wrote and stay zero: a row of
// a product depends only on its own row, so they never reach a real stream).
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifndef EMU
#extension GL_KHR_memory_scope_semantics : require
#include "coopmat_ext.glsl"
#endif
#include "common.glsl"
#include "slots.glsl"

#ifndef SF
#define SF 4    // 16-stream fragments per workgroup (1..4)
#endif
#ifndef KS
#define KS 2    // k parts per stream fragment (1, 2, 4 or 8; H / 16 a multiple of it; SF * KS <= 16)
#endif
// SEQ (more than 8 subgroups): the k parts meet through one slot per stream fragment, one part after
// another, instead of a slot per part (which would not fit shared memory); part 0 adds them in the
// same order either way, so the sums are the same bits.
#ifndef PD
#define PD 3    // stages of fragments in the ring: the loads of PD - 1 k fragments ahead in flight
#endif
#ifndef PROBE
#define PROBE 0
#endif
#if PROBE == 1
#define LOAD_W(m, off, stride, col) m = FRAG_B(float16_t(0.001))
#elif defined(FRAG_W)  // the copy in fragment order (glsl/frag_order.comp with COL): one 16-byte load an invocation
#define LOAD_W(m, off, stride, col) LOAD_B_FRAG(m, off)
#else
#define LOAD_W(m, off, stride, col) LOAD_B(m, off, stride, col)
#endif
#if PROBE == 2
#define LOAD_ACT(m, off, stride, col) m = FRAG_A(float16_t(0.001))
#else
#define LOAD_ACT(m, off, stride, col) LOAD_A(m, off, stride, col)
#endif
#define NSUB (SF * KS)
// Real fragments live in registers: the ring's loops unroll so every stage index is a constant.
// Emulated ones are references: a loop keeps lavapipe's compile of the pipeline short (unrolled, the
// emulated products' loops made it ~50 s) and runs the same stages in the same order.
#ifdef EMU
#define RING_LOOP [[dont_unroll]]
#else
#define RING_LOOP [[unroll]]
#endif
#ifdef SEQ
#define ACC_PARTS 1
#else
#define ACC_PARTS (KS > 1 ? KS - 1 : 1)
#endif

layout(local_size_x_id = 0) in;  // 32 * NSUB
layout(constant_id = 1) const uint H = 16;
layout(constant_id = 2) const uint B = 1;

layout(set = 0, binding = 0) readonly buffer P { float params[]; };   // flat ParamLayout
layout(set = 0, binding = 1) readonly buffer T0 { float table0[]; };  // [V, 3H]  E W_ih0^T
layout(set = 0, binding = 2) buffer S { float state[]; };             // [2, L, B, H] ping-pong
layout(set = 0, binding = 3) buffer Y { float ysum[]; };              // [L, B, H] x + h_new of each layer
layout(set = 0, binding = 4) readonly buffer Tok { uint token[]; };   // [B] this step's input
layout(set = 0, binding = 5) readonly buffer Ctl { uint ctl[]; };     // [B, DS_WORDS]
layout(set = 0, binding = 6) readonly buffer W16 { float16_t w16[]; };  // blocked float16 W_hh, W_ih
#if defined(FRAG_W) && !defined(EMU)
layout(set = 0, binding = 6) readonly buffer W16Q { uvec4 w16q[]; };   // the same, 8 halves a word
#define B_BUF_Q w16q
#endif
layout(set = 0, binding = 7) buffer A16 { float16_t act16[]; };        // h16 and y16 shadows
layout(set = 0, binding = 8) buffer Ssq { float ssq[]; };             // [L, H/16, B] sums of y^2

layout(push_constant) uniform Push {
    uint layer, parity;  // state half `parity` is old, 1 - parity new
    uint L, V;
    uint b_ih, b_hh;     // offsets in params
    uint g_prev;         // layer l-1's norm weight (l > 0); for l = 0, embedding.weight
    uint g_self;         // layer l's norm weight (y16 for the layer above)
    uint bos;
    float sqrt_h, eps;
} pc;

#define A_BUF act16
#define B_BUF w16
#define ACC_SHARED acc
#define FRAG_ONLY
#define ACC_FLOATS (ACC_PARTS * SF * 6 * 256)
// [k part - 1][SF][6 products][16 x 16]; then the whole sums
shared float acc[ACC_FLOATS];
shared float ss_part[SF * 16 * 4];   // [stream][4 quarters]: sums of y^2 of the layer below
shared float yy[SF * 16 * 16];       // [stream][unit]: (x + h)^2 of this slice, summed per stream
#include "sweep_frag.glsl"

const uint KF = H / 16u;             // k fragments
const uint SP = (B + 15u) / 16u * 16u;
const uint BLOCK = 256u;             // halves in a 16 x 16 block

// first half of act16 at block (stream fragment fb, k fragment kf) of layer l's h16, parity p
uint h16_block(uint p, uint l, uint fb, uint kf) { return (((p * pc.L + l) * (SP / 16u) + fb) * KF + kf) * BLOCK; }
uint y16_block(uint l, uint fb, uint kf) { return ((2u * pc.L * (SP / 16u) + l * (SP / 16u) + fb) * KF + kf) * BLOCK; }
// W_hh of layer l (w_ih false) or W_ih (l > 0): block (row block r, k fragment kf)
uint w_at(uint l, bool w_ih, uint r, uint kf) {
    uint mat = w_ih ? pc.L + l - 1u : l;
    return mat * 3u * H * H + (r * KF + kf) * BLOCK;
}
uint st(uint half_, uint l, uint b) { return ((half_ * pc.L + l) * B + b) * H; }

float gru_cell(float ai0, float ai1, float ai2, float ah0, float ah1, float ah2, float hold) {
    float r = sigmoid(ai0 + ah0), z = sigmoid(ai1 + ah1);
    float n = tanh_safe(ai2 + r * ah2);
    return (1.0 - z) * n + z * hold;
}

void main() {
    const uint nthreads = 32u * NSUB;
    uint tid = gl_LocalInvocationIndex, sub = tid / 32u;
    uint sf = sub % SF, kh = sub / SF;
    uint u = gl_WorkGroupID.x % KF, stile = gl_WorkGroupID.x / KF;
    uint b0 = stile * 16u * SF, j0 = u * 16u;
    uint l = pc.layer, oldh = pc.parity, newh = 1u - pc.parity;
    bool first = l == 0u;

    // the layer below's sums of y^2 for this tile's streams: 4 quarters of the H/16 slices each
    if (!first) {
        for (uint i = tid; i < SF * 16u * 4u; i += nthreads) {
            uint bl = i / 4u, q = i % 4u, b = b0 + bl;
            float s = 0.0;
            if (b < B)
                for (uint p = q; p < KF; p += 4u) s += ssq[((l - 1u) * KF + p) * B + b];
            ss_part[i] = s;
        }
    }

    // the products: stream fragment sf, k part kh, the loads of PD - 1 fragments' stages in flight
    uint fb = b0 / 16u + sf;
    bool live = fb * 16u < B;
    const uint NK = KF / KS;
    uint k_lo = kh * NK;
    uint r0 = u, r1 = u + KF, r2 = u + 2u * KF;  // row blocks of the 3 gates' units j0..j0+15
    ACC_T gh0 = ACC_ZERO(), gh1 = ACC_ZERO(), gh2 = ACC_ZERO();
    ACC_T gi0 = ACC_ZERO(), gi1 = ACC_ZERO(), gi2 = ACC_ZERO();
    FRAG_A rh[PD], ry[PD];
    FRAG_B rw[PD * 6u];  // stage s: W_hh's 3 gates at 6 s, W_ih's at 6 s + 3
#define LOAD_STAGE(s, kf) { \
        LOAD_ACT(rh[s], h16_block(oldh, l, fb, kf), 16u, false); \
        LOAD_W(rw[6u * (s)], w_at(l, false, r0, kf), 16u, true); \
        LOAD_W(rw[6u * (s) + 1u], w_at(l, false, r1, kf), 16u, true); \
        LOAD_W(rw[6u * (s) + 2u], w_at(l, false, r2, kf), 16u, true); \
        if (!first) { \
            LOAD_ACT(ry[s], y16_block(l - 1u, fb, kf), 16u, false); \
            LOAD_W(rw[6u * (s) + 3u], w_at(l, true, r0, kf), 16u, true); \
            LOAD_W(rw[6u * (s) + 4u], w_at(l, true, r1, kf), 16u, true); \
            LOAD_W(rw[6u * (s) + 5u], w_at(l, true, r2, kf), 16u, true); } }
    if (live) {
        RING_LOOP for (uint s = 0u; s + 1u < PD; ++s)
            if (s < NK) LOAD_STAGE(s, k_lo + s);
        for (uint i = 0u; i < NK; i += PD) {
            RING_LOOP for (uint s = 0u; s < PD; ++s) {  // stage s holds fragment i + s
                if (i + s < NK) {
                    if (i + s + PD - 1u < NK) LOAD_STAGE((s + PD - 1u) % PD, k_lo + i + s + PD - 1u);
                    gh0 = MUL_ADD(rh[s], rw[6u * s], gh0); gh1 = MUL_ADD(rh[s], rw[6u * s + 1u], gh1);
                    gh2 = MUL_ADD(rh[s], rw[6u * s + 2u], gh2);
                    if (!first) {
                        gi0 = MUL_ADD(ry[s], rw[6u * s + 3u], gi0); gi1 = MUL_ADD(ry[s], rw[6u * s + 4u], gi1);
                        gi2 = MUL_ADD(ry[s], rw[6u * s + 5u], gi2);
                    }
                }
            }
        }
    }
    // the k parts meet: parts 1.. store into their own slots, part 0 adds them in order (deterministic)
    // and stores the whole into the first slots, which the gates read
    // (a part's 3 or 6 sums: stored at word a of acc, or added from there)
#define STORE_SUMS(a) { \
        ACC_STORE(gh0, a, 16u); ACC_STORE(gh1, (a) + BLOCK, 16u); ACC_STORE(gh2, (a) + 2u * BLOCK, 16u); \
        if (!first) { ACC_STORE(gi0, (a) + 3u * BLOCK, 16u); ACC_STORE(gi1, (a) + 4u * BLOCK, 16u); \
                      ACC_STORE(gi2, (a) + 5u * BLOCK, 16u); } }
#define ADD_SUMS(a) { \
        ACC_T t; \
        ACC_LOAD(t, a, 16u); gh0 = ACC_ADD(gh0, t); ACC_LOAD(t, (a) + BLOCK, 16u); gh1 = ACC_ADD(gh1, t); \
        ACC_LOAD(t, (a) + 2u * BLOCK, 16u); gh2 = ACC_ADD(gh2, t); \
        if (!first) { ACC_LOAD(t, (a) + 3u * BLOCK, 16u); gi0 = ACC_ADD(gi0, t); \
                      ACC_LOAD(t, (a) + 4u * BLOCK, 16u); gi1 = ACC_ADD(gi1, t); \
                      ACC_LOAD(t, (a) + 5u * BLOCK, 16u); gi2 = ACC_ADD(gi2, t); } }
    uint a0 = sf * 6u * BLOCK;
#ifdef SEQ
    // part k2 stores into fragment sf's one slot, part 0 adds it, then the next part (2 barriers each)
    for (uint k2 = 1u; k2 < KS; ++k2) {
        if (live && kh == k2) STORE_SUMS(a0)
        barrier();
        if (live && kh == 0u) ADD_SUMS(a0)
        barrier();  // the slot read before the next part overwrites it
    }
#else
    if (KS > 1u) {
        if (live && kh > 0u) STORE_SUMS(((kh - 1u) * SF + sf) * 6u * BLOCK)
        barrier();
        if (live && kh == 0u)
            for (uint k2 = 1u; k2 < KS; ++k2) ADD_SUMS(((k2 - 1u) * SF + sf) * 6u * BLOCK)
        barrier();  // every part's slots read before part 0 overwrites the first ones
    }
#endif
    if (live && kh == 0u) STORE_SUMS(a0)
    barrier();

    // the gates: element (stream bl, unit jl) of the tile, 16 consecutive threads a stream
    for (uint e = tid; e < SF * 256u; e += nthreads) {
        uint bl = e / 16u, jl = e % 16u, b = b0 + bl, j = j0 + jl;
        float y2 = 0.0;
        if (b < B) {
            uint at = (bl / 16u) * 6u * BLOCK + (bl % 16u) * 16u + jl;  // (row, col) of fragment bl / 16
            uint tok = token[b];
            bool keep = tok != pc.bos, done = ctl[b * DS_WORDS + DS_DONE] != 0u;
            float hold = state[st(oldh, l, b) + j];
            float bh0 = params[pc.b_hh + j], bh1 = params[pc.b_hh + H + j], bh2 = params[pc.b_hh + 2u * H + j];
            // a <bos> stream starts from a zero state: its product is zero, gh its bias
            float ah0 = bh0 + (keep ? acc[at] : 0.0), ah1 = bh1 + (keep ? acc[at + BLOCK] : 0.0);
            float ah2 = bh2 + (keep ? acc[at + 2u * BLOCK] : 0.0);
            float ai0, ai1, ai2, x;
            if (first) {
                float t0 = 0.0, t1 = 0.0, t2 = 0.0, emb = 0.0;
                if (tok < pc.V) {  // a token outside the vocabulary is a zero row (as the batched gather)
                    t0 = table0[tok * 3u * H + j]; t1 = table0[tok * 3u * H + H + j];
                    t2 = table0[tok * 3u * H + 2u * H + j]; emb = params[pc.g_prev + tok * H + j];
                }
                ai0 = t0 * pc.sqrt_h; ai1 = t1 * pc.sqrt_h; ai2 = t2 * pc.sqrt_h;
                x = emb * pc.sqrt_h;
            } else {
                uint q = bl * 4u;
                float ss = ss_part[q] + ss_part[q + 1u] + ss_part[q + 2u] + ss_part[q + 3u];
                float rstd = 1.0 / sqrt(ss / float(H) + pc.eps);
                ai0 = acc[at + 3u * BLOCK] * rstd; ai1 = acc[at + 4u * BLOCK] * rstd;
                ai2 = acc[at + 5u * BLOCK] * rstd;
                x = ysum[((l - 1u) * B + b) * H + j] * rstd * params[pc.g_prev + j];
            }
            float bi0 = params[pc.b_ih + j], bi1 = params[pc.b_ih + H + j], bi2 = params[pc.b_ih + 2u * H + j];
            float h = done ? hold : gru_cell(ai0 + bi0, ai1 + bi1, ai2 + bi2, ah0, ah1, ah2, keep ? hold : 0.0);
            float y = x + h;
            state[st(newh, l, b) + j] = h;
            ysum[(l * B + b) * H + j] = y;
            uint in_blk = (b % 16u) * 16u + jl;  // this slice u is k fragment u of the products that read these
            act16[h16_block(newh, l, b / 16u, u) + in_blk] = float16_t(h);
            act16[y16_block(l, b / 16u, u) + in_blk] = float16_t(y * params[pc.g_self + j]);
            y2 = y * y;
        }
        yy[e] = y2;
    }
    barrier();
    // this slice's sums of y^2, a stream each, in unit order
    for (uint bl = tid; bl < SF * 16u; bl += nthreads) {
        uint b = b0 + bl;
        if (b >= B) continue;
        float s = 0.0;
        for (uint jl = 0u; jl < 16u; ++jl) s += yy[bl * 16u + jl];
        ssq[(l * KF + u) * B + b] = s;
    }
}
