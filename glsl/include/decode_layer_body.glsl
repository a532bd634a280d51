// The body of a decode layer step (glsl/decode_layer.comp's, and the persistent decoder's layer stage,
// glsl/decode_persistent.comp): workgroup `wg`'s units and stream tile of layer a.layer, reading state
// half a.parity. The includer declares the buffers (params / params1, table0, state / state1, ysum /
// ysum1, token, ctl; HALF: w16, a16, a16s), the spec constants SB, H and B, vec4_loads.glsl's W and VT,
// and push constants pc.L, pc.V, pc.units_wgs, pc.bos, pc.sqrt_h and pc.eps.
#ifndef CATCHAT_DECODE_LAYER_BODY_GLSL
#define CATCHAT_DECODE_LAYER_BODY_GLSL

// What differs between layers: offsets in params (HALF: the weights' in w16) and the state half read.
struct DecodeLayerArgs {
    uint layer, parity;
    uint w_ih, w_hh, b_ih, b_hh;
    uint g_prev;  // layer l-1's norm weight (l > 0); for l = 0, embedding.weight
    uint g_self;  // layer l's norm weight (HALF: y16 for the layer above)
};

uint st(uint half_, uint l, uint b) { return ((half_ * pc.L + l) * B + b) * H; }  // in floats
uint y16_at(uint l, uint b) { return ((2u * pc.L + l) * B + b) * H; }  // HALF: y16 in a16, in halves

// Layer 0's input side at unit j for token `tok` (emb: embedding.weight's offset): gi (table0 row
// times sqrt(H)) and x = E[tok, j] sqrt(H).
// A token outside the vocabulary is a zero row (as the batched gather).
void layer0_input(uint tok, uint j, uint emb, out float gi0, out float gi1, out float gi2, out float x) {
    float t0 = 0.0, t1 = 0.0, t2 = 0.0, e = 0.0;
    if (tok < pc.V) {
        t0 = table0[tok * 3u * H + j]; t1 = table0[tok * 3u * H + H + j];
        t2 = table0[tok * 3u * H + 2u * H + j]; e = params1[emb + tok * H + j];
    }
    gi0 = t0 * pc.sqrt_h; gi1 = t1 * pc.sqrt_h; gi2 = t2 * pc.sqrt_h;
    x = e * pc.sqrt_h;
}

// The GRU cell from the pre-activations with their biases added; hold is the state entering
// (already zero after a <bos>).
float gru_cell(float ai0, float ai1, float ai2, float ah0, float ah1, float ah2, float hold) {
    float r = sigmoid(ai0 + ah0), z = sigmoid(ai1 + ah1);
    float n = tanh_safe(ai2 + r * ah2);
    return (1.0 - z) * n + z * hold;
}

// Unit j's new state of stream b from its pre-activation sums (gh already zero after a <bos>) and the
// biases, stored with x + h (HALF: their float16 shadows); a stopped stream keeps its state.
void unit_out(uint l, uint newh, uint b, uint j, vec3 gi, vec3 gh, vec3 bi, vec3 bh, float x, float hold,
              float keep, bool done, float g_self) {
    float h = done ? hold : gru_cell(gi.x + bi.x, gi.y + bi.y, gi.z + bi.z, gh.x + bh.x, gh.y + bh.y, gh.z + bh.z,
                                     hold * keep);
    state1[st(newh, l, b) + j] = h;
    ysum1[(l * B + b) * H + j] = x + h;
#ifdef HALF
    a16s[st(newh, l, b) + j] = float16_t(h);
    a16s[y16_at(l, b) + j] = float16_t((x + h) * g_self);
#endif
}

vec3 bias3(uint at, uint j) { return vec3(params1[at + j], params1[at + H + j], params1[at + 2u * H + j]); }

