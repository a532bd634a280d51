"""Learning-rate schedule and interval checks: pure functions of the absolute step / seqs count
(or, with a time budget, of the plan's progress).

Nothing here keeps state (docs/lessons.md, lessons 2 and 4): a resumed run asks `lr_at` for the same
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

With a time budget (train.time_budget_s) the same WSD shape runs on the *progress* of the plan
instead of the step count: `lr_at_progress(p)` with p in (0, 1] the share of the plan done when the
step ends (the step version's (s + 1) / total_steps). `TimePlan` turns the run clock into p, and
`plan_step` decides which step is the last one (p = 1, so it uses lr_min): the step after which
another would not end before the deadline. Those are pure functions too, of measured times instead
of the step count; the trainer (catchat/run/budget.py) feeds them its clock.
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
    return _cooldown(w, (s - p.cooldown_start + 1) / (total_steps - p.cooldown_start))


def lr_at_progress(progress: float, cfg) -> float:
    """Learning rate for a step that ends at `progress` of the plan (the share done after it, in
    [0, 1]; 1 marks the last step): the WSD shape of `lr_at` on a continuous axis.

        p < warmup_fraction                 lr * p / warmup_fraction
        p <= 1 - cooldown_fraction          lr
        p in (1 - cooldown_fraction, 1]     q = (p - (1 - cooldown_fraction)) / cooldown_fraction:
                                            cosine or linear from lr to lr_min, lr_min at p = 1
    Values outside [0, 1] are clamped: a step never gets a learning rate outside [0, lr]."""
    w = _wsd(cfg)
    if not math.isfinite(progress):
        raise ValueError(f"progress must be a finite number, got {progress}")
    p = min(max(float(progress), 0.0), 1.0)
    if p >= 1.0:
        return float(w.lr_min)
    if p < w.warmup_fraction:
        return w.lr * p / w.warmup_fraction
    start = 1.0 - w.cooldown_fraction
    if p <= start:
        return float(w.lr)
    return _cooldown(w, (p - start) / w.cooldown_fraction)


def _cooldown(w: WSD, frac: float) -> float:
    """lr at `frac` in (0, 1] of the cooldown."""
    if w.cooldown_shape == "cosine":
        return w.lr_min + (w.lr - w.lr_min) * 0.5 * (1.0 + math.cos(math.pi * frac))
    if w.cooldown_shape == "linear":
        return w.lr + (w.lr_min - w.lr) * frac
    raise ValueError(f"unknown cooldown_shape {w.cooldown_shape!r} (cosine or linear)")


@dataclass(frozen=True)
class TimePlan:
    """A time-budgeted run's plan, in seconds of the run clock (which counts every process's time
    from its start, start-up included, and goes on from a checkpoint's count on resume).

    Training steps fill [train_start_s, deadline_s]; the last `reserve_s` seconds of the budget are
    kept for the final checkpoint and eval. `progress(t)` is the share of that span done at t."""

    budget_s: float
    reserve_s: float
    train_start_s: float

    @property
    def deadline_s(self) -> float:
        """When the last step must have ended."""
        return self.budget_s - self.reserve_s

    def progress(self, clock_s: float) -> float:
        """(clock_s - train_start_s) / (deadline_s - train_start_s), clamped to [0, 1] (1 when the
        span is empty: the budget was spent before training began)."""
        span = self.deadline_s - self.train_start_s
        if span <= 0:
            return 1.0
        return min(max((clock_s - self.train_start_s) / span, 0.0), 1.0)


@dataclass(frozen=True)
class TimedStep:
    """What `plan_step` decided for the step about to run."""

    progress: float  # share of the plan done when the step ends; 1.0 exactly for the last step
    last: bool  # no step follows it: it gets lr_min, then the run ends


def plan_step(plan: TimePlan, *, now_s: float, step_s: float | None, after_s: float, global_step: int,
              total_steps: int = 0, prev_progress: float = 0.0) -> TimedStep:
    """Progress and last-step decision for the step about to start at `now_s` on the run clock.

    step_s: the expected duration of a step (None before one was measured: then 0);
    after_s: the expected interval work (evals, checkpoints) right after this step, were it not
    the last; total_steps > 0: a step cap (train.total_steps / cycles), whose progress
    (global_step + 1) / total_steps counts as well: whichever plan is further along drives the
    schedule, and whichever runs out first ends the run.

    The step is the last when another one after it (and after `after_s`) would not end by the
    deadline, or when it reaches the step cap. Otherwise its progress is the time share at its
    expected end, never below `prev_progress` (so the learning rate never climbs back when an
    estimate changes) and below 1."""
    tau = step_s or 0.0
    capped = total_steps > 0 and global_step + 1 >= total_steps
    if capped or now_s + tau + after_s + tau > plan.deadline_s:
        return TimedStep(progress=1.0, last=True)
    p = plan.progress(now_s + tau)
    if total_steps > 0:
        p = max(p, (global_step + 1) / total_steps)
    return TimedStep(progress=min(max(p, prev_progress), math.nextafter(1.0, 0.0)), last=False)


def phase_at(global_step: int, total_steps: int, cfg) -> str:
    """'warmup', 'stable', 'cooldown' or 'done' for the update after `global_step` steps."""
    p = phases(total_steps, cfg)
    if global_step >= total_steps:
        return "done"
    if global_step < p.warmup_end:
        return "warmup"
    return "stable" if global_step < p.cooldown_start else "cooldown"


def interval_crossed(prev_seqs: int, new_seqs: int, every: int) -> bool:
    """True when a multiple of `every` lies in (prev_seqs, new_seqs] (docs/lessons.md, lesson 4).

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
