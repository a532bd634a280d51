#version 450
// One optimizer step over the whole flat parameter buffer, in one dispatch (grid-stride loop):
// global-norm clipping, decoupled weight decay, then AdamW (default, -DADAMW) or NAdam (-DNADAM),
// exactly as catchat.reference.clip_scale / adamw_step / nadam_step (docs/model.md).
//
// Skip guard: every invocation reads the same three words (hyper[HP_N_VALID],
// stats[ST_GRAD_NORM_SQ], hyper[HP_CLIP]) so all take the same branch. When no target was valid
// or the norm is not finite nothing is written except stats[ST_SKIPPED] = 1 and
// stats[ST_CLIP_SCALE] = 1.0 (by invocation 0). Finiteness is tested on the bits: drivers may
// assume floats are finite unless told otherwise, so isnan()/isinf() are not trusted.
#include "common.glsl"
#include "slots.glsl"

#if defined(ADAMW) && defined(NADAM)
#error "define one of ADAMW, NADAM"
#endif

layout(local_size_x_id = 0) in;

layout(set = 0, binding = 0) buffer Params { float params[]; };               // [n]
layout(set = 0, binding = 1) readonly buffer Grads { float grads[]; };        // [n]
layout(set = 0, binding = 2) buffer M { float m[]; };                         // [n] first moment
layout(set = 0, binding = 3) buffer V { float v[]; };                         // [n] second moment
layout(set = 0, binding = 4) readonly buffer Decay { uint decay[]; };          // [1 + 2 * runs] (below)
layout(set = 0, binding = 5) readonly buffer Hyper { uint hyper[]; };         // [HP_WORDS]
layout(set = 0, binding = 6) buffer Stats { uint stats[]; };                  // [ST_WORDS]
layout(push_constant) uniform Push { uint n; } pc;                            // parameter count

// Weight decay applies on [decay[1 + 2r], decay[2 + 2r]) for r < decay[0]: the few runs of decayed
// tensors (catchat.model.ParamLayout.decay_runs), not a float per parameter (4 bytes less per element
// of a memory-bound pass, and no buffer the size of the model).
float decay_of(uint i) {
    uint runs = decay[0];
    for (uint r = 0u; r < runs; ++r) {
        if (i >= decay[1u + 2u * r] && i < decay[2u + 2u * r]) return 1.0;
    }
    return 0.0;
}

void main() {
    uint gid = gl_GlobalInvocationID.x;
    uint norm_sq_bits = stats[ST_GRAD_NORM_SQ];
    bool finite = (norm_sq_bits & 0x7f800000u) != 0x7f800000u;  // sum of squares: >= 0 or non-finite
    if (HPU(hyper, HP_N_VALID) == 0u || !finite) {
        if (gid == 0u) {
            stats[ST_SKIPPED] = 1u;
            stats[ST_CLIP_SCALE] = floatBitsToUint(1.0);
        }
        return;
    }
    // PyTorch clip_grad_norm_: scale = min(1, clip / (norm + 1e-6)); clip <= 0 means no clipping.
    float norm = sqrt(uintBitsToFloat(norm_sq_bits));
    float clip = HPF(hyper, HP_CLIP);
    float scale = clip > 0.0 ? min(1.0, clip / (norm + 1e-6)) : 1.0;
    if (gid == 0u) {
        stats[ST_SKIPPED] = 0u;
        stats[ST_CLIP_SCALE] = floatBitsToUint(scale);
    }

    float lr = HPF(hyper, HP_LR);
    float b1 = HPF(hyper, HP_BETA1);
    float b2 = HPF(hyper, HP_BETA2);
    float eps = HPF(hyper, HP_EPS);
    float lr_wd = lr * HPF(hyper, HP_WEIGHT_DECAY);
    float bias_corr2 = HPF(hyper, HP_BIAS_CORR2);  // 1 - b2^t
#ifdef NADAM
    float coef_g = HPF(hyper, HP_NADAM_COEF_G);    // lr (1 - mu_t) / (1 - mu_prod_t)
    float coef_m = HPF(hyper, HP_NADAM_COEF_M);    // lr mu_{t+1} / (1 - mu_prod_t mu_{t+1})
#else
    float step_size = lr / HPF(hyper, HP_BIAS_CORR1);  // lr / (1 - b1^t)
#endif

    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gid; i < pc.n; i += stride) {
        float g = grads[i] * scale;
        float p = params[i] * (1.0 - lr_wd * decay_of(i));  // decoupled weight decay first
        float mi = b1 * m[i] + (1.0 - b1) * g;
        float vi = b2 * v[i] + (1.0 - b2) * g * g;
        float denom = sqrt(vi / bias_corr2) + eps;
#ifdef NADAM
        p -= coef_g * g / denom;
        p -= coef_m * mi / denom;
#else
        p -= step_size * mi / denom;
#endif
        params[i] = p;
        m[i] = mi;
        v[i] = vi;
    }
}