// What a layer step's workgroup does (the persistent decoder splits a step's products; the fused step
// runs LAYER_FULL): LAYER_FULL both sums and the gates; LAYER_HIDDEN only W_hh times the state entering,
// stored in ghp for the next step (DECODE_DEFER); LAYER_INPUT the input's sums and the gates with ghp's.
// Each sum is taken in the same order whichever mode runs it, so the modes make the same bits.
const uint LAYER_FULL = 0u, LAYER_HIDDEN = 1u, LAYER_INPUT = 2u;

// ghp: [L, B, 3, H] each layer's W_hh sums for its next step, before the <bos> reset (DECODE_DEFER)
uint ghp_at(uint l, uint b, uint g, uint j) { return ((l * B + b) * 3u + g) * H + j; }

void decode_layer_wg(uint wg, DecodeLayerArgs a, uint mode) {
    uint nsub = gl_NumSubgroups, lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
    uint j = (wg % pc.units_wgs) * nsub + gl_SubgroupID;
    uint b0 = (wg / pc.units_wgs) * SB;
    if (j >= H) return;  // whole subgroups only: the subgroup operations below stay uniform
    uint l = a.layer, oldh = a.parity, newh = 1u - a.parity;
    bool first = l == 0u, hidden = mode != LAYER_INPUT, inputs = mode != LAYER_HIDDEN && !first;
    const uint HW = H / W;  // k steps of W floats

    float ai[3][SB], ah[3][SB], ss[SB], keep[SB];
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        ss[s] = 0.0;
        uint b = b0 + s;
        keep[s] = (b < B && token[b] != pc.bos) ? 1.0 : 0.0;  // <bos>: the state entering is zero
        [[unroll]] for (uint g = 0u; g < 3u; ++g) { ai[g][s] = 0.0; ah[g][s] = 0.0; }
    }
    // what the end needs, loaded before the k loop so its latency hides behind the dot products
    vec3 bi = vec3(0.0), bh = vec3(0.0), ghd[SB];
    float gj = 0.0, g_self = 0.0, hold_j[SB], y_j[SB];
    bool done[SB];
    if (mode != LAYER_HIDDEN) {
        bi = bias3(a.b_ih, j); bh = bias3(a.b_hh, j);
        gj = first ? 0.0 : params1[a.g_prev + j];
#ifdef HALF
        g_self = params1[a.g_self + j];
#endif
        [[unroll]] for (uint s = 0u; s < SB; ++s) {
            uint b = min(b0 + s, B - 1u);
            hold_j[s] = state1[st(oldh, l, b) + j];
            y_j[s] = first ? 0.0 : ysum1[((l - 1u) * B + b) * H + j];
            done[s] = ctl[b * DS_WORDS + DS_DONE] != 0u;
#ifdef DECODE_DEFER
            if (mode == LAYER_INPUT) ghd[s] = vec3(ghp[ghp_at(l, b, 0u, j)], ghp[ghp_at(l, b, 1u, j)], ghp[ghp_at(l, b, 2u, j)]);
#endif
        }
    }
    uint wh = a.w_hh / W + j * HW, wi = a.w_ih / W + j * HW;
    [[unroll]] for (uint k = lane; k < HW; k += lanes) {
        VT wh0 = VT(0.0), wh1 = VT(0.0), wh2 = VT(0.0), wi0 = VT(0.0), wi1 = VT(0.0), wi2 = VT(0.0);
        if (hidden) { wh0 = WLOAD(wh + k); wh1 = WLOAD(wh + H * HW + k); wh2 = WLOAD(wh + 2u * H * HW + k); }
#ifndef HALF
        VT gk = inputs ? params[a.g_prev / W + k] : VT(0.0);  // the norm weight at k (HALF: folded into y16)
#endif
        if (inputs) { wi0 = WLOAD(wi + k); wi1 = WLOAD(wi + H * HW + k); wi2 = WLOAD(wi + 2u * H * HW + k); }
        [[unroll]] for (uint s = 0u; s < SB; ++s) {
            uint b = b0 + s;
            if (b >= B) break;  // uniform in the subgroup
            if (hidden) {
#ifdef HALF
                VT hold = VT(a16[st(oldh, l, b) / W + k]);
#else
                VT hold = state[st(oldh, l, b) / W + k];
#endif
                ah[0][s] += DOT(wh0, hold); ah[1][s] += DOT(wh1, hold); ah[2][s] += DOT(wh2, hold);
            }
            if (inputs) {
                VT y = ysum[((l - 1u) * B + b) * HW + k];
                ss[s] += DOT(y, y);
#ifdef HALF
                VT yg = VT(a16[y16_at(l - 1u, b) / W + k]);
#else
                VT yg = y * gk;
#endif
                ai[0][s] += DOT(wi0, yg); ai[1][s] += DOT(wi1, yg); ai[2][s] += DOT(wi2, yg);
            }
        }
    }
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        uint b = b0 + s;
        if (b >= B) break;
        vec3 gh = vec3(0.0);
        if (hidden) gh = vec3(subgroupAdd(ah[0][s]), subgroupAdd(ah[1][s]), subgroupAdd(ah[2][s]));
