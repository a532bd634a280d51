"""Medians of timed calls and of recorded sequences, for the benchmarks and the tuner."""

from __future__ import annotations

import time

import numpy as np


class NoProgress:
    """A stand-in for a rich Progress: `step(label)` before each unit of long work."""

    def step(self, label: str) -> None:
        pass


def step_times(fn, reps: int) -> list[float]:
    """Seconds of each of reps runs of fn() (at least one)."""
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps runs."""
    return float(np.median(step_times(fn, reps)))


def timed_sequence(dev, ops, reps: int, warmup: int = 1) -> float:
    """Median seconds of one recorded sequence of ops over reps runs, after warmup runs."""
    seq = dev.recorded(ops)
    for _ in range(warmup):
        seq.eval()
    return timed(seq.eval, reps)
