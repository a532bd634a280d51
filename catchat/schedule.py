"""Learning-rate schedule and interval checks: pure functions of the absolute step / seqs count.

Nothing here keeps state (design.md lessons 2 and 4): a resumed run asks `lr_at` for the same
global step it would have reached without the interruption and gets the same value, so a resume
past the warmup never warms up again.

Step convention (lesson 3): `global_step` = optimizer steps completed. The update that turns the
model after N steps into the model after N + 1 steps uses `lr_at(N, total_steps, cfg)`.

WSD (warmup, stable, decay) over `total_steps` planned steps, with
    W = round(warmup_fraction * total_steps), C = round(cooldown_fraction * total_steps):
    step s < W                    lr * (s + 1) / W                  linear warmup, ends at lr
    W <= s < total_steps - C      lr                                stable
    total_steps - C <= s < total  p = (s - (total_steps - C) + 1) / C in (0, 1]
                                  cosine: lr_min + (lr - lr_min) * (1 + cos(pi p)) / 2
                                  linear: lr + (lr_min - lr) * p    the last planned step uses lr_min
    s >= total_steps              lr_min                            (a run extended past its plan)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WSD:
    """The numbers `lr_at` needs (from config: train.lr and the [schedule] section)."""

    lr: float
    warmup_fraction: float = 0.0
    cooldown_fraction: float = 0.0
    cooldown_shape: str = "cosine"  # "cosine" | "linear"
    lr_min: float = 0.0

    @classmethod
    def from_config(cls, cfg) -> WSD:
        s = cfg.schedule
        return cls(lr=cfg.train.lr, warmup_fraction=s.warmup_fraction, cooldown_fraction=s.cooldown_fraction,
                   cooldown_shape=s.cooldown_shape, lr_min=s.lr_min)


@dataclass(frozen=True)
class Phases:
    """Step boundaries of the three phases for one total_steps: warmup [0, warmup_end),
    stable [warmup_end, cooldown_start), cooldown [cooldown_start, total_steps)."""

    warmup_end: int
    cooldown_start: int
    total_steps: int


def _wsd(cfg) -> WSD:
    return cfg if isinstance(cfg, WSD) else WSD.from_config(cfg)


def phases(total_steps: int, cfg) -> Phases:
    """Where warmup ends and cooldown starts (cfg: a WSD or a catchat.config.Config)."""
    w = _wsd(cfg)
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warm = int(round(w.warmup_fraction * total_steps))
    cool = int(round(w.cooldown_fraction * total_steps))
    warm = min(warm, total_steps)
    cool = min(cool, total_steps - warm)
    return Phases(warmup_end=warm, cooldown_start=total_steps - cool, total_steps=total_steps)


def lr_at(global_step: int, total_steps: int, cfg) -> float:
    """Learning rate for the update after `global_step` completed steps (see the module doc).

    cfg: a `WSD` or a `catchat.config.Config` (uses train.lr and [schedule])."""
    w = _wsd(cfg)
    if global_step < 0:
        raise ValueError(f"global_step must be >= 0, got {global_step}")
    p = phases(total_steps, w)
    s = global_step
    if s >= total_steps:
        return float(w.lr_min)
    if s < p.warmup_end:
        return w.lr * (s + 1) / p.warmup_end
    if s < p.cooldown_start:
        return float(w.lr)
    frac = (s - p.cooldown_start + 1) / (total_steps - p.cooldown_start)
    if w.cooldown_shape == "cosine":
        return w.lr_min + (w.lr - w.lr_min) * 0.5 * (1.0 + math.cos(math.pi * frac))
    if w.cooldown_shape == "linear":
        return w.lr + (w.lr_min - w.lr) * frac
    raise ValueError(f"unknown cooldown_shape {w.cooldown_shape!r} (cosine or linear)")


def phase_at(global_step: int, total_steps: int, cfg) -> str:
    """'warmup', 'stable', 'cooldown' or 'done' for the update after `global_step` steps."""
    p = phases(total_steps, cfg)
    if global_step >= total_steps:
        return "done"
    if global_step < p.warmup_end:
        return "warmup"
    return "stable" if global_step < p.cooldown_start else "cooldown"


def interval_crossed(prev_seqs: int, new_seqs: int, every: int) -> bool:
    """True when a multiple of `every` lies in (prev_seqs, new_seqs] (design.md lesson 4).

    Intervals fire by crossing a boundary, so a step that consumes more seqs than one interval,
    or a step size that does not divide `every`, still fires (once). every <= 0 means off."""
    if new_seqs < prev_seqs:
        raise ValueError(f"seqs count went backwards: {prev_seqs} -> {new_seqs}")
    if every <= 0:
        return False
    return new_seqs // every > prev_seqs // every


def crossings(prev_seqs: int, new_seqs: int, every: int) -> int:
    """How many multiples of `every` lie in (prev_seqs, new_seqs] (0 when every <= 0)."""
    if new_seqs < prev_seqs:
        raise ValueError(f"seqs count went backwards: {prev_seqs} -> {new_seqs}")
    return 0 if every <= 0 else new_seqs // every - prev_seqs // every


# ---------------------------------------------------------------------------------------------
# Teacher forcing (scheduled sampling): a pure function of the corpus cycles completed
# ---------------------------------------------------------------------------------------------

def tf_at(cycles_done: float, cfg) -> float:
    """Teacher forcing after `cycles_done` passes over the train split (seqs / seqs_per_cycle).

    x = max(0, cycles_done - hold_cycles) / decay_cycles; the gap start - floor shrinks as
    linear: 1 - min(x, 1); exponential: exp(-5x); inverse_sigmoid: 1 / (1 + exp(10 (x - 1/2)))
    (the last two are ~1% of the gap at x = 1). Keyed to cycles, not configured epochs, and stored
    nowhere: a resumed run recomputes it from its data cursor.
    """
    tf = cfg.teacher_forcing if hasattr(cfg, "teacher_forcing") else cfg
    if tf.schedule == "constant" or tf.start <= tf.floor:
        return float(tf.start)
    x = max(0.0, cycles_done - tf.hold_cycles) / tf.decay_cycles
    gap = tf.start - tf.floor
    if tf.schedule == "linear":
        share = 1.0 - min(x, 1.0)
    elif tf.schedule == "exponential":
        share = math.exp(-5.0 * x)
    elif tf.schedule == "inverse_sigmoid":
        share = 1.0 / (1.0 + math.exp(min(10.0 * (x - 0.5), 700.0)))
    else:
        raise ValueError(f"unknown teacher-forcing schedule {tf.schedule!r}")
    return float(tf.floor + gap * share)
