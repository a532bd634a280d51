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

void decode_layer_wg(uint wg, DecodeLayerArgs a) {
    uint nsub = gl_NumSubgroups, lane = gl_SubgroupInvocationID, lanes = gl_SubgroupSize;
    uint j = (wg % pc.units_wgs) * nsub + gl_SubgroupID;
    uint b0 = (wg / pc.units_wgs) * SB;
    if (j >= H) return;  // whole subgroups only: the subgroup operations below stay uniform
    uint l = a.layer, oldh = a.parity, newh = 1u - a.parity;
    bool first = l == 0u;
    const uint HW = H / W;  // k steps of W floats

    float ai[3][SB], ah[3][SB], ss[SB], keep[SB];
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        ss[s] = 0.0;
        uint b = b0 + s;
        keep[s] = (b < B && token[b] != pc.bos) ? 1.0 : 0.0;  // <bos>: the state entering is zero
        [[unroll]] for (uint g = 0u; g < 3u; ++g) { ai[g][s] = 0.0; ah[g][s] = 0.0; }
    }
    // what the end needs, loaded before the k loop so its latency hides behind the dot products
    float bi0 = params1[a.b_ih + j], bi1 = params1[a.b_ih + H + j], bi2 = params1[a.b_ih + 2u * H + j];
    float bh0 = params1[a.b_hh + j], bh1 = params1[a.b_hh + H + j], bh2 = params1[a.b_hh + 2u * H + j];
    float gj = first ? 0.0 : params1[a.g_prev + j];
#ifdef HALF
    float g_self = params1[a.g_self + j];
#endif
    float hold_j[SB], y_j[SB];
    bool done[SB];
    [[unroll]] for (uint s = 0u; s < SB; ++s) {
        uint b = min(b0 + s, B - 1u);
        hold_j[s] = state1[st(oldh, l, b) + j];
        y_j[s] = first ? 0.0 : ysum1[((l - 1u) * B + b) * H + j];
        done[s] = ctl[b * DS_WORDS + DS_DONE] != 0u;
    }
    uint wh = a.w_hh / W + j * HW, wi = a.w_ih / W + j * HW;
    [[unroll]] for (uint k = lane; k < HW; k += lanes) {
        VT wh0 = WLOAD(wh + k), wh1 = WLOAD(wh + H * HW + k), wh2 = WLOAD(wh + 2u * H * HW + k);
        VT wi0 = VT(0.0), wi1 = VT(0.0), wi2 = VT(0.0);
#ifndef HALF
        VT gk = first ? VT(0.0) : params[a.g_prev / W + k];  // the norm weight at k (HALF: folded into y16)
#endif
        if (!first) { wi0 = WLOAD(wi + k); wi1 = WLOAD(wi + H * HW + k); wi2 = WLOAD(wi + 2u * H * HW + k); }
        [[unroll]] for (uint s = 0u; s < SB; ++s) {
            uint b = b0 + s;
            if (b >= B) break;  // uniform in the subgroup
#ifdef HALF
            VT hold = VT(a16[st(oldh, l, b) / W + k]) * keep[s];
#else
            VT hold = state[st(oldh, l, b) / W + k] * keep[s];
#endif
            ah[0][s] += DOT(wh0, hold); ah[1][s] += DOT(wh1, hold); ah[2][s] += DOT(wh2, hold);
            if (!first) {
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
        float gh0 = subgroupAdd(ah[0][s]), gh1 = subgroupAdd(ah[1][s]), gh2 = subgroupAdd(ah[2][s]);
        float gi0, gi1, gi2, x;
        if (first) {
            layer0_input(token[b], j, a.g_prev, gi0, gi1, gi2, x);
        } else {
            float rstd = 1.0 / sqrt(subgroupAdd(ss[s]) / float(H) + pc.eps);
            gi0 = subgroupAdd(ai[0][s]) * rstd; gi1 = subgroupAdd(ai[1][s]) * rstd;
            gi2 = subgroupAdd(ai[2][s]) * rstd;
            x = y_j[s] * rstd * gj;
        }
        if (lane == 0u) {
            float h = done[s] ? hold_j[s]
                              : gru_cell(gi0 + bi0, gi1 + bi1, gi2 + bi2, gh0 + bh0, gh1 + bh1, gh2 + bh2,
                                         hold_j[s] * keep[s]);
            state1[st(newh, l, b) + j] = h;
            ysum1[(l * B + b) * H + j] = x + h;
#ifdef HALF
            a16s[st(newh, l, b) + j] = float16_t(h);
            a16s[y16_at(l, b) + j] = float16_t((x + h) * g_self);
#endif
        }
    }
}
#endif
