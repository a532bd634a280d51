"""The run's pace: how long it runs and what the learning rate follows. The loop is given one of
two parts and asks it the same questions either way.

`StepSchedule` (no time budget): the run ends after the planned total of steps, and each step's lr is
a pure function of the absolute global step (lesson 2), so a resume lands exactly where the run stopped.

`TimeBudget` (train.time_budget_s, --time-budget): the schedule runs on the run clock instead
(catchat/run/budget.py holds the clock, the measured costs and the plan). Before each step it asks the
plan for the step's progress (so its lr) and whether it is the last; before the first step it probes
the eval's cost and logs the plan; the run ends with a checkpoint and an eval inside the budget, and a
resumed run keeps what is left of it. Such a run is timing-dependent; unbudgeted runs are untouched.
"""

from __future__ import annotations

import time

from catchat import config as cfgmod
from catchat.inference.evaluate import evaluate_lanes, windows_to_score
from catchat.model import ParamLayout
from catchat.run import checkpoint as ck
from catchat.run.budget import Budget, Clock, checkpoint_guess
from catchat.run.schedule import TimedStep, interval_crossed, lr_at
from catchat.training.state import RunState


class StepSchedule:
    """An unbudgeted run: `total_steps` steps on the step schedule, timed by the process's clock."""

    budget = None

    def __init__(self, cfg: cfgmod.Config, total_steps: int, clock: Clock):
        self.cfg, self.total_steps, self.clock = cfg, total_steps, clock

    def start(self, evals, telemetry) -> bool:
        """Before the process's first step: whether there is time left to train (always)."""
        return True

    def next_step(self, state: RunState) -> TimedStep | None:
        """The plan for the step about to start: none, the step schedule sets its lr."""
        return None

    def took(self, decision: TimedStep | None, seconds: float) -> None:
        """A step taken (nothing to record)."""

    def steps_expected(self, decision: TimedStep | None, global_step: int) -> int:
        """The run's length in steps as far as it is known now (for the progress display)."""
        return self.total_steps

    def finished(self, global_step: int) -> bool:
        """The run has taken its last step."""
        return global_step >= self.total_steps

    def add_eval(self, seconds: float) -> None:
        """An eval's measured cost (unused)."""

    def add_checkpoint(self, seconds: float) -> None:
        """A checkpoint's measured cost (unused)."""

    def schedule_state(self, global_step: int) -> dict:
        """state.json's "schedule": the plan and the next step's lr."""
        return dict(total_steps=self.total_steps, lr_next=lr_at(global_step, self.total_steps, self.cfg))

    def checkpoint_state(self) -> dict:
        """What a checkpoint's state.json keeps of the pace besides "schedule" (nothing)."""
        return {}

    def describe(self, info: dict) -> None:
        """Add the pace to the start and resume events' `info` (nothing to add)."""

    def end_fields(self) -> dict:
        """The end event's account of the pace (nothing)."""
        return {}


