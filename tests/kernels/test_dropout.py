"""Dropout masks: the GLSL RNG is bit-identical to catchat.rng's (through catchat.model.reference's masks)."""

import numpy as np

from catchat.model import reference as ref
from catchat.parity import dropout, make_hyper
from catchat.rng import step_seed
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.dropout import DropoutMask


def test_parity(dev):
    results = dropout.parity_checks(dev)
    assert results and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def _hidden(dev, seed, p, B, H, layer):
    th = dev.tensor(make_hyper(seed, p_hid=p), np.uint32)
    tm = dev.tensor(B * H)
    (got,) = run_ops(dev, [th, tm], [DropoutMask.hidden(dev, th, tm, B, H, layer)()], [tm])
    return got.reshape(B, H)


def test_hidden_mask_large_exact(dev):
    """Many counters (B*H = 64*160): the keep pattern equals reference's exactly."""
    seed, p, B, H, layer = step_seed(99, 12345, 3), 0.3, 64, 160, 1
    got = _hidden(dev, seed, p, B, H, layer)
    keep = ref.hidden_keep_mask(seed, layer, B, H, p)
    assert np.array_equal(got != 0, keep)
    assert 0.6 < keep.mean() < 0.8


def test_p_zero_keeps_everything_with_scale_one(dev):
    got = _hidden(dev, 7, 0.0, 3, 17, 0)
    assert np.array_equal(got, np.ones((3, 17), np.float32))


def test_streams_differ_by_layer(dev):
    a, b = _hidden(dev, 5, 0.5, 4, 32, 0), _hidden(dev, 5, 0.5, 4, 32, 1)
    assert not np.array_equal(a, b)
