"""The Trainer's time budget (train.time_budget_s, --time-budget): what a budgeted run does around
its steps. catchat/budget.py holds the clock, the measured costs and the plan; this mixin of
`catchat.train.Trainer` asks them before each step (the step's progress, so its lr, and whether it
is the last), probes the eval's cost before the first step, logs the plan, and keeps a resumed
run's budget. An unbudgeted run (self.budget None) never reaches any of it.
"""

from __future__ import annotations

import time

from catchat import checkpoint as ck
from catchat import config as cfgmod
from catchat.budget import Budget, checkpoint_guess
from catchat.evaluate import evaluate_lanes, windows_to_score
from catchat.schedule import TimedStep, interval_crossed


class BudgetedRun:
    """Trainer methods of a time-budgeted run (a mixin: they use the Trainer's state)."""

    def _keep_budget(self, ckpt: ck.Checkpoint) -> cfgmod.Config:
        """A time-budgeted run stays budgeted: resumed with a config that sets no budget, it keeps the
        checkpoint's budget and step caps (train.time_budget_s, total_steps, cycles), so a plain
        --resume keeps the remaining budget. A config with a budget of its own sets that one instead
        (the time already used still counts)."""
        saved = ckpt.state.get("config", {}).get("train", {})
        budget = saved.get("time_budget_s", 0)
        if self.cfg.train.time_budget_s > 0 or not budget:
            return self.cfg
        self.report("warning", text=f"the checkpoint's time budget of {budget:g} s is kept (and its step cap, if any): "
                                    "pass --time-budget to change it")
        return cfgmod.with_changes(self.cfg, train={k: saved[k] for k in ("time_budget_s", "total_steps", "cycles")})

    def _make_budget(self, ckpt: ck.Checkpoint | None) -> Budget | None:
        """The time budget (None without one); a resume goes on from the checkpoint's run clock."""
        if self.cfg.train.time_budget_s <= 0:
            return None
        saved = ckpt.state.get("budget") if ckpt is not None else None
        budget = Budget.from_state(self.cfg.train.time_budget_s, saved, self.clock.origin)
        self.clock = budget.clock
        carry = self.spec.layers * self.cfg.data.batch_lanes * self.spec.hidden
        budget.costs.checkpoint_guess_s = checkpoint_guess(4 * (3 * self.layout.total + carry))
        return budget

    def _steps_expected(self, decision: TimedStep | None) -> int:
        """The run's length in steps as far as it is known now (for the progress display): the plan,
        or for a budgeted run the steps done plus those the time left holds at the current pace."""
        if decision is None:
            return self.total_steps
        if decision.last:
            return self.global_step
        step_s = self.budget.costs.step_s()
        left = max(0, int((self.budget.plan().deadline_s - self.clock.now()) / step_s)) if step_s else 0
        expected = self.global_step + left
        return min(expected, self.total_steps) if self.total_steps else expected

    def _next_decision(self) -> TimedStep | None:
        """A budgeted run's plan for the step about to start (None without a budget): the interval
        eval and checkpoint that would follow it count as time spent before the next one."""
        if self.budget is None:
            return None
        cfg, costs = self.cfg, self.budget.costs
        seqs = self.cursor.seqs
        after_seqs = seqs + cfgmod.seqs_per_step(cfg)
        after = costs.eval_cost() if interval_crossed(seqs, after_seqs, cfg.eval.eval_every_seqs) else 0.0
        if interval_crossed(seqs, after_seqs, cfg.checkpoint.checkpoint_every_seqs):
            after += costs.checkpoint_cost()
        return self.budget.next_step(self.global_step, self.total_steps, after)

    PROBE_CHARS = 8  # characters per sample timed by the eval probe

    PROBE_SAFETY = 1.5  # the probe's estimate is scaled up: timings on a loaded machine vary by tens of percent

    def _probe_eval(self) -> None:
        """Costs before they are measured, for the budget's plan. An eval: one eval window
        (teacher-forced, and free-running with eval.free_running) and PROBE_CHARS sampled characters,
        each timed after a warm-up call (whose one-off costs a first eval would pay anyway), scaled to
        the eval's windows and eval.sample_chars, times PROBE_SAFETY. The first step: a forward and
        backward pass of each micro-batch, about 3 teacher-forced windows each."""
        costs, lanes, chars = self.budget.costs, self.eval_lanes, self.cfg.eval.sample_chars
        forward = _timed_twice(lambda: evaluate_lanes(self.prog, lanes, 1))
        free = (_timed_twice(lambda: evaluate_lanes(self.prog, lanes, 1, free_running=True))
                if self.cfg.eval.free_running else 0.0)
        windows = windows_to_score(lanes, self.cfg.eval.eval_windows)
        per_char = _timed_twice(lambda: self._sample_texts(self.PROBE_CHARS)) / self.PROBE_CHARS if chars > 0 else 0.0
        costs.eval_probe_s = self.PROBE_SAFETY * (windows * (forward + free) + chars * per_char)
        costs.step_guess_s = 3 * self.cfg.data.micro_batches * forward

    def _plan_budget(self) -> bool:
        """Before a budgeted process's first step: probe the eval's cost, log the plan (a `time_budget`
        event). Returns whether there is time left to train."""
        b = self.budget
        if b.costs.eval_s is None:
            self._probe_eval()
        plan = b.plan()
        left = plan.deadline_s - b.clock.now()
        self.event("time_budget", **b.summary(), deadline_s=round(plan.deadline_s, 3), training_s=round(left, 3),
                   eval_estimate_s=round(b.costs.eval_cost(), 3),
                   checkpoint_estimate_s=round(b.costs.checkpoint_cost(), 3))
        return left > 0

    def _budget_fields(self) -> dict:
        """The end event's account of a budgeted run: budget, clock, estimates (empty without one)."""
        return {} if self.budget is None else self.budget.summary()


def _timed_twice(fn) -> float:
    """Seconds the second of two calls of `fn` takes (the first pays one-off costs: pipelines, buffers)."""
    fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
