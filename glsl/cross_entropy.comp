#version 450
// Fused softmax cross-entropy with label smoothing, top-1/top-5 hits and the logits gradient,
// one row i < n_rows (= T*B) of logits [n_rows, V] per group of G lanes (docs/model.md "Loss"):
//   logp = log_softmax(logits[i])   (max-subtracted)          e = hyper[HP_SMOOTHING]
//   row_loss[i]  = -((1-e) * logp[t] + e/V * sum_v logp[v])   t = targets[i]; 0 when masked
//   row_flags[i] = bit0 valid (t != 0, pad masked; t >= V also counts as masked),
//                  bit1 rank < 1, bit2 rank < 5; rank = #(logit > logit[t]) + #(== at index < t)
//   WANT_GRAD: dlogits[i,v] = (softmax[v] - e/V - (v == t) * (1-e)) * hyper[HP_INV_N_VALID] * S,
//              0 on masked rows; written over the logits with IN_PLACE, else to its own buffer.
//              S = hyper[HP_LOSS_SCALE] (fp16 loss scaling; 0 = 1), a power of two: multiplying by it
//              is exact, so S = 1 gives the bits of no scaling.
// Reductions over a row are fixed shared-memory trees: deterministic. loss_reduce.comp then sums
// the rows into `stats`.
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0, local_size_y_id = 1) in;  // x: G lanes per row (power of two), y: rows

layout(push_constant) uniform Push {
    uint n_rows, V;
    uint logits_off, tgt_off, loss_off, flags_off, dl_off;
} pc;

#if defined(WANT_GRAD) && defined(IN_PLACE)
layout(set = 0, binding = 0) buffer L_ { float L[]; };           // [n_rows,V] logits -> dlogits
#else
layout(set = 0, binding = 0) readonly buffer L_ { float L[]; };  // [n_rows,V] logits
#endif
layout(set = 0, binding = 1) readonly buffer Tgt_ { uint tgt[]; };       // [n_rows]
layout(set = 0, binding = 2) writeonly buffer Loss_ { float row_loss[]; };  // [n_rows]
layout(set = 0, binding = 3) writeonly buffer Flags_ { uint row_flags[]; };  // [n_rows]
layout(set = 0, binding = 4) readonly buffer Hyper_ { uint hyper[]; };   // [HP_WORDS]
#if defined(WANT_GRAD) && !defined(IN_PLACE)
layout(set = 0, binding = 5) writeonly buffer D_ { float D[]; };  // [n_rows,V] dlogits
#endif

const uint G = gl_WorkGroupSize.x;
const uint R = gl_WorkGroupSize.y;
shared float red_a[R * G];  // [R][G]
shared float red_b[R * G];
shared uint red_c[R * G];

// Tree-reduce (a, b, c) over the G lanes of each row: max or sum of a, sums of b and c.
// Every thread of the workgroup must call it (it has barriers).
void row_reduce(inout float a, inout float b, inout uint c, bool a_is_max) {
    uint lx = gl_LocalInvocationID.x, at = gl_LocalInvocationID.y * G + lx;
    red_a[at] = a; red_b[at] = b; red_c[at] = c;
    barrier();
    for (uint h = G / 2; h > 0; h >>= 1) {
        if (lx < h) {
            red_a[at] = a_is_max ? max(red_a[at], red_a[at + h]) : red_a[at] + red_a[at + h];
            red_b[at] += red_b[at + h];
            red_c[at] += red_c[at + h];
        }
        barrier();
    }
    uint row0 = at - lx;
    a = red_a[row0]; b = red_b[row0]; c = red_c[row0];
    barrier();  // the next call rewrites the arrays
}

void main() {
    uint lx = gl_LocalInvocationID.x;
    float e = HPF(hyper, HP_SMOOTHING);
    float scale = HPF(hyper, HP_LOSS_SCALE);
    float inv_n = HPF(hyper, HP_INV_N_VALID) * (scale == 0.0 ? 1.0 : scale);
    float e_v = e / float(pc.V);
    uint n_blocks = ceil_div(pc.n_rows, R);
    for (uint blk = gl_WorkGroupID.x; blk < n_blocks; blk += gl_NumWorkGroups.x) {  // uniform loop
        uint row = blk * R + gl_LocalInvocationID.y;
        bool live = row < pc.n_rows;
        uint t = live ? tgt[pc.tgt_off + row] : 0u;
        bool valid = t != 0u && t < pc.V;  // also false for dead rows (t = 0)
        uint base = pc.logits_off + row * pc.V;

        // pass 1: row max
        float mx = uintBitsToFloat(0xff800000u), unused_b = 0.0;  // -inf
        uint unused_c = 0u;
        if (valid)
            for (uint v = lx; v < pc.V; v += G) mx = max(mx, L[base + v]);
        row_reduce(mx, unused_b, unused_c, true);

        // pass 2: sum of exp(shifted), sum of shifted, the target's rank
        float lt = valid ? L[base + t] : 0.0;
        float sum_exp = 0.0, sum_shift = 0.0;
        uint rank = 0u;
        if (valid)
            for (uint v = lx; v < pc.V; v += G) {
                float x = L[base + v];
                sum_exp += exp(x - mx);
                sum_shift += x - mx;
                rank += (x > lt || (x == lt && v < t)) ? 1u : 0u;
            }
        row_reduce(sum_exp, sum_shift, rank, false);
        float lse = log(sum_exp);

        if (live && lx == 0u) {
            float loss = 0.0;
            uint flags = 0u;
            if (valid) {
                float logp_t = (lt - mx) - lse;
                float sum_logp = sum_shift - float(pc.V) * lse;
                loss = -((1.0 - e) * logp_t + e_v * sum_logp);
                flags = 1u | (rank < 1u ? 2u : 0u) | (rank < 5u ? 4u : 0u);
            }
            row_loss[pc.loss_off + row] = loss;
            row_flags[pc.flags_off + row] = flags;
        }

#ifdef WANT_GRAD
        // pass 3: the gradient (each element read then written by the same thread)
        if (live)
            for (uint v = lx; v < pc.V; v += G) {
                float g = 0.0;
                if (valid) {
                    float p = exp((L[base + v] - mx) - lse);
                    g = ((p - e_v) - (v == t ? 1.0 - e : 0.0)) * inv_n;
                }
#ifdef IN_PLACE
                L[base + v] = g;
#else
                D[pc.dl_off + row * pc.V + v] = g;
#endif
            }
#endif
    }
}
