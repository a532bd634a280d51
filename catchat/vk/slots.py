"""Word slots of the small buffers the kernels share with the host: the one table of them.

`hyper` (uint32 words, floats stored as their bits) is uploaded by the host before every
micro-batch: values that change every step live here, never in push constants frozen at record
time. `stats` (uint32 words) is written by the GPU and read back after a step. The decoder
(generation on the device) has its own two: `DC_*`, the call's sampling settings, and `DS_*`, the
words each stream keeps on the device between steps.
Shaders see the same table as `#include "slots.glsl"`, which is not a file in glsl/: shaders.py
generates it from this module (`shaders.slots_glsl()`) for every compile, and its text is part of
every variant's key. This module imports nothing outside the stdlib at load time (numpy only inside
the helpers), so the wheel build, which generates the include, needs no numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# --- hyper: host -> GPU, every micro-batch --------------------------------------------------
HP_LR = 0  # f32 learning rate of this step
HP_BETA1 = 1  # f32
HP_BETA2 = 2  # f32
HP_EPS = 3  # f32 Adam epsilon
HP_WEIGHT_DECAY = 4  # f32 decoupled weight decay (applied where the layout's decay mask is 1)
HP_CLIP = 5  # f32 max global grad norm; 0 = no clipping
HP_INV_N_VALID = 6  # f32 1 / valid targets of the whole optimizer step (0 when there are none)
HP_SEED = 7  # u32 dropout seed of this micro-batch (rng.step_seed)
HP_STEP = 8  # u32 optimizer step t being taken (1-based)
HP_BIAS_CORR1 = 9  # f32 1 - beta1^t (AdamW)
HP_BIAS_CORR2 = 10  # f32 1 - beta2^t
HP_NADAM_COEF_G = 11  # f32 lr * (1 - mu_t) / (1 - mu_prod_t)
HP_NADAM_COEF_M = 12  # f32 lr * mu_{t+1} / (1 - mu_prod_t * mu_{t+1})
HP_N_VALID = 13  # u32 valid targets of the whole optimizer step
HP_P_EMB = 14  # f32 embedding-row dropout probability
HP_P_HID = 15  # f32 hidden (variational) dropout probability
HP_SMOOTHING = 16  # f32 label smoothing e
HP_GRADH_CLAMP = 17  # f32 per-timestep clamp of the BPTT hidden-state gradient; 0 = off
HP_SPECTRAL_BOUND = 18  # f32 spectral-norm bound of GRU gate blocks; 0 = off
HP_TF = 19  # f32 teacher forcing: probability that a step's input is the data's token (per-timestep path)
HP_TF_TOPK = 20  # u32 the fed-back token: 0 = the model's argmax, k > 0 = a sample from its top k
HP_LANE_OFFSET = 21  # u32 global index of the program's lane 0 (data parallelism: a rank's first lane; else 0)
HP_LANES = 22  # u32 lanes of the whole step on all ranks (the RNG counters' row length; 0 = the program's B)
HP_LOSS_SCALE = 23  # f32 fp16 loss scale S, a power of two, multiplying dlogits (0 = 1: no scaling)
HP_GRAD_UNSCALE = 24  # f32 1 / S: the fp16 program's unscale of the weight gradients before the grad norm
HP_WORDS = 32

# --- stats: GPU -> host, zeroed at the start of every optimizer step ---------------------------
ST_LOSS_SUM = 0  # f32 sum over valid targets of the (smoothed) per-token loss, all micro-batches
ST_TOP1 = 1  # u32 valid targets whose logit is the largest
ST_TOP5 = 2  # u32 valid targets among the 5 largest logits
ST_N_VALID = 3  # u32 valid targets seen by the loss kernel (a check on the host's count)
ST_GRAD_NORM_SQ = 4  # f32 sum of squared gradients, before clipping
ST_CLAMP_HITS = 5  # u32 elements the hidden-state gradient clamp bound
ST_SKIPPED = 6  # u32 1 when the optimizer did not apply the step (no valid targets / non-finite)
ST_CLIP_SCALE = 7  # f32 the factor gradients were scaled by (1 = not clipped)
ST_TF_MODEL_FED = 8  # u32 inputs that were the model's own choice instead of the data's token
ST_SYNC_TIMEOUTS = 9  # u32 persistent sweeps whose grid barrier gave up (workgroups not co-resident)
ST_WORDS = 16

# --- decode config: host -> GPU, once per generation call (catchat/vk/program/decoder.py) ---------
DC_SEED = 0  # u32 the call's sampling seed; stream b draws from rng_u32(seed, STREAM_DECODE_LANE, b)
DC_LENGTH = 1  # u32 tokens to generate per stream (a stream stops earlier at a stop token)
DC_INV_TEMP = 2  # f32 1 / temperature (multiplied, so the host and the GPU round alike)
DC_TOP_K = 3  # u32 0 = off
DC_TOP_P = 4  # f32 1 = off
DC_GREEDY = 5  # u32 1 = take the first largest logit
DC_NGRAM = 6  # u32 n-gram blocking over the call's generated tokens: 0 = off, else n >= 2
DC_N_FORCED = 7  # u32 known tokens fed before sampling starts (the same count for every stream)
DC_STOP = 8  # u32 x 8: bit v set = token v stops its stream (vocabularies up to 256 tokens)
DC_WORDS = 16

# --- decode stream state: GPU-resident words per stream (DS_WORDS each) ---------------------------
DS_DONE = 0  # u32 1 = the stream stopped: its state and logits stay, it emits nothing more
DS_GEN = 1  # u32 tokens generated so far in this call (the RNG counter of the next draw)
DS_FED = 2  # u32 forced tokens taken so far
DS_WORDS = 4


def f32_bits(x: float) -> np.uint32:
    """The bits of float32(x) as a uint32 word."""
    import numpy as np

    return np.float32(x).view(np.uint32)


def word_f32(words: np.ndarray, slot: int) -> float:
    """Read a float slot of a uint32 word array."""
    import numpy as np

    return float(np.asarray(words, dtype=np.uint32)[slot:slot + 1].view(np.float32)[0])


def all_slots() -> dict[str, int]:
    """Every HP_*, ST_*, DC_* and DS_* name with its index, in the order defined here (what slots.glsl
    defines)."""
    return {k: v for k, v in globals().items() if k.startswith(("HP_", "ST_", "DC_", "DS_")) and isinstance(v, int)}
