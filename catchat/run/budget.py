"""A time-budgeted run's bookkeeping: the run clock, measured costs, and the state a checkpoint keeps.

`train.time_budget_s = B` (or `catchat train --time-budget B`) plans the run on wall-clock time
(docs/training.md "Time budget"). The pieces:

- The run clock counts seconds of the budget used: a resumed process starts from the count its
  checkpoint stored (`state.json` "budget") and adds its own time from its start, start-up (Python,
  Vulkan, shaders, corpus) included. Time between processes (the machine off) is not counted;
  neither is the time a killed process spent after its last checkpoint (a resume redoes that work).
- `Costs` keeps what this process measured: recent step durations, evals, checkpoints. Before the
  first eval is measured the trainer probes one (a window and a few sampled characters, scaled up).
- `Budget` turns clock and costs into each step's decision through the pure
  `catchat.run.schedule.plan_step`, keeps the progress reached (it never goes back), and gives the
  checkpoint state.

A budgeted run is timing-dependent by nature: how many steps it takes depends on the machine and
its load, so two runs (or a stopped-and-resumed one) are not bitwise equal. Unbudgeted runs keep
their exact-resume guarantee: nothing here is used by them, and their checkpoints hold no clock.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field

from catchat.run.schedule import TimedStep, TimePlan, plan_step

STEP_WINDOW = 8  # the step estimate is the longest of the last 8 steps: step times jitter (lavapipe +-10%)
MARGIN_FRACTION, MARGIN_MIN_S = 0.01, 0.5  # kept unspent besides the measured final work: timing noise
CHECKPOINT_BYTES_PER_S = 200e6  # a checkpoint's cost before one is measured: device readback + fsync'd write
CHECKPOINT_FIXED_S = 0.2


def process_age_s() -> float:
    """Seconds since this process started (Linux: /proc/self/stat's start time against the system's
    uptime), 0.0 where that cannot be read: then the clock starts when asked."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat, after pid and (comm)
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - started)


def process_start() -> float:
    """time.monotonic() at this process's start (the CLI's origin of the run clock)."""
    return time.monotonic() - process_age_s()


class Clock:
    """The run clock: `before_s` (counted by earlier processes) plus monotonic seconds since `origin`."""

    def __init__(self, before_s: float = 0.0, origin: float | None = None):
        self.before_s = float(before_s)
        self.origin = time.monotonic() if origin is None else float(origin)

    def now(self) -> float:
        return self.before_s + (time.monotonic() - self.origin)


@dataclass
class Costs:
    """Durations measured in this process (seconds)."""

    steps: deque = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    eval_s: float | None = None  # the longest eval measured
    eval_probe_s: float | None = None  # an eval's cost scaled up from a probe, until one is measured
    checkpoint_s: float | None = None  # the longest checkpoint measured
    checkpoint_guess_s: float = CHECKPOINT_FIXED_S  # from the checkpoint's size, until one is measured
    step_guess_s: float | None = None  # a step's cost from the probe, until one is measured

    def step_s(self) -> float | None:
        """A step's expected duration: the longest of the recent ones (before the first, the
        probe's guess; None without one)."""
        return max(self.steps) if self.steps else self.step_guess_s

    def add_step(self, seconds: float) -> None:
        self.steps.append(seconds)

    def add_eval(self, seconds: float) -> None:
        self.eval_s = max(self.eval_s or 0.0, seconds)

    def add_checkpoint(self, seconds: float) -> None:
        self.checkpoint_s = max(self.checkpoint_s or 0.0, seconds)

    def eval_cost(self) -> float:
        return self.eval_s if self.eval_s is not None else (self.eval_probe_s or 0.0)

    def checkpoint_cost(self) -> float:
        return self.checkpoint_s if self.checkpoint_s is not None else self.checkpoint_guess_s


