"""Dependent dispatches in one recorded sequence are ordered (tools/kp-patches/0002): a chain of
2,000 axpby dispatches, each reading what the one before wrote (tests/test_ordering.py)."""

from __future__ import annotations

import numpy as np

from catchat.parity import ParityResult, compare
from catchat.vk.device import Device
from catchat.vk.kernels import Axpby, run_ops


def chained_dispatch_sum(dev: Device, n_elements: int, n_dispatches: int) -> np.ndarray:
    """Ping-pong `dst = src + 1` between two buffers n_dispatches times, all in one sequence.

    Every element must end at exactly n_dispatches; a dispatch that ran before its predecessor's
    writes were visible loses updates (what a missing compute -> compute barrier does on a GPU).
    """
    a, b = dev.tensor(np.zeros(n_elements, np.float32)), dev.tensor(np.zeros(n_elements, np.float32))
    a_to_b, b_to_a = Axpby(dev, a, b, n_elements), Axpby(dev, b, a, n_elements)
    ops = [(a_to_b if i % 2 == 0 else b_to_a)(1.0, 0.0, 1.0) for i in range(n_dispatches)]
    (out,) = run_ops(dev, [a, b], ops, [b if n_dispatches % 2 else a])
    return out


def ordering_check(dev: Device, n_elements: int = 1 << 16, n_dispatches: int = 2000) -> ParityResult:
    """The chained-dispatch ordering test as a parity row (exact: every element must equal n)."""
    out = chained_dispatch_sum(dev, n_elements, n_dispatches)
    return compare("chained dispatches", f"{n_dispatches}x{n_elements}", out,
                   np.full(n_elements, float(n_dispatches)), 0.0, 0.0)


def parity_checks(dev: Device) -> list[ParityResult]:
    """The chain at its default size: one row."""
    return [ordering_check(dev)]
