// The bias gradients summed inside a backward sweep (BIAS_SUMS: its value is the binding of `bsum`),
// so that no column sums over dGi's and dGh's [T*B] rows follow the sweep. Element (b, k)'s gate
// backward of each step adds (dar, daz, dan, r dan) into bsum's row b [6H]: columns k, H + k, 2H + k are
// db_ih's r, z, n and 3H + k, 4H + k, 5H + k db_hh's (r and z take gi + gh, so their gradients are
// dGi's). An element a thread owns for the whole dispatch is summed in its registers and stored once at
// the dispatch's end (`bias_finish`); any other is stored at once, step by step (`bias_add`, hold false).
// Either way an element's sum runs over s = T, T-1, ... in order, and its step s = T (the sweep's
// first dispatch) writes rather than adds, so bsum needs no zeroing. Two column sums over the B rows
// (ColSum) finish db_ih and db_hh. The includer declares pc (H, T).
#ifndef CATCHAT_GRU_BIAS_SUMS_GLSL
#define CATCHAT_GRU_BIAS_SUMS_GLSL

layout(set = 0, binding = BIAS_SUMS) buffer BiasSums { float bsum[]; };  // [B][6H]
vec4 bias_acc = vec4(0.0);  // the held element's sums over this dispatch's steps so far
bool bias_held = false;     // bias_acc holds something to store
bool bias_top = false;      // ... step s = T's among it: the store writes rather than adds

void bias_store(bool top, uint b, uint k, vec4 v) {
    uint H = pc.H, e = b * 6u * H + k;
    if (!top) v += vec4(bsum[e], bsum[e + H], bsum[e + 2u * H], bsum[e + 5u * H]);
    bsum[e] = v.x;
    bsum[e + H] = v.y;
    bsum[e + 2u * H] = v.z;
    bsum[e + 3u * H] = v.x;
    bsum[e + 4u * H] = v.y;
    bsum[e + 5u * H] = v.w;
}

// Step s's dg = (dar, daz, dan, r dan) of element (b, k) (the gate backward of step s-1): held in
// registers (the thread's one element), or stored now.
void bias_add(bool hold, uint s, uint b, uint k, vec4 dg) {
    if (!hold) {
        bias_store(s == pc.T, b, k, dg);
        return;
    }
    bias_acc += dg;
    bias_held = true;
    bias_top = bias_top || s == pc.T;
}

// The dispatch's end: the held element (b, k) stores what its steps summed.
void bias_finish(uint b, uint k) {
    if (bias_held) bias_store(bias_top, b, k, bias_acc);
}
#endif
