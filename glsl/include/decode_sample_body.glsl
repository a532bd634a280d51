// The body of the choice of a decode step (glsl/decode_sample.comp's, and the persistent decoder's last
// stage, glsl/decode_persistent.comp): stream b's next token, written to row k of outp. The includer
// declares logits, token, ctl, cfg, forced, hist, outp (RESETS: resets; HEAD_PARTS: parts), SET_TOKEN,
// the spec constant KP and push constants pc.B, pc.V, pc.cap, pc.pad, pc.bos, pc.eos, pc.H and pc.eps.
// Returns uniformly per workgroup (a stopped stream, forced text, the end of its length).
#ifndef CATCHAT_DECODE_SAMPLE_BODY_GLSL
#define CATCHAT_DECODE_SAMPLE_BODY_GLSL

const uint NONE = 0xFFFFFFFFu;
const uint STREAM_DECODE = 34u, STREAM_DECODE_LANE = 35u;  // catchat.rng

shared float z[gl_WorkGroupSize.x];
shared float p[gl_WorkGroupSize.x];
shared uint banned[8];
#include "wg_reduce.glsl"

bool is_stop(uint v) { return v < 256u && (cfg[DC_STOP + v / 32u] & (1u << (v % 32u))) != 0u; }

void decode_choose(uint b, uint k) {
    uint v = gl_LocalInvocationID.x, V = pc.V;
    uint c0 = b * DS_WORDS;
    uint done = ctl[c0 + DS_DONE], fed = ctl[c0 + DS_FED], gen = ctl[c0 + DS_GEN];
#ifdef HEAD_PARTS
    // a live stream's logits from the head's parts, in part order (a stopped stream keeps the ones it
    // stopped with); thread v reads back only the logit it wrote
    if (done == 0u && v < V) {
        float acc = 0.0, ss = 0.0;
        [[unroll]] for (uint q = 0u; q < KP; ++q) {
            acc += parts[(q * pc.B + b) * V + v];
            ss += parts[KP * pc.B * V + q * pc.B + b];
        }
        logits[b * V + v] = acc * (1.0 / sqrt(ss / float(pc.H) + pc.eps));
    }
#endif
    barrier();  // every thread has read ctl before thread 0 writes it
    if (done != 0u) {  // uniform per workgroup
        if (v == 0u) outp[k * pc.B + b] = NONE;
        return;
    }
    if (fed < cfg[DC_N_FORCED]) {  // feeding known text
        if (v == 0u) {
            SET_TOKEN(b, forced[fed * pc.B + b]);
            ctl[c0 + DS_FED] = fed + 1u;
            outp[k * pc.B + b] = NONE;
        }
        return;
    }
    if (gen >= cfg[DC_LENGTH]) {
        if (v == 0u) { ctl[c0 + DS_DONE] = 1u; outp[k * pc.B + b] = NONE; }
        return;
    }
    // n-gram blocking: ban every token that followed the current (n-1)-token tail before
    uint n = cfg[DC_NGRAM];
    if (v < 8u) banned[v] = 0u;
    barrier();
    if (n >= 2u && gen >= n - 1u) {
        uint tl = n - 1u;
        for (uint q = tl + v; q < gen && q < pc.cap; q += gl_WorkGroupSize.x) {
            bool match = true;
            for (uint i = 0u; i < tl; ++i)
                if (hist[(q - tl + i) * pc.B + b] != hist[(gen - tl + i) * pc.B + b]) { match = false; break; }
            uint t = hist[q * pc.B + b];
            if (match && t < 256u) atomicOr(banned[t / 32u], 1u << (t % 32u));
        }
    }
    barrier();
    bool allowed = v < V && v != pc.pad && v != pc.bos
                   && (is_stop(v) || (banned[v / 32u] & (1u << (v % 32u))) == 0u);
    float lg = v < V ? logits[b * V + v] : 0.0;
    const float NEG = -3.0e38, NEG_INF = uintBitsToFloat(0xff800000u);  // NEG: disallowed tokens' z
    uint choice;
    if (cfg[DC_GREEDY] != 0u) {
        float m = wg_max(allowed ? lg : NEG_INF);
        choice = wg_min_u(allowed && lg == m ? v : NONE);
    } else {
        float zt = lg * uintBitsToFloat(cfg[DC_INV_TEMP]);
        z[v] = allowed ? zt : NEG;
        barrier();
        uint top_k = cfg[DC_TOP_K];
        uint rank = 0u;  // position in the descending order, ties to the lower index (top-k only)
        if (allowed && top_k > 0u)
            for (uint u = 0u; u < V; ++u) rank += (z[u] > zt || (z[u] == zt && u < v)) ? 1u : 0u;
        bool kept = allowed && (top_k == 0u || rank < top_k);
        float zmax = wg_max(kept ? zt : NEG_INF);
        float pv = kept ? exp(zt - zmax) : 0.0;
        float top_p = uintBitsToFloat(cfg[DC_TOP_P]);
        if (top_p < 1.0) {
            float total = wg_sum(pv);
            p[v] = pv;
            barrier();
            float before = 0.0;  // mass of the kept tokens ranked before v
            if (kept)
                for (uint u = 0u; u < V; ++u)
                    if (p[u] > 0.0 && (z[u] > zt || (z[u] == zt && u < v))) before += p[u];
            barrier();
            if (!(before < top_p * total)) pv = 0.0;
        }
        // running sum in index order: a subgroup scan plus the totals of the subgroups before
        float c = subgroupInclusiveAdd(pv);
        if (gl_SubgroupInvocationID == gl_SubgroupSize - 1u) wg_red[gl_SubgroupID] = c;
        barrier();
        float total = 0.0;
        for (uint i = 0u; i < gl_NumSubgroups; ++i) {
            if (i < gl_SubgroupID) c += wg_red[i];
            total += wg_red[i];
        }
        barrier();
        uint seed_b = rng_u32(cfg[DC_SEED], STREAM_DECODE_LANE, b);
        float thr = rng_uniform(seed_b, STREAM_DECODE, gen) * total;
        uint first = wg_min_u(v < V && pv > 0.0 && c > thr ? v : NONE);
        uint from_end = wg_min_u(v < V && pv > 0.0 ? V - 1u - v : NONE);  // the last kept token
        choice = first != NONE ? first : (from_end != NONE ? V - 1u - from_end : NONE);
    }
    if (choice >= V) choice = pc.eos;  // nothing to choose from (non-finite logits): stop
    if (v == 0u) {
        SET_TOKEN(b, choice);
        outp[k * pc.B + b] = choice;
        if (gen < pc.cap) hist[gen * pc.B + b] = choice;
        ctl[c0 + DS_GEN] = gen + 1u;
        if (is_stop(choice) || gen + 1u >= cfg[DC_LENGTH]) ctl[c0 + DS_DONE] = 1u;
    }
}
#endif
