#version 450
// A chunk of decode steps in one dispatch (the "persistent" decode steps, docs/generation.md): pc.steps
// steps, each the L layers, the head and the choice that glsl/decode_layer.comp, decode_head.comp and
// decode_sample.comp (HEAD_PARTS) run as L + 2 dispatches, here from the same bodies
// (glsl/include/decode_{layer,head,sample}_body.glsl, so the same bits) in L crossings a step. At one
// stream a step is latency: every stage does little, so the crossings are the cost, and two go:
// - a layer's W_hh sums need only its own state, so they are taken a step ahead in the wait after the
//   layer above has arrived (ghp), and a layer's stage is its input's sums and the gates;
// - the head's last workgroup to arrive (an atomic count, not a barrier) makes the choices and then
//   layer 0 of the next step, which is a table row and those sums: one crossing for head, choice and
//   layer 0.
// Workgroup g of the grid runs a stage's workgroups g, g + grid, ... (a layer's units_wgs x stream tiles,
// the head's parts), with a workgroup barrier after each head part (they reuse shared memory). The host
// launches only workgroups shown co-resident (one per SM, else one); a wait that gives up counts
// stats[ST_SYNC_TIMEOUTS] and every later one returns at once, so the chunk runs out with tokens the
// host then refuses. Step k reads state half k % 2 (a chunk's steps are even, so it starts and ends on
// half 0) and chooses into row k of outp. Every buffer one workgroup writes and another reads after a
// crossing is coherent (past the non-coherent L1).
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#ifdef HALF
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0) in;  // >= V and a whole number of subgroups (a unit each in a layer)
layout(constant_id = 1) const uint SB = 1;   // the layers' streams per subgroup (register tile)
layout(constant_id = 2) const uint H = 1;
layout(constant_id = 3) const uint B = 1;
layout(constant_id = 4) const uint KR = 1;   // the head's k steps per part
layout(constant_id = 5) const uint KP = 1;   // the head's parts
layout(constant_id = 6) const uint HSB = 1;  // the head's streams per workgroup
#define HEAD_SB HSB
#define HEAD_PARTS 1

#include "vec4_loads.glsl"
#ifdef HALF
#ifdef VEC4
#define HT f16vec4
#else
#define HT float16_t
#endif
layout(set = 0, binding = 16) readonly buffer W16 { HT w16[]; };         // float16 W_hh, W_ih copies
layout(set = 0, binding = 17) coherent buffer A16 { HT a16[]; };         // h16, then y16
layout(set = 0, binding = 17) coherent buffer A16s { float16_t a16s[]; };
#define WLOAD(i) VT(w16[i])
#else
#define WLOAD(i) params[i]
#endif

layout(set = 0, binding = 0) readonly buffer P { VT params[]; };
layout(set = 0, binding = 0) readonly buffer P1 { float params1[]; };
layout(set = 0, binding = 1) readonly buffer T0 { float table0[]; };     // [V, 3H]
layout(set = 0, binding = 2) coherent buffer S { VT state[]; };           // [2, L, B, H] ping-pong
layout(set = 0, binding = 2) coherent buffer S1 { float state1[]; };
layout(set = 0, binding = 3) coherent buffer Y { VT ysum[]; };            // [L, B, H] x + h of each layer
layout(set = 0, binding = 3) coherent buffer Y1 { float ysum1[]; };
layout(set = 0, binding = 4) coherent buffer Tok { uint token[]; };       // [B] the next step's input
layout(set = 0, binding = 5) coherent buffer Ctl { uint ctl[]; };         // [B, DS_WORDS]
layout(set = 0, binding = 6) coherent buffer Hp { float parts[]; };       // [KP, B, V] sums, then [KP, B] ss
layout(set = 0, binding = 7) coherent buffer Lg { float logits[]; };      // [B, V]
layout(set = 0, binding = 8) readonly buffer Cfg { uint cfg[]; };         // [DC_WORDS]
layout(set = 0, binding = 9) readonly buffer Forced { uint forced[]; };   // [F, B]
layout(set = 0, binding = 10) coherent buffer Hist { uint hist[]; };      // [cap, B]
layout(set = 0, binding = 11) writeonly buffer Out { uint outp[]; };      // [K, B]
layout(set = 0, binding = 12) readonly buffer Lay { uint lay[]; };        // [L, 8] DecodeLayerArgs by layer
layout(set = 0, binding = 14) buffer Stats { uint stats[]; };
layout(set = 0, binding = 15) coherent buffer Ghp { float ghp[]; };      // [L, B, 3, H] deferred W_hh sums
#define DECODE_DEFER 1
#define SYNC_BINDING 13
#include "grid_sync.glsl"
#define SET_TOKEN(b, t) token[b] = (t)

