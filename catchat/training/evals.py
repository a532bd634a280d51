"""Evals (the third part of the loop): teacher-forced and (eval.free_running) free-running metrics
on the held-out split's lanes, and samples in samples/ (eval.sample_chars).

Every run that evaluates ends with an eval at its last step (`Evals.final_due`), whether it is planned
in steps (train.total_steps, train.cycles) or in time (train.time_budget_s): the interval evals may miss
the last step, and the loss a run ends at is the number a reader compares.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from catchat import config as cfgmod
from catchat.data import vocab
from catchat.data.lanes import TOO_FEW_CONVERSATIONS, Lanes
from catchat.errors import UsageError
from catchat.inference.evaluate import evaluate_lanes
from catchat.model import ParamLayout
from catchat.run import runlog
from catchat.training.ranks import OneProcess
from catchat.training.state import RunState
from catchat.training.telemetry import memory_mb
from catchat.vk.program import Program


def last_eval_step(events: Path, global_step: int) -> int:
    """`global_step` where the run's log (events.jsonl) records an eval at that step since its last
    start or resume, else -1: a run resumed at the step it ended at (a finished run) does not run its
    final eval again, while one stopped between its final checkpoint and that eval runs it."""
    try:
        log = runlog.read_events(events)
    except OSError:
        return -1
    last = -1
    for e in log.events:
        if e.get("event") in ("start", "resume"):
            last = -1
        elif e.get("event") == "eval" and e.get("global_step") == global_step:
            last = global_step
    return last


def eval_lanes(corpus, cfg: cfgmod.Config) -> Lanes | None:
    """The eval split's lanes: for interval evals, and for the eval a time-budgeted run ends with
    (which therefore needs an eval split); None when neither asks for them."""
    budgeted = cfg.train.time_budget_s > 0
    if not budgeted and cfg.eval.eval_every_seqs <= 0:
        return None
    try:
        return Lanes.from_config(corpus, cfg, "eval")
    except UsageError as exc:  # Lanes' own refusal of an empty eval split, said for a budgeted run
        if not budgeted:
            raise
        hint = ('set data.eval_fraction > 0, or hold out plays (data.corpus = "shakespeare:hold-out")'
                if cfg.data.eval_fraction <= 0 else TOO_FEW_CONVERSATIONS)
        raise UsageError("a time-budgeted run ends with an eval, and " + exc.message, hint) from None


class Evals:
    """Scores the model on the eval lanes (all ranks take part) and writes samples (`samples`: the
    directory, None on ranks other than 0). Its time goes to `pace` (a budgeted run's estimates),
    its metrics to the telemetry as an `eval` event."""

    SAMPLE_SETTINGS = (("greedy", 0.0, 1), ("temperature 0.5", 0.5, 2), ("temperature 0.8", 0.8, 3))

    def __init__(self, prog: Program, dev, layout: ParamLayout, lanes: Lanes | None, cfg: cfgmod.Config, *,
                 samples: Path | None, ranks: OneProcess, pace, telemetry, tokens_per_step: int):
        self.prog, self.dev, self.layout, self.lanes, self.cfg = prog, dev, layout, lanes, cfg
        self.samples, self.ranks, self.pace, self.telemetry = samples, ranks, pace, telemetry
        self.tokens_per_step = tokens_per_step
        self._sampler = None

    def final_due(self, reason: str, state: RunState) -> bool:
        """Whether the run ends with one more eval: it reached its planned end (not Ctrl-C,
        --stop-after-steps or a failure), it evaluates at all (a budgeted run always; a run planned in
        steps with eval.eval_every_seqs > 0), and the last step's interval eval was not it already."""
        return reason == "done" and self.lanes is not None and state.last_eval_step != state.global_step

    def run(self, state: RunState, tf: float) -> dict | None:
        """Evaluate the model as it stands at state.global_step (`tf`: its teacher forcing, logged)."""
        started = time.perf_counter()
        state.last_eval_step = state.global_step
        self.write_samples(state.global_step)
        if self.lanes is None or self.lanes.windows_per_cycle == 0:
            return None
        n = self.cfg.eval.eval_windows
        comm, share = self.ranks.comm, self.ranks.share
        res = evaluate_lanes(self.prog, self.lanes, n, comm=comm, share=share)
        if self.cfg.eval.free_running:
            free = evaluate_lanes(self.prog, self.lanes, n, free_running=True, comm=comm, share=share)
            res["free_running"] = {k: free[k] for k in ("loss", "bpc", "top1", "top5")}
        self.pace.add_eval(time.perf_counter() - started)
        self.telemetry.event("eval", seqs=state.cursor.seqs, tokens=state.global_step * self.tokens_per_step, tf=tf,
                             **res, **memory_mb())
        return res

    def write_samples(self, global_step: int) -> Path | None:
        """samples/step-NNNNNNN.txt: greedy, temperature 0.5 and 0.8 (fixed seeds) from <bos>."""
        chars = self.cfg.eval.sample_chars
        if chars <= 0 or self.samples is None:
            return None
        path = self.samples / f"step-{global_step:07d}.txt"
        path.write_text("\n".join(self.sample_texts(chars)))
        return path

    def sample_texts(self, chars: int) -> list[str]:
        """The SAMPLE_SETTINGS samples of `chars` characters each from <bos>, as the samples file has them."""
        from catchat.inference.generate import Generator, Sampling

        flat = self.prog.get_params()
        if self._sampler is None:
            self._sampler = Generator(self.dev, self.layout, flat, streams=1, prefill=1)
        else:
            self._sampler.set_params(flat)
        parts = []
        for label, temperature, seed in self.SAMPLE_SETTINGS:
            self._sampler.reset()
            ids = self._sampler.generate(np.array([vocab.BOS], np.uint32), chars,
                                         Sampling(temperature=temperature), seed=seed)[0]
            parts.append(f"=== {label} (seed {seed}) ===\n{vocab.decode(ids, show_specials=False)}\n")
        return parts
