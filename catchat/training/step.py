"""The recorded step (the second part of the loop): one optimizer step on the device, and what
its outcome does to the run's counters.

The step's valid-target count comes from the data on the host, for the whole step on every rank
(lesson 10): a step with none, or with a gradient that is not finite, is skipped by the GPU's guard
and logged. At fp16 an overflow halves the loss scale and is not a step toward
train.max_consecutive_skips. Faults injected for tests (catchat/run/faults.py: zero_valid, nan_grad,
device_lost) enter here.
"""

from __future__ import annotations

import time
from contextlib import ExitStack

from catchat import config as cfgmod
from catchat.data.lanes import n_valid as count_valid
from catchat.precision import GROWTH_INTERVAL
from catchat.run import faults as faultmod
from catchat.run.schedule import TimedStep, lr_at, lr_at_progress
from catchat.training.ranks import OneProcess
from catchat.training.state import RunState
from catchat.vk.program import Program, StepHyper, StepStats


def step_hyper(cfg: cfgmod.Config, lr: float, loss_scale: float = 1.0) -> StepHyper:
    """The StepHyper of a config at learning rate lr (and fp16's loss scale)."""
    t = cfg.train
    return StepHyper(lr=lr, optimizer=t.optimizer, beta1=t.beta1, beta2=t.beta2, eps=t.eps,
                     weight_decay=t.weight_decay, clip=t.clip, label_smoothing=t.label_smoothing,
                     dropout_embedding=t.dropout_embedding, dropout_hidden=t.dropout_hidden,
                     gradh_clamp=t.gradh_clamp, spectral_bound=t.spectral_bound, run_seed=t.seed,
                     tf_top_k=cfg.teacher_forcing.top_k if cfg.teacher_forcing.choice == "topk" else 0,
                     loss_scale=loss_scale)


def step_lr(decision: TimedStep | None, global_step: int, total_steps: int, cfg: cfgmod.Config) -> tuple[float, float]:
    """The learning rate of step global_step + 1 and the run's progress when it ends: from the step
    schedule (a pure function of the absolute step, lesson 2), or from a budgeted run's decision."""
    if decision is None:
        return lr_at(global_step, total_steps, cfg), (global_step + 1) / total_steps
    return lr_at_progress(decision.progress, cfg), decision.progress


class DeviceStep:
    """Runs a step's micro-batches through the program's recorded training step."""

    def __init__(self, prog: Program, cfg: cfgmod.Config, ranks: OneProcess, faults: tuple):
        self.prog, self.cfg, self.ranks, self.faults = prog, cfg, ranks, faults

    def run(self, batches: list, state: RunState, *, lr: float, tf: float,
            while_running) -> tuple[StepStats, int, float, float]:
        """Step state.global_step + 1 over `batches`: its stats (added up over the ranks), the step's
        valid targets, the seconds it took and the loss scale it ran at. `while_running` is called
        while the GPU works."""
        hits = faultmod.at(self.faults, state.global_step + 1)
        if "zero_valid" in hits:
            batches = faultmod.zero_targets(batches)
        valid = sum(count_valid(tg) for _, tg, _ in batches)  # the whole step's, on every rank (lesson 10)
        batches = self.ranks.mine(batches)
        start = time.perf_counter()
        with ExitStack() as injected:
            if "nan_grad" in hits:
                injected.enter_context(faultmod.nan_gradient(self.prog))
            if "device_lost" in hits:
                injected.enter_context(faultmod.lost_device(self.prog))
            scale = 1.0 if state.scaler is None else state.scaler.scale
            st = self.prog.train_step(batches, step_hyper(self.cfg, lr, scale), global_step=state.global_step,
                                      opt_t=state.applied_steps + 1, tf=tf, n_valid=valid,
                                      reduce_grads=self.ranks.reduce_grads, while_running=while_running)
        st = self.ranks.add_up(st, time.perf_counter() - start, state.global_step, self.prog.exchange.times)
        return st, valid, time.perf_counter() - start, scale


def settle(state: RunState, st: StepStats, scale: float, event) -> None:
    """A step taken: count it applied or skipped, move fp16's loss scale, log what needs a line."""
    if st.skipped:
        reason = "no valid targets" if st.n_valid == 0 else f"non-finite gradient norm ({st.grad_norm})"
        if st.n_valid and state.scaler is not None and state.scaler.overflow():
            # the scale's own doing: not a streak toward max_consecutive_skips (S halves at most
            # log2(S) times before an overflow at S = 1 counts, so a diverged run still stops)
            reason = f"fp16 overflow, loss scale {scale:.0f} -> {state.scaler.scale:.0f}"
            event("skipped_step", reason=reason, consecutive=state.consecutive_skips, loss_scale=state.scaler.scale)
        else:
            state.consecutive_skips += 1
            event("skipped_step", reason=reason, consecutive=state.consecutive_skips)
    else:
        state.applied_steps += 1
        state.consecutive_skips = 0
        if state.scaler is not None and state.scaler.applied() is not None:
            event("loss_scale", reason=f"{GROWTH_INTERVAL} applied steps without overflow",
                  loss_scale=state.scaler.scale)