layout(push_constant) uniform Push {
    uint L, V;
    uint units_wgs, bos;  // a layer's workgroups along units: ceil(H / subgroups a workgroup)
    float sqrt_h, eps;
    uint w_head, g_last, kp;  // the head: W_head's and the last norm weight's offsets, its parts (KP)
    uint B, cap, pad, eos, H;  // the choice's (B and H as the spec constants)
    uint steps;  // this chunk's (even)
} pc;

#include "decode_layer_body.glsl"
#include "decode_head_body.glsl"
#include "decode_sample_body.glsl"

// Layer l's offsets (the host's lay table) reading state half `parity`.
DecodeLayerArgs layer_args(uint l, uint parity) {
    uint o = l * 8u;
    return DecodeLayerArgs(l, parity, lay[o + 2u], lay[o + 3u], lay[o + 4u], lay[o + 5u], lay[o + 6u], lay[o + 7u]);
}

// Sync words beside the grid barrier's (group 0): the head stage's arrivals and the last one's release.
const uint HEAD_ARRIVALS = 1u, HEAD_RELEASE = 2u;
shared uint head_rank;

// After this workgroup's head parts: counts it in and returns its place among step k's arrivals (the
// last, n - 1, sees every part, as a grid barrier's waiter would).
uint head_arrive(uint k) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        head_rank = atomicAdd(sync_words[group_word(HEAD_ARRIVALS)], 1u) - k * n_workgroups();
        memoryBarrierBuffer();
    }
    barrier();
    return head_rank;
}

// Workgroup g's (of `among`) share of layer l's unit workgroups in `mode`, reading state half `parity`.
void layer_share(uint g, uint among, uint l, uint parity, uint mode) {
    uint layer_wgs = pc.units_wgs * ((B + SB - 1u) / SB);
    DecodeLayerArgs a = layer_args(l, parity);
    for (uint w = g; w < layer_wgs; w += among) decode_layer_wg(w, a, mode);  // no shared memory
}

// Step k's crossings: one after each layer above the first (LAYER_INPUT, its W_hh sums taken a step
// ahead), then the head's parts, whose last workgroup makes the choices and layer 0 of step k + 1 (from
// W_hh sums the layers' spare time took) and releases the rest. W_hh sums of layer l for step k + 1
// fill the wait after layer l + 1's arrival, the last layer's the head's (by every workgroup but the
// last, which is busy; at L <= 2 before the head's arrival); a chunk's first step takes layer 0 whole
// and the rest's sums first. Sums a workgroup takes in a wait are read only after that workgroup's
// next arrival (a layer's or the head's), so every reader sees them.
void main() {
    uint grid = gl_NumWorkGroups.x, g = gl_WorkGroupID.x;
    uint head_wgs = pc.kp * ((B + HSB - 1u) / HSB);
    uint crossing = 0u;
    layer_share(g, grid, 0u, 0u, LAYER_FULL);
    for (uint l = 1u; l < pc.L; ++l) layer_share(g, grid, l, 0u, LAYER_HIDDEN);
    bool ok = grid_sync(++crossing);  // uniform: grid_sync's answer is the workgroup's
    for (uint k = 0u; ok && k < pc.steps; ++k) {
        uint par = k & 1u;
        bool more = k + 1u < pc.steps;
        for (uint l = 1u; ok && l < pc.L; ++l) {
            layer_share(g, grid, l, par, LAYER_INPUT);
            grid_arrive();
            if (more) layer_share(g, grid, l - 1u, 1u - par, LAYER_HIDDEN);
            ok = grid_wait(++crossing);
        }
        if (!ok) break;
        for (uint w = g; w < head_wgs; w += grid) {
            decode_head_wg(w);
            barrier();  // the next part's staging reuses ys
        }
        // The last layer's W_hh sums: where no crossing lies between the release and that layer's next
        // stage (L <= 2: layer 0 is the last workgroup's at once, layer 1 the next step's first stage),
        // before the arrival; else in the wait for the release, by all but the last workgroup.
        bool ahead = more && pc.L >= 3u;
        if (more && !ahead) layer_share(g, grid, pc.L - 1u, 1u - par, LAYER_HIDDEN);
        uint rank = head_arrive(k);
        if (rank == grid - 1u) {
            for (uint b = 0u; b < B; ++b) {
                decode_choose(b, k);
                barrier();  // the next stream's choice reuses z, p and banned
            }
            if (more) {
                memoryBarrierBuffer();  // this workgroup's tokens and ctl before layer 0 reads them
                barrier();
                for (uint b = 0u; b < B; ++b) decode_layer0_deferred(b, layer_args(0u, 1u - par));
            }
            group_arrive(HEAD_RELEASE);
            if (grid == 1u && ahead) layer_share(0u, 1u, pc.L - 1u, 1u - par, LAYER_HIDDEN);
        } else {
            if (ahead) layer_share(rank, grid - 1u, pc.L - 1u, 1u - par, LAYER_HIDDEN);
            ok = group_wait(k + 1u, HEAD_RELEASE, 1u);
        }
    }
    grid_sync_done(3u);
}
