"""The float16 exchange's codec (catchat/exchange.py, Float16Blocks) alone, without MPI: its threads
give the bits of one thread, and what travels decodes to the scaled float16 rounding the module's
docstring promises (inf and NaN as they are, no finite value overflowing)."""

import numpy as np
import pytest

from catchat import exchange
from catchat.errors import UsageError


def _blocks(rng, n, m):
    b = (rng.standard_normal((n, m)) * rng.choice([1e-30, 1e-3, 1.0, 1e5, 1e37], (n, 1))).astype(np.float32)
    if m >= 3:
        b[0, :3] = [np.inf, -np.inf, np.nan]
    b[-1] = 0.0  # a block of zeros: k = 0
    return b


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_threads_give_the_bits_of_one_thread(monkeypatch, threads):
    monkeypatch.setattr(exchange, "CODEC_SPAN", 64)  # spans over short blocks: every thread gets work
    rng = np.random.default_rng(threads)
    one, many = exchange.Float16Blocks(threads=1), exchange.Float16Blocks(threads=threads)
    for n, m in ((1, 1000), (5, 777), (3, 64), (2, 0), (4, 1)):
        blocks = _blocks(rng, n, m)
        sent = one.encode(blocks)
        np.testing.assert_array_equal(many.encode(blocks), sent)
        np.testing.assert_array_equal(many.decode(sent).view(np.uint32), one.decode(sent).view(np.uint32))


def test_what_travels_is_the_scaled_float16_rounding():
    rng = np.random.default_rng(0)
    codec = exchange.Float16Blocks(threads=2)
    blocks = _blocks(rng, 6, 4096)
    got = codec.decode(codec.encode(blocks))
    finite = np.isfinite(blocks)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(blocks))
    np.testing.assert_array_equal(got[np.isinf(blocks)], blocks[np.isinf(blocks)])
    peak = np.where(finite, np.abs(blocks), 0).max(axis=1, keepdims=True)
    big = finite & (np.abs(blocks) >= peak * 2.0**-28)  # normal halves: 11 significant bits
    assert np.all(np.abs(got[big] - blocks[big]) <= np.abs(blocks[big]) * 2.0**-11)
    assert np.all(np.isfinite(got[finite]))


def test_thread_count_from_the_environment():
    assert exchange.codec_threads({"CATCHAT_EXCHANGE_THREADS": "3"}) == 3
    assert 1 <= exchange.codec_threads({}) <= exchange.MAX_CODEC_THREADS
    with pytest.raises(UsageError, match="CATCHAT_EXCHANGE_THREADS='0' is not a number of threads"):
        exchange.codec_threads({"CATCHAT_EXCHANGE_THREADS": "0"})