def checkpoint_guess(nbytes: int) -> float:
    """A checkpoint's cost before one is measured, from the bytes it writes."""
    return CHECKPOINT_FIXED_S + nbytes / CHECKPOINT_BYTES_PER_S


# state.json "budget": what a resume needs to keep the remaining budget (checked field by field
# in catchat/run/checkpoint.py)
STATE_KEYS = ("budget_s", "elapsed_s", "train_start_s", "progress")


class Budget:
    """The time budget of one process of a run: clock, costs, the progress reached."""

    def __init__(self, budget_s: float, clock: Clock, *, train_start_s: float | None = None,
                 progress: float = 0.0):
        self.budget_s = float(budget_s)
        self.clock = clock
        self.costs = Costs()
        self.train_start_s = train_start_s  # set when the run's first step begins
        self.progress = float(progress)  # of the last step taken; 1.0: the last step was taken

    @classmethod
    def from_state(cls, budget_s: float, saved: dict | None, origin: float | None) -> Budget:
        """The budget of a resumed run: the clock goes on from the checkpoint's count (0 for a
        checkpoint without one: an unbudgeted run given a budget now starts counting now)."""
        saved = saved or {}
        clock = Clock(saved.get("elapsed_s", 0.0), origin)
        return cls(budget_s, clock, train_start_s=saved.get("train_start_s"), progress=saved.get("progress", 0.0))

    @property
    def done(self) -> bool:
        """The last step was taken (by this process or the one whose checkpoint it continues)."""
        return self.progress >= 1.0

    def reserve_s(self) -> float:
        """Seconds kept for the final checkpoint and eval, plus a margin for timing noise."""
        margin = max(MARGIN_MIN_S, MARGIN_FRACTION * self.budget_s)
        return self.costs.eval_cost() + self.costs.checkpoint_cost() + margin

    def plan(self) -> TimePlan:
        start = self.train_start_s if self.train_start_s is not None else self.clock.now()
        return TimePlan(budget_s=self.budget_s, reserve_s=self.reserve_s(), train_start_s=start)

    def next_step(self, global_step: int, total_steps: int, after_s: float) -> TimedStep:
        """The decision for the step about to start now (see catchat.run.schedule.plan_step)."""
        now = self.clock.now()
        if self.train_start_s is None:
            self.train_start_s = now
        return plan_step(self.plan(), now_s=now, step_s=self.costs.step_s(), after_s=after_s,
                         global_step=global_step, total_steps=total_steps, prev_progress=self.progress)

    def took(self, decision: TimedStep, seconds: float) -> None:
        """Record a step taken under `decision` that lasted `seconds`."""
        self.progress = decision.progress
        self.costs.add_step(seconds)

    def state(self) -> dict:
        """state.json's "budget" entry (STATE_KEYS) at this moment."""
        now = self.clock.now()
        start = self.train_start_s if self.train_start_s is not None else now
        return {"budget_s": self.budget_s, "elapsed_s": round(now, 3), "train_start_s": round(min(start, now), 3),
                "progress": self.progress}

    def summary(self) -> dict:
        """Fields for events (start/resume/end): the budget, the clock, the estimates in force."""
        step = self.costs.step_s()
        return {"time_budget_s": self.budget_s, "elapsed_s": round(self.clock.now(), 3),
                "reserve_s": round(self.reserve_s(), 3), "step_s": None if step is None else round(step, 4),
                "progress": self.progress}


def valid_state(entry) -> str | None:
    """Why a checkpoint's "budget" entry is not one a trainer wrote (None when it is)."""
    if not isinstance(entry, dict):
        return "must be a table"
    for key in STATE_KEYS:
        v = entry.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return f"{key} must be a finite number >= 0, got {v!r}"[:120]
    if entry["progress"] > 1:
        return f"progress must be in [0, 1], got {entry['progress']}"
    if entry["train_start_s"] > entry["elapsed_s"]:
        return f"train_start_s {entry['train_start_s']} exceeds elapsed_s {entry['elapsed_s']}"
    return None
