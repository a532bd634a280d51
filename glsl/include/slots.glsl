// Word slots of the `hyper` (host -> GPU) and `stats` (GPU -> host) buffers.
// Mirrors catchat/vk/slots.py (a test checks they agree); floats are stored as uint bits.
#ifndef CATCHAT_SLOTS_GLSL
#define CATCHAT_SLOTS_GLSL
#define HP_LR 0u
#define HP_BETA1 1u
#define HP_BETA2 2u
#define HP_EPS 3u
#define HP_WEIGHT_DECAY 4u
#define HP_CLIP 5u
#define HP_INV_N_VALID 6u
#define HP_SEED 7u
#define HP_STEP 8u
#define HP_BIAS_CORR1 9u
#define HP_BIAS_CORR2 10u
#define HP_NADAM_COEF_G 11u
#define HP_NADAM_COEF_M 12u
#define HP_N_VALID 13u
#define HP_P_EMB 14u
#define HP_P_HID 15u
#define HP_SMOOTHING 16u
#define HP_GRADH_CLAMP 17u
#define HP_SPECTRAL_BOUND 18u
#define HP_TF 19u
#define HP_TF_TOPK 20u
#define HP_WORDS 32u
#define ST_LOSS_SUM 0u
#define ST_TOP1 1u
#define ST_TOP5 2u
#define ST_N_VALID 3u
#define ST_GRAD_NORM_SQ 4u
#define ST_CLAMP_HITS 5u
#define ST_SKIPPED 6u
#define ST_CLIP_SCALE 7u
#define ST_TF_MODEL_FED 8u
#define ST_SYNC_TIMEOUTS 9u
#define ST_WORDS 16u

// Read a float / uint slot of a uint word buffer.
#define HPF(buf, slot) uintBitsToFloat(buf[slot])
#define HPU(buf, slot) (buf[slot])

#endif
