"""axpby (glsl/axpby.comp) against its numpy twin, and zeroing over NaN/Inf garbage."""

from __future__ import annotations

import numpy as np

from catchat.model.reference import axpby_reference
from catchat.parity import ParityResult, compare
from catchat.vk import slots
from catchat.vk.device import Device
from catchat.vk.kernels import Axpby, half_tensor, run_ops, unpack_half


def parity_checks(dev: Device) -> list[ParityResult]:
    """axpby at sizes around its workgroup sizes: a thread per element (odd n), or per 4 (VEC4: n % 4 == 0)."""
    rng = np.random.default_rng(0)
    out = []
    for n in (1, 63, 64, 65, 1000, 1028):
        x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        tx, ty = dev.tensor(x), dev.tensor(y)
        (got,) = run_ops(dev, [tx, ty], [Axpby(dev, tx, ty, n)(0.5, 2.0, -1.0)], [ty])
        out.append(compare("axpby", str(n), got, axpby_reference(x, y, 0.5, 2.0, -1.0), 1e-6, 1e-6))
    # zeroing must not read its operands: NaN garbage in fresh memory must not survive 0 * y
    n = 100
    x, y = np.full(n, np.nan, np.float32), np.full(n, np.inf, np.float32)
    tx, ty = dev.tensor(x), dev.tensor(y)
    (got,) = run_ops(dev, [tx, ty], [Axpby(dev, tx, ty, n)(0.0, 0.0, 0.0)], [ty])
    out.append(compare("axpby zero over NaN/Inf", str(n), got, np.zeros(n), 0.0, 0.0))
    # a from a hyper word, in place (the fp16 program's unscale: y *= 1/S, exact for a power of two)
    hyper = np.zeros(slots.HP_WORDS, np.uint32)
    hyper[slots.HP_GRAD_UNSCALE] = slots.f32_bits(2.0**-16)
    for n in (999, 1000):
        y = rng.standard_normal(n, dtype=np.float32) * 2**16
        ty, th = dev.tensor(y), dev.tensor(hyper, np.uint32)
        (got,) = run_ops(dev, [ty, th], [Axpby(dev, ty, ty, n, hyper_a=(th, slots.HP_GRAD_UNSCALE))(0.0, 0.0)], [ty])
        out.append(compare("axpby a from hyper, in place", str(n), got, y * np.float32(2.0**-16), 0.0, 0.0))
    if dev.runs_float16:
        out += _half_checks(dev, rng)
    return out


def _half_checks(dev: Device, rng) -> list[ParityResult]:
    """The float16 variant (HALF) against numpy's float16 arithmetic: odd counts (half a word of
    padding), and zeroing over float16 NaN/Inf."""

    def run_half(x, y, a, b, c):  # y = a*x + b*y + c on the device, as float16 values
        tx, ty = half_tensor(dev, x), half_tensor(dev, y)
        (got,) = run_ops(dev, [tx, ty], [Axpby(dev, tx, ty, x.size, half=True)(a, b, c)], [ty])
        return unpack_half(got, x.size)

    out = []
    for n in (1, 65, 1001):
        x, y = (rng.standard_normal(n).astype(np.float16) for _ in range(2))
        want = axpby_reference(x, y, 0.5, 2.0, -1.0, dtype=np.float16)
        out.append(compare("axpby float16", str(n), run_half(x, y, 0.5, 2.0, -1.0), want, Axpby.HALF_ATOL, 2e-3))
    n = 101
    got = run_half(np.full(n, np.nan, np.float16), np.full(n, np.inf, np.float16), 0.0, 0.0, 0.0)
    out.append(compare("axpby float16 zero over NaN/Inf", str(n), got, np.zeros(n), 0.0, 0.0))
    return out
