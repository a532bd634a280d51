// The element work of the streamed backward sweeps (glsl/gru_backward_stream.comp,
// glsl/gru_backward_ksplit.comp): what a step needs from memory for element (b, k) besides the
// product, the finish of dh and the gate backward of the step before, and the writes nothing in the
// dispatch reads but the element's own thread. The includer declares the buffers dO, save (SAVE_R),
// hprev, resets, dh0, dgh, dgi, dhz_mem, the push constants pc (s, T, B, H and the offsets) and
// G_STORE (the float16 shadow's store).
#ifndef CATCHAT_GRU_BACKWARD_ELEMENT_GLSL
#define CATCHAT_GRU_BACKWARD_ELEMENT_GLSL

#ifdef BIAS_SUMS  // include/gru_bias_sums.glsl: the bias gradients summed in the sweep
#include "gru_bias_sums.glsl"
bool bias_walk = false;  // set by main: the workgroup walks several items, so no element stays a thread's
#endif

// What step s needs from memory for element (b, k), besides the product: do, r, z, n, ghn, hprev
// of step s-1 (the gate backward; 0 at s = 0) and 1 - reset of step s (0 at s = T). hprev gets its
// reset here, and a row the reset cut is written back as the state it stands for.
float[7] step_inputs(uint s, uint b, uint k) {
    float[7] v = float[7](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    if (s > 0u) {
        uint H = pc.H, row = (s - 1u) * pc.B + b, sb = pc.save_off + row * 4u * H, hi = pc.hprev_off + row * H + k;
        float hp = hprev[hi] * (1.0 - float(resets[row]));
        v = float[7](dO[pc.do_off + row * H + k], SAVE_R(sb + k), SAVE_R(sb + H + k), SAVE_R(sb + 2u * H + k),
                     SAVE_R(sb + 3u * H + k), hp, 0.0);
    }
    if (s < pc.T) {
        v[6] = 1.0 - float(resets[s * pc.B + b]);
        // the row the reset cut, written as the state it stands for (for dW_hh): row s at step s, after the
        // gate backward of s read it, and after the norm backward of the chunk below the layer wavefront's
        // chunk that ends at s read it as step s-1's output
        if (v[6] == 0.0) hprev[pc.hprev_off + (s * pc.B + b) * pc.H + k] = 0.0;
    }
    return v;
}

// Element (b, k) of step s, given mm = its entry of dGh[s] @ W_hh (s < T), its running gradient
// dhz and in_u = step_inputs(s): finishes dh into h_{s-1} (clamp c, 0 = off; dh0 at s = 0), then
// the gate backward of step s-1: writes g16 (what the grid barrier publishes) and returns, for
// element_writes, dg = (dar, daz, dan, r * dan) and the next dhz; false at s = 0 (nothing to write).
bool element(uint s, uint b, uint k, float mm, float dhz, float[7] in_u, float c, inout uint hits, out vec4 dg,
             out float dhz_next) {
    uint H = pc.H;
    float d = 0.0;
    dg = vec4(0.0);
    dhz_next = 0.0;
    if (s < pc.T) {
        d = (dhz + mm) * in_u[6];
        if (c > 0.0 && s >= 1u && abs(d) > c) { hits += 1u; d = clamp(d, -c, c); }
        if (s == 0u) dh0[pc.dh0_off + b * H + k] = d;
    }
    if (s == 0u) return false;
    float r = in_u[1], z = in_u[2], n = in_u[3];
    float dht = d + in_u[0];
    float dn = dht * (1.0 - z);
    float dz = dht * (in_u[5] - n);
    float dan = dn * (1.0 - n * n);
    float daz = dz * z * (1.0 - z);
    float dar = dan * in_u[4] * r * (1.0 - r);
    dg = vec4(dar, daz, dan, dan * r);
    dhz_next = dht * z;
    [[unroll]] for (uint q = 0u; q < 3u; ++q) {
        G_STORE((s - 1u) % 2u, b, q * H + k, 3u * H, q == 2u ? dg.w : dg[q]);
    }
    return true;
}

// The rest of element (b, k)'s step s-1: dGh[s-1]'s float32 row, dGi[s-1], dhz. Nothing else in the
// dispatch reads them but this thread (dhz), so the last slice of a step writes them after the grid
// barrier's arrival: its memory barrier then waits for g16's writes alone.
void element_writes(uint s, uint b, uint k, vec4 dg, float dhz_next) {
    uint H = pc.H, row = (s - 1u) * pc.B + b, gb = pc.dgh_off + row * pc.dgh_ld, ib = pc.dgi_off + row * 3u * H;
#ifdef SAVE16  // dGh's n third alone, rows dgh_ld = H apart: its r and z thirds are dGi's (the same numbers)
    dgh[gb + k] = dg.w;
#else
    dgh[gb + k] = dg.x;
    dgh[gb + H + k] = dg.y;
    dgh[gb + 2u * H + k] = dg.w;
#endif
    dgi[ib + k] = dg.x;
    dgi[ib + H + k] = dg.y;
    dgi[ib + 2u * H + k] = dg.z;
    dhz_mem[b * H + k] = dhz_next;
#ifdef BIAS_SUMS
    bias_add(!bias_walk, s, b, k, dg);
#endif
}
#endif