class TimeBudget(StepSchedule):
    """A time-budgeted run: `budget` (catchat.run.budget.Budget) plans each step; `total_steps` is a
    step cap (0: none)."""

    PROBE_CHARS = 8  # characters per sample timed by the eval probe

    PROBE_SAFETY = 1.5  # the probe's estimate is scaled up: timings on a loaded machine vary by tens of percent

    def __init__(self, cfg: cfgmod.Config, total_steps: int, budget: Budget):
        super().__init__(cfg, total_steps, budget.clock)
        self.budget = budget

    def start(self, evals, telemetry) -> bool:
        """Before a budgeted process's first step: probe the eval's cost, log the plan (a `time_budget`
        event). Returns whether there is time left to train."""
        b = self.budget
        if b.costs.eval_s is None:
            self._probe_eval(evals)
        plan = b.plan()
        left = plan.deadline_s - b.clock.now()
        telemetry.event("time_budget", **b.summary(), deadline_s=round(plan.deadline_s, 3), training_s=round(left, 3),
                        eval_estimate_s=round(b.costs.eval_cost(), 3),
                        checkpoint_estimate_s=round(b.costs.checkpoint_cost(), 3))
        return left > 0

    def _probe_eval(self, evals) -> None:
        """Costs before they are measured, for the budget's plan. An eval: one eval window
        (teacher-forced, and free-running with eval.free_running) and PROBE_CHARS sampled characters,
        each timed after a warm-up call (whose one-off costs a first eval would pay anyway), scaled to
        the eval's windows and eval.sample_chars, times PROBE_SAFETY. The first step: a forward and
        backward pass of each micro-batch, about 3 teacher-forced windows each."""
        costs, lanes, chars, prog = self.budget.costs, evals.lanes, self.cfg.eval.sample_chars, evals.prog
        forward = _timed_twice(lambda: evaluate_lanes(prog, lanes, 1))
        free = (_timed_twice(lambda: evaluate_lanes(prog, lanes, 1, free_running=True))
                if self.cfg.eval.free_running else 0.0)
        windows = windows_to_score(lanes, self.cfg.eval.eval_windows)
        per_char = _timed_twice(lambda: evals.sample_texts(self.PROBE_CHARS)) / self.PROBE_CHARS if chars > 0 else 0.0
        costs.eval_probe_s = self.PROBE_SAFETY * (windows * (forward + free) + chars * per_char)
        costs.step_guess_s = 3 * self.cfg.data.micro_batches * forward

    def next_step(self, state: RunState) -> TimedStep:
        """The plan for the step about to start: the interval eval and checkpoint that would follow it
        count as time spent before the next one."""
        cfg, costs = self.cfg, self.budget.costs
        seqs = state.cursor.seqs
        after_seqs = seqs + cfgmod.seqs_per_step(cfg)
        after = costs.eval_cost() if interval_crossed(seqs, after_seqs, cfg.eval.eval_every_seqs) else 0.0
        if interval_crossed(seqs, after_seqs, cfg.checkpoint.checkpoint_every_seqs):
            after += costs.checkpoint_cost()
        return self.budget.next_step(state.global_step, self.total_steps, after)

    def took(self, decision: TimedStep | None, seconds: float) -> None:
        if decision is not None:
            self.budget.took(decision, seconds)

    def steps_expected(self, decision: TimedStep | None, global_step: int) -> int:
        """The steps done plus those the time left holds at the current pace."""
        if decision is None:
            return self.total_steps
        if decision.last:
            return global_step
        step_s = self.budget.costs.step_s()
        left = max(0, int((self.budget.plan().deadline_s - self.clock.now()) / step_s)) if step_s else 0
        expected = global_step + left
        return min(expected, self.total_steps) if self.total_steps else expected

    def finished(self, global_step: int) -> bool:
        """The step at progress 1 was taken, or the step cap reached."""
        return self.budget.done or 0 < self.total_steps <= global_step

    def add_eval(self, seconds: float) -> None:
        self.budget.costs.add_eval(seconds)

    def add_checkpoint(self, seconds: float) -> None:
        self.budget.costs.add_checkpoint(seconds)

    def schedule_state(self, global_step: int) -> dict:
        """The plan and the progress reached."""
        return dict(total_steps=self.total_steps, time_budget_s=self.budget.budget_s, progress=self.budget.progress)

    def checkpoint_state(self) -> dict:
        """The run clock ("budget"), so a resume keeps the remaining budget."""
        return {"budget": self.budget.state()}

    def describe(self, info: dict) -> None:
        """The lr then follows the metrics' progress column (total_steps: a cap, 0 = none)."""
        info["schedule"]["time_budget_s"] = self.budget.budget_s
        info["budget"] = self.budget.summary()

    def end_fields(self) -> dict:
        """Budget, clock, estimates."""
        return self.budget.summary()


def keep_budget(cfg: cfgmod.Config, ckpt: ck.Checkpoint, report) -> cfgmod.Config:
    """A time-budgeted run stays budgeted: resumed with a config that sets no budget, it keeps the
    checkpoint's budget and step caps (train.time_budget_s, total_steps, cycles), so a plain
    --resume keeps the remaining budget. A config with a budget of its own sets that one instead
    (the time already used still counts)."""
    saved = ckpt.state.get("config", {}).get("train", {})
    budget = saved.get("time_budget_s", 0)
    if cfg.train.time_budget_s > 0 or not budget:
        return cfg
    report("warning", text=f"the checkpoint's time budget of {budget:g} s is kept (and its step cap, if any): "
                           "pass --time-budget to change it")
    return cfgmod.with_changes(cfg, train={k: saved[k] for k in ("time_budget_s", "total_steps", "cycles")})


def make_pace(cfg: cfgmod.Config, total_steps: int, ckpt: ck.Checkpoint | None, clock: Clock, layout: ParamLayout
              ) -> StepSchedule:
    """The run's pace: the time budget (a resume goes on from the checkpoint's run clock), or the step schedule."""
    if cfg.train.time_budget_s <= 0:
        return StepSchedule(cfg, total_steps, clock)
    saved = ckpt.state.get("budget") if ckpt is not None else None
    budget = Budget.from_state(cfg.train.time_budget_s, saved, clock.origin)
    spec = layout.spec
    carry = spec.layers * cfg.data.batch_lanes * spec.hidden
    budget.costs.checkpoint_guess_s = checkpoint_guess(4 * (3 * layout.total + carry))
    return TimeBudget(cfg, total_steps, budget)


def _timed_twice(fn) -> float:
    """Seconds the second of two calls of `fn` takes (the first pays one-off costs: pipelines, buffers)."""
    fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
