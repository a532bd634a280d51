"""The counter-based RNG shared by the shaders, the numpy reference and the trainer.

Every random number catchat draws on the GPU (dropout masks, scheduled sampling's coins and
samples, generation's draws) is a pure function of (seed, stream, counter): no RNG state lives on the device, so a
recorded sequence replays with a new seed in the `hyper` buffer, and numpy reproduces every draw
bit for bit. docs/model.md states it; glsl/include/common.glsl implements mix32 / rng_u32 /
rng_uniform for the shaders (glsl/include/dropout.glsl, glsl/tf_select.comp and
glsl/decode_sample.comp use them with the streams below). The two must agree bit for bit.
`catchat parity` checks it on every device:
catchat/parity/dropout.py compares the keep masks the GLSL draws with catchat.model.reference's bit for
bit, catchat/parity/sampling.py scheduled sampling's choices (its coins and top-k draws) exactly,
catchat/parity/decode.py generation's choices against reference.sample_choice with decode_uniforms;
tests/test_rng.py pins values of the hash against an independent pure-int version.

The host side: `step_seed` gives each micro-batch its dropout seed (the trainer and the GPU
program put it in HP_SEED; catchat.model.reference draws the same masks from it).
"""

from __future__ import annotations

import numpy as np

_M32 = np.uint64(0xFFFFFFFF)
_K1 = np.uint64(0x7FEB352D)
_K2 = np.uint64(0x846CA68B)
_S15, _S16, _S8 = np.uint64(15), np.uint64(16), np.uint64(8)

# Streams: each use of the RNG draws from its own (docs/model.md); a counter numbers the draws in it.
STREAM_EMBEDDING = 1  # embedding-row dropout; counter = vocab row v
STREAM_HIDDEN = 16  # + layer: hidden-unit dropout of that layer; counter = b * H + j (b: the global lane)
# scheduled sampling: the coin, the top-k draw; counter = t * B + b. B and b count the lanes of every rank of a
# data-parallel run (catchat/distributed.py), as the hidden dropout's b does
STREAM_TF_COIN, STREAM_TF_SAMPLE = 32, 33
STREAM_DECODE, STREAM_DECODE_LANE = 34, 35  # generation: the draw (counter = the stream's token number), the
# stream's own seed (counter = stream b): u = rng_uniform(rng_u32(seed, STREAM_DECODE_LANE, b), STREAM_DECODE, n)
# 48, 49: prefix dropout's hit and length (catchat.data.lanes.STREAM_PREFIX_HIT, STREAM_PREFIX_LEN; host only)


def _u32(x) -> np.ndarray:
    """Python ints / arrays -> uint64 array holding uint32 values (wrapped, as GLSL uint)."""
    if isinstance(x, int):
        x = x & 0xFFFFFFFF
    return np.asarray(x).astype(np.uint64) & _M32


def mix32(x):
    """The 32-bit integer hash of docs/model.md; uint32 in, uint32 out (scalar or array).

    Products are formed in uint64 and masked, which is exactly uint32 wraparound.
    """
    x = _u32(x)
    x ^= x >> _S16
    x = (x * _K1) & _M32
    x ^= x >> _S15
    x = (x * _K2) & _M32
    x ^= x >> _S16
    return x.astype(np.uint32)[()]


def rng_u32(seed, stream, counter):
    """rng_u32 = mix32(mix32(mix32(counter) ^ stream) ^ seed); broadcasts over arrays."""
    a = _u32(mix32(counter)) ^ _u32(stream)
    b = _u32(mix32(a)) ^ _u32(seed)
    return mix32(b)


def rng_uniform(seed, stream, counter):
    """Uniform in [0, 1) with 24 random bits, exactly representable in float32."""
    u = _u32(rng_u32(seed, stream, counter)) >> _S8
    return (u.astype(np.float32) * np.float32(2.0**-24))[()]


def decode_uniforms(seed: int, streams, position):
    """The uniform generation draws for `position` (the stream's n-th generated token, from 0) of
    each stream in `streams`: what glsl/decode_sample.comp draws, bit for bit (float32 [len(streams)])."""
    lane_seed = rng_u32(int(seed) & 0xFFFFFFFF, STREAM_DECODE_LANE, np.asarray(streams))
    return rng_uniform(lane_seed, STREAM_DECODE, position)


def derive_seed(seed: int, *parts: int) -> int:
    """A 32-bit seed for one part of a run (a micro-batch, a turn of a dialogue, a side of a chat)
    from a seed: each part hashed in as mix32(x ^ mix32(part)), so nearby seeds give unrelated draws."""
    x = int(seed) & 0xFFFFFFFF
    for part in parts:
        x = int(mix32(x ^ int(mix32(int(part) & 0xFFFFFFFF))))
    return x


def step_seed(run_seed: int, global_step: int, micro_batch: int) -> int:
    """Per-micro-batch dropout seed: mix32(run_seed ^ mix32(global_step * 64 + micro_batch))."""
    return derive_seed(run_seed, global_step * 64 + micro_batch)
