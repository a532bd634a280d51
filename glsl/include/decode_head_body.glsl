// The body of the decode head (glsl/decode_head.comp's, and the persistent decoder's head stage,
// glsl/decode_persistent.comp): workgroup `wg` = (part p, stream tile) of the head's k parts. The includer
// declares params and ysum (VT), parts, the spec constants H, B and KR, HEAD_SB (streams a workgroup;
// SB where it is not defined) and push constants pc.L, pc.V, pc.w_head, pc.g_last and pc.kp.
#ifndef CATCHAT_DECODE_HEAD_BODY_GLSL
#define CATCHAT_DECODE_HEAD_BODY_GLSL
#ifndef HEAD_SB
#define HEAD_SB SB
#endif

shared VT ys[HEAD_SB * KR];  // ys[s * KR + i] = y[b0 + s, k0 + i] (0 past B, H)

void decode_head_wg(uint wg) {
    const uint HW = H / W;
    uint tid = gl_LocalInvocationIndex, p = wg % pc.kp, b0 = (wg / pc.kp) * HEAD_SB;
    uint k0 = p * KR, y0 = (pc.L - 1u) * B * HW, v = tid;
    // this thread's row part of W_head g, loaded before the staging so both wait on memory at once
    VT wk[KR];
    uint wrow = pc.w_head / W + v * HW, g0 = pc.g_last / W;
    [[unroll]] for (uint i = 0u; i < KR; ++i)
        wk[i] = (v < pc.V && k0 + i < HW) ? params[wrow + k0 + i] * params[g0 + k0 + i] : VT(0.0);
    for (uint e = tid; e < HEAD_SB * KR; e += gl_WorkGroupSize.x) {
        uint s = e / KR, k = k0 + e % KR;
        ys[e] = (b0 + s < B && k < HW) ? ysum[y0 + (b0 + s) * HW + k] : VT(0.0);
    }
    barrier();
    if (tid < HEAD_SB && b0 + tid < B) {  // this part's sum of squares of stream b0 + tid, in k order
        float ss = 0.0;
        [[unroll]] for (uint i = 0u; i < KR; ++i) ss += DOT(ys[tid * KR + i], ys[tid * KR + i]);
        parts[pc.kp * B * pc.V + p * B + b0 + tid] = ss;
    }
    if (v >= pc.V) return;
    float acc[HEAD_SB];
    [[unroll]] for (uint s = 0u; s < HEAD_SB; ++s) acc[s] = 0.0;
    [[unroll]] for (uint i = 0u; i < KR; ++i) {
        if (k0 + i < HW) {  // the last part's tail
            [[unroll]] for (uint s = 0u; s < HEAD_SB; ++s) acc[s] += DOT(wk[i], ys[s * KR + i]);
        }
    }
    [[unroll]] for (uint s = 0u; s < HEAD_SB; ++s) {
        if (b0 + s < B) parts[(p * B + b0 + s) * pc.V + v] = acc[s];
    }
}
#endif
