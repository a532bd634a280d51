"""Fault injection for training runs: `CATCHAT_FAULT`, a documented way to make a real run meet a
fault on purpose (docs/reliability.md), so the guards that handle it can be seen working on any
device, through the real CLI.

    CATCHAT_FAULT="nan_grad@step=3,zero_valid@step=5" catchat train configs/tiny.toml

Items are separated by commas; each is KIND@step=N, N being the optimizer step the fault hits
(the metrics.csv row with global_step = N, i.e. the update after N - 1 completed steps):

    nan_grad     the step's gradient is NaN: the scale 1/N_valid that the loss kernel applies to
                 every dlogit is uploaded as NaN for this step only (the forward pass and its loss
                 are untouched, parameters are never poisoned). The optimizer's guard must skip the
                 step (metrics skipped=1, a skipped_step event) and the run goes on.
    zero_valid   every target of the step's windows is <pad>: a batch with no valid tokens. The
                 step must be skipped the same way (docs/lessons.md, lesson 10).
    device_lost  the step's optimizer sequence fails as kp fails on VK_ERROR_DEVICE_LOST: the run
                 stops with a one-line error saying the last checkpoint is intact and how to resume.

A run with faults says so in its start/resume event (`faults`) and on the console.

`CATCHAT_CRASH_AT=POINT[#K][:SIGNAL]` sends the process SIGKILL (or SIGNAL: INT, TERM) the K-th
time (default 1) it reaches the named crash point (`crash_point(POINT)` in run/checkpoint.py,
run/rundir.py, training/loop.py, training/start.py; start-up's in catchat/__init__.py and catchat/cli):
the kill-anywhere tests use it to stop a run at exact moments of a save, a prune, a resume start-up and
a branch, and the signal tests to interrupt a command's start-up.
"""

from __future__ import annotations

import math
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

# crash_point lives with the package's first lines (catchat/__init__.py): start-up has points too, before any import
from catchat import CRASH_ENV, crash_point  # noqa: F401
from catchat.errors import UsageError

ENV = "CATCHAT_FAULT"
KINDS = ("nan_grad", "zero_valid", "device_lost")
_ITEM = re.compile(r"^\s*([a-z_]+)\s*@\s*step\s*=\s*(\d+)\s*$")
_HINT = ("e.g. CATCHAT_FAULT=nan_grad@step=3,zero_valid@step=5 (kinds: " + ", ".join(KINDS)
         + "); unset it for a normal run")


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int  # the 1-based optimizer step it hits

    def __str__(self) -> str:
        return f"{self.kind}@step={self.step}"


def parse(text: str | None) -> tuple[Fault, ...]:
    """Faults from the CATCHAT_FAULT syntax; a malformed item is a UsageError naming it."""
    if not text or not text.strip():
        return ()
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        m = _ITEM.match(item)
        if not m or m.group(1) not in KINDS or int(m.group(2)) < 1:
            raise UsageError(f"{ENV}: cannot read {item.strip()!r} (expected KIND@step=N, N >= 1, KIND one of "
                             f"{', '.join(KINDS)})", _HINT)
        out.append(Fault(m.group(1), int(m.group(2))))
    return tuple(out)


def from_env() -> tuple[Fault, ...]:
    return parse(os.environ.get(ENV))


def at(faults, step: int) -> set[str]:
    """Kinds of fault that hit optimizer step `step` (1-based)."""
    return {f.kind for f in faults if f.step == step}


def zero_targets(batches):
    """The step's (tokens, targets, resets) with every target <pad>."""
    return [(tok, np.zeros_like(tg), rs) for tok, tg, rs in batches]


@contextmanager
def nan_gradient(prog):
    """For the duration: every hyper upload of `prog` carries 1/N_valid = NaN, so every gradient
    of the step is NaN while parameters, data and the forward loss stay as they are."""
    from catchat.vk import slots

    real = prog.hyper_words

    def poisoned(*args, **kwargs):
        words = dict(real(*args, **kwargs))
        words[slots.HP_INV_N_VALID] = slots.f32_bits(math.nan)
        return words

    prog.hyper_words = poisoned
    try:
        yield
    finally:
        del prog.hyper_words  # the class method again


class _LostSequence:
    def __init__(self, real):
        self.real = real

    def eval(self, *_):
        raise RuntimeError("vk::Queue::submit: ErrorDeviceLost (injected by CATCHAT_FAULT)")


@contextmanager
def lost_device(prog):
    """For the duration: the program's optimizer sequence fails as kp does when the device is lost."""
    real = prog.seq_apply
    prog.seq_apply = _LostSequence(real)
    try:
        yield
    finally:
        prog.seq_apply = real


