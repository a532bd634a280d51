#version 450
// Residual + variational dropout + RMSNorm over rows r = t * B + b of H floats (time-major).
//   FORWARD:   y = x + o * hidscale[b,:];  rstd = 1 / sqrt(mean(y^2) + eps);  out = y * rstd * g
//   BACKWARD:  yhat = y * rstd (y recomputed from x, o);  dyhat = dout * g
//              dy = rstd * (dyhat - yhat * mean(dyhat * yhat));  dx = dy;  do = dy * hidscale
//              dgpart[wg, j] = sum over this workgroup's rows (in order) of dout * yhat
//   DG_REDUCE: grads[g_off + j] += sum over workgroups w (in order) of dgpart[w, j]   (deterministic)
// hidscale[b,j] = dropout_scale(seed, 16 + layer, (lane0 + b) * H + j, p_hid), recomputed, never stored;
// lane0 = hyper[HP_LANE_OFFSET]: the global index of this program's lane 0 (data parallelism; 0 alone).
// FORWARD/BACKWARD: one workgroup owns rows [wg * rows_per_wg, ...) and thread i owns columns
// i, i + WG, ... (COLS of them, kept in registers): row sums are one subgroup + shared reduction.
// The backward loads its next row before it reduces the current one, so a workgroup's 8+ rows are
// not a chain of memory round trips.
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#if !defined(FORWARD) && !defined(BACKWARD) && !defined(DG_REDUCE)
#define FORWARD 1  // the variant compiled when none is named
#endif
#include "common.glsl"
#include "slots.glsl"
#include "dropout.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint COLS = 1;  // ceil(H / WG): columns per thread

#if defined(FORWARD)
layout(set = 0, binding = 0) readonly buffer X { float x[]; };          // [T,B,H] at x_off
layout(set = 0, binding = 1) readonly buffer O { float o[]; };          // [T,B,H] at o_off
layout(set = 0, binding = 2) readonly buffer P { float params[]; };     // g [H] at g_off
layout(set = 0, binding = 3) readonly buffer Hyper { uint hyper[]; };   // [HP_WORDS]
layout(set = 0, binding = 4) writeonly buffer Out { float outp[]; };    // [T,B,H] at out_off
layout(set = 0, binding = 5) writeonly buffer Rstd { float rstd[]; };   // [T*B] at rstd_off
layout(push_constant) uniform Push {
    uint R; uint B; uint H; uint layer; uint rows_per_wg;
    uint x_off; uint o_off; uint g_off; uint out_off; uint rstd_off; float eps;
} pc;
#elif defined(BACKWARD)
layout(set = 0, binding = 0) readonly buffer X { float x[]; };          // [T,B,H] at x_off
layout(set = 0, binding = 1) readonly buffer O { float o[]; };          // [T,B,H] at o_off
layout(set = 0, binding = 2) readonly buffer P { float params[]; };     // g [H] at g_off
layout(set = 0, binding = 3) readonly buffer Hyper { uint hyper[]; };   // [HP_WORDS]
layout(set = 0, binding = 4) readonly buffer Rstd { float rstd[]; };    // [T*B] at rstd_off
layout(set = 0, binding = 5) readonly buffer Dout { float dout[]; };    // [T,B,H] at dout_off
layout(set = 0, binding = 6) writeonly buffer Dx { float dx[]; };       // [T,B,H] at dx_off
layout(set = 0, binding = 7) writeonly buffer Do { float dO[]; };       // [T,B,H] at do_off
layout(set = 0, binding = 8) writeonly buffer Part { float dgpart[]; };  // [n_wg, H]
layout(push_constant) uniform Push {
    uint R; uint B; uint H; uint layer; uint rows_per_wg;
    uint x_off; uint o_off; uint g_off; uint rstd_off; uint dout_off; uint dx_off; uint do_off;
    uint row0;  // the dispatch's first row (a multiple of rows_per_wg): rows [row0, R), partial row0 / rows_per_wg on
} pc;
#elif defined(DG_REDUCE)
#define UNROLL 16u  // partials whose loads a thread issues at once
layout(set = 0, binding = 0) readonly buffer Part { float dgpart[]; };  // [n_parts, H]
layout(set = 0, binding = 1) buffer G { float grads[]; };               // dg [H] at g_off (+=)
layout(push_constant) uniform Push { uint H; uint n_parts; uint g_off; } pc;
#endif

#if defined(FORWARD) || defined(BACKWARD)
#include "wg_reduce.glsl"  // wg_sum: row sums over the workgroup

float hid_scale(uint b, uint j) {
    float p = HPF(hyper, HP_P_HID);
    uint lane = HPU(hyper, HP_LANE_OFFSET) + b;  // the global lane: the same mask on any number of ranks
    return p > 0.0 ? dropout_scale(HPU(hyper, HP_SEED), DROPOUT_STREAM_HIDDEN + pc.layer, lane * pc.H + j, p) : 1.0;
}
#endif

