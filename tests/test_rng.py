"""The counter-based RNG (catchat/rng.py): pinned values against an independent pure-int hash.

That the GLSL twin (glsl/include/common.glsl) draws the same numbers is checked on the device by
catchat/parity/dropout.py (tests/kernels/test_dropout.py) and catchat/parity/sampling.py.
"""

from pathlib import Path

import numpy as np

from catchat import rng

GLSL = Path(__file__).resolve().parents[1] / "glsl"


def _mix32_py(x: int) -> int:
    """Independent pure-int version of the hash."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_rng_pinned_values():
    # mix32(1) by hand: x=1; x ^= x>>16 -> 0x00000001; x *= 0x7feb352d -> 0x7feb352d;
    # x>>15 = 0x0000ffd6, x ^= -> 0x7febcafb; x *= 0x846ca68b (mod 2^32) -> 0x6889f849
    # (low nibble: 0xb * 0xb = 0x79 -> 9); x>>16 = 0x6889, 0xf849 ^ 0x6889 = 0x90c0 -> 0x688990c0.
    # rng_u32(1, 1, 0): mix32(0) = 0; 0 ^ 1 = 1; mix32(1) = 0x688990c0; ^ 1 -> 0x688990c1;
    # mix32(0x688990c1) = 0xd25b73e6.
    assert int(rng.mix32(1)) == 0x688990C0
    assert int(rng.mix32(0)) == 0
    pinned = {(0, 0, 0): 0, (1, 1, 0): 0xD25B73E6, (12345, 1, 7): 0xE414D381,
              (0xDEADBEEF, 17, 1000): 0x1810A7D7, (7, 16, 2**32 - 1): 0x5EA8DC07}
    for (seed, stream, counter), want in pinned.items():
        assert int(rng.rng_u32(seed, stream, counter)) == want
        assert _mix32_py(_mix32_py(_mix32_py(counter) ^ stream) ^ seed) == want
    assert rng.step_seed(1234, 5, 1) == 930335062
    assert rng.step_seed(1234, 5, 1) == _mix32_py(1234 ^ _mix32_py(5 * 64 + 1))
    assert rng.step_seed(2**32 + 5, 2**27, 3) == 1928472627  # wraps like GLSL uint


def test_rng_arrays_match_scalars_and_uniform_range():
    counters = np.arange(0, 5000, 7, dtype=np.uint64)
    got = rng.rng_u32(99, 3, counters)
    assert got.dtype == np.uint32
    assert [int(a) for a in got[:20]] == [_mix32_py(_mix32_py(_mix32_py(int(c)) ^ 3) ^ 99)
                                         for c in counters[:20]]
    u = rng.rng_uniform(99, 3, counters)
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    np.testing.assert_array_equal(u, (got >> 8).astype(np.float64) / 2**24)


def test_glsl_uses_the_same_streams():
    """The stream numbers are part of the contract: the shaders spell them out too."""
    dropout = (GLSL / "include" / "dropout.glsl").read_text()
    assert f"#define DROPOUT_STREAM_EMBEDDING {rng.STREAM_EMBEDDING}u" in dropout
    assert f"#define DROPOUT_STREAM_HIDDEN {rng.STREAM_HIDDEN}u" in dropout
    tf_select = (GLSL / "tf_select.comp").read_text()
    assert f"STREAM_COIN = {rng.STREAM_TF_COIN}u, STREAM_SAMPLE = {rng.STREAM_TF_SAMPLE}u" in tf_select
