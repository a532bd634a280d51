#version 450
// Scheduled sampling (Bengio et al. 2015): choose the input token of step t for every lane.
// The input is the data's token at t == 0, where a conversation starts (reset), and with
// probability tf (a per-token coin flip); otherwise it is the model's own choice from the logits of
// step t-1: the argmax (HP_TF_TOPK == 0) or a sample from its k largest logits (softmax over
// them). <pad> and <bos> are never chosen; ties go to the lower index. The choice overwrites
// tokens[t] in place, so the embedding (and its backward) sees what was actually fed.
// Exactly catchat.reference.tf_select (docs/model.md, "Scheduled sampling"). The draws of lane b at
// step t use counter t * lanes + lane0 + b: lanes = hyper[HP_LANES] (the global lane count; 0 = B)
// and lane0 = hyper[HP_LANE_OFFSET], so a rank holding lanes [lane0, lane0 + B) of a data-parallel
// run draws what one process holding all of them would.
#include "common.glsl"
#include "slots.glsl"

layout(local_size_x_id = 0) in;  // one invocation per lane
layout(set = 0, binding = 0) buffer Tokens { uint tokens[]; };          // [T,B]
layout(set = 0, binding = 1) readonly buffer Logits { float logits[]; };  // [T,B,V]
layout(set = 0, binding = 2) readonly buffer Resets { uint resets[]; };   // [T,B]
layout(set = 0, binding = 3) readonly buffer Hyper { uint hyper[]; };
layout(set = 0, binding = 4) buffer Stats { uint stats[]; };             // ST_TF_MODEL_FED (+=)
layout(push_constant) uniform Push { uint t; uint B; uint V; } pc;

const uint STREAM_COIN = 32u, STREAM_SAMPLE = 33u, PAD = 0u, BOS = 1u, MAX_K = 16u;

// Is (a, ia) ranked before (b, ib)? Larger logit first, the lower index on ties.
bool before(float a, uint ia, float b, uint ib) { return a > b || (a == b && ia < ib); }

void main() {
    uint b = gl_GlobalInvocationID.x;
    if (b >= pc.B || pc.t == 0u) return;
    uint row = pc.t * pc.B + b;
    if (resets[row] != 0u) return;
    uint seed = hyper[HP_SEED];
    uint lanes = hyper[HP_LANES] != 0u ? hyper[HP_LANES] : pc.B;
    uint draw = pc.t * lanes + hyper[HP_LANE_OFFSET] + b;  // the RNG counter (the global row)
    if (rng_uniform(seed, STREAM_COIN, draw) < HPF(hyper, HP_TF)) return;  // teacher forced
    uint base = (row - pc.B) * pc.V;  // logits of step t-1, lane b
    uint k = min(hyper[HP_TF_TOPK], MAX_K);
    uint choice;
    if (k == 0u) {
        choice = 2u;
        for (uint v = 3u; v < pc.V; v++)
            if (before(logits[base + v], v, logits[base + choice], choice)) choice = v;
    } else {
        // the k best in rank order: k passes, each taking the best not yet taken
        uint idx[MAX_K];
        float val[MAX_K];
        uint n = 0u;
        for (uint r = 0u; r < k; r++) {
            uint best = 0xFFFFFFFFu;
            for (uint v = 2u; v < pc.V; v++) {
                bool taken = false;
                for (uint q = 0u; q < n; q++) taken = taken || idx[q] == v;
                if (!taken && (best == 0xFFFFFFFFu || before(logits[base + v], v, logits[base + best], best))) best = v;
            }
            if (best == 0xFFFFFFFFu) break;
            idx[n] = best;
            val[n] = logits[base + best];
            n++;
        }
        float total = 0.0;
        for (uint q = 0u; q < n; q++) total += exp(val[q] - val[0]);
        float u = rng_uniform(seed, STREAM_SAMPLE, draw) * total;
        float acc = 0.0;
        choice = idx[n - 1u];
        for (uint q = 0u; q < n; q++) {
            acc += exp(val[q] - val[0]);
            if (acc > u) { choice = idx[q]; break; }
        }
    }
    tokens[row] = choice;
    atomicAdd(stats[ST_TF_MODEL_FED], 1u);
}