#if defined(FORWARD)
void main() {
    uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    uint r0 = gl_WorkGroupID.x * pc.rows_per_wg, r1 = min(pc.R, r0 + pc.rows_per_wg);
    for (uint r = r0; r < r1; ++r) {  // uniform per workgroup: barriers inside are fine
        uint b = r % pc.B;
        float y[COLS];
        float ss = 0.0;
        for (uint c = 0u; c < COLS; ++c) {
            uint j = tid + c * WG;
            y[c] = 0.0;
            if (j < pc.H) {
                y[c] = x[pc.x_off + r * pc.H + j] + o[pc.o_off + r * pc.H + j] * hid_scale(b, j);
                ss += y[c] * y[c];
            }
        }
        float rs = 1.0 / sqrt(wg_sum(ss) / float(pc.H) + pc.eps);
        if (tid == 0u) rstd[pc.rstd_off + r] = rs;
        for (uint c = 0u; c < COLS; ++c) {
            uint j = tid + c * WG;
            if (j < pc.H) outp[pc.out_off + r * pc.H + j] = y[c] * rs * params[pc.g_off + j];
        }
    }
}
#elif defined(BACKWARD)
// Row r's inputs for the thread's columns (0 past H).
void load_row(uint r, uint tid, out float xr[COLS], out float or_[COLS], out float dr[COLS], out float rs) {
    rs = rstd[pc.rstd_off + r];
    [[unroll]] for (uint c = 0u; c < COLS; ++c) {
        uint j = tid + c * gl_WorkGroupSize.x;
        bool in_h = j < pc.H;
        xr[c] = in_h ? x[pc.x_off + r * pc.H + j] : 0.0;
        or_[c] = in_h ? o[pc.o_off + r * pc.H + j] : 0.0;
        dr[c] = in_h ? dout[pc.dout_off + r * pc.H + j] : 0.0;
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    uint part = pc.row0 / pc.rows_per_wg + gl_WorkGroupID.x;  // the whole window's partial, whatever the dispatch
    uint r0 = part * pc.rows_per_wg, r1 = min(pc.R, r0 + pc.rows_per_wg);
    float dg[COLS];  // this workgroup's partial dg for the thread's columns, summed in row order
    for (uint c = 0u; c < COLS; ++c) dg[c] = 0.0;
    // The next row's loads are issued before this row's reduction (its barriers), so a workgroup's
    // rows are not a chain of memory round trips; the arithmetic is the same as one row at a time.
    float xn[COLS], on[COLS], dn[COLS], rsn = 0.0;
    if (r0 < r1) load_row(r0, tid, xn, on, dn, rsn);
    for (uint r = r0; r < r1; ++r) {
        uint b = r % pc.B;
        float xr[COLS], or_[COLS], dr[COLS], rs = rsn;
        [[unroll]] for (uint c = 0u; c < COLS; ++c) { xr[c] = xn[c]; or_[c] = on[c]; dr[c] = dn[c]; }
        if (r + 1u < r1) load_row(r + 1u, tid, xn, on, dn, rsn);
        float yhat[COLS], dyhat[COLS], hs[COLS];
        float s = 0.0;
        for (uint c = 0u; c < COLS; ++c) {
            uint j = tid + c * WG;
            yhat[c] = 0.0; dyhat[c] = 0.0; hs[c] = 0.0;
            if (j < pc.H) {
                hs[c] = hid_scale(b, j);
                float y = xr[c] + or_[c] * hs[c];
                float d = dr[c];
                yhat[c] = y * rs;
                dyhat[c] = d * params[pc.g_off + j];
                dg[c] += d * yhat[c];
                s += dyhat[c] * yhat[c];
            }
        }
        float m = wg_sum(s) / float(pc.H);
        for (uint c = 0u; c < COLS; ++c) {
            uint j = tid + c * WG;
            if (j < pc.H) {
                float dy = rs * (dyhat[c] - yhat[c] * m);
                dx[pc.dx_off + r * pc.H + j] = dy;
                dO[pc.do_off + r * pc.H + j] = dy * hs[c];
            }
        }
    }
    for (uint c = 0u; c < COLS; ++c) {
        uint j = tid + c * WG;
        if (j < pc.H) dgpart[part * pc.H + j] = dg[c];
    }
}
#elif defined(DG_REDUCE)
void main() {
    uint j = gl_GlobalInvocationID.x;
    if (j >= pc.H) return;
    // The partials in workgroup order, UNROLL loads issued before their adds (the same sums; one load
    // at a time was a chain of n_parts L2 round trips). With the rows' prefetch above: v5's norm
    // backward 0.85 -> 0.70 ms a layer, v3's 0.47 -> 0.44 (H100, 2026-12-06)
    float s = 0.0;
    uint w = 0u;
    for (; w + UNROLL <= pc.n_parts; w += UNROLL) {
        float v[UNROLL];
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) v[u] = dgpart[(w + u) * pc.H + j];
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) s += v[u];
    }
    for (; w < pc.n_parts; ++w) s += dgpart[w * pc.H + j];
    grads[pc.g_off + j] += s;
}
#endif