#ifdef DECODE_DEFER
        if (mode == LAYER_HIDDEN) {
            if (lane == 0u) { ghp[ghp_at(l, b, 0u, j)] = gh.x; ghp[ghp_at(l, b, 1u, j)] = gh.y; ghp[ghp_at(l, b, 2u, j)] = gh.z; }
            continue;
        }
        if (mode == LAYER_INPUT) gh = ghd[s];
#endif
        gh = keep[s] != 0.0 ? gh : vec3(0.0);  // after a <bos> the state entering is zero
        vec3 gi;
        float x;
        if (first) {
            layer0_input(token[b], j, a.g_prev, gi.x, gi.y, gi.z, x);
        } else {
            float rstd = 1.0 / sqrt(subgroupAdd(ss[s]) / float(H) + pc.eps);
            gi = vec3(subgroupAdd(ai[0][s]) * rstd, subgroupAdd(ai[1][s]) * rstd, subgroupAdd(ai[2][s]) * rstd);
            x = y_j[s] * rstd * gj;
        }
        if (lane == 0u) unit_out(l, newh, b, j, gi, gh, bi, bh, x, hold_j[s], keep[s], done[s], g_self);
    }
}

#ifdef DECODE_DEFER
// Layer 0 of stream b from its deferred W_hh sums (ghp), by one workgroup, a unit a thread at a time: the
// persistent decoder's last head workgroup runs it right after the choice, so a step's first layer
// costs no crossing of its own. The same arithmetic as LAYER_FULL at layer 0.
void decode_layer0_deferred(uint b, DecodeLayerArgs a) {
    uint newh = 1u - a.parity, tok = token[b];
    float keep = tok != pc.bos ? 1.0 : 0.0;
    bool done = ctl[b * DS_WORDS + DS_DONE] != 0u;
    const uint T = gl_WorkGroupSize.x, U = (H + T - 1u) / T;
    [[unroll]] for (uint u = 0u; u < U; ++u) {
        uint j = gl_LocalInvocationIndex + u * T;
        if (j >= H) break;
        vec3 gh = vec3(ghp[ghp_at(0u, b, 0u, j)], ghp[ghp_at(0u, b, 1u, j)], ghp[ghp_at(0u, b, 2u, j)]);
        gh = keep != 0.0 ? gh : vec3(0.0);
        vec3 gi;
        float x, g_self = 0.0;
#ifdef HALF
        g_self = params1[a.g_self + j];
#endif
        layer0_input(tok, j, a.g_prev, gi.x, gi.y, gi.z, x);
        unit_out(0u, newh, b, j, gi, gh, bias3(a.b_ih, j), bias3(a.b_hh, j), x, state1[st(a.parity, 0u, b) + j],
                 keep, done, g_self);
    }
}
#endif
#endif
