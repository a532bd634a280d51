"""The training loop: data in order, the recorded GPU step, evals, checkpoints, telemetry.

Units (lesson 4): `global_step` counts optimizer steps taken (applied or skipped: the data and
the schedule move on either way; `applied_steps` is Adam's t), `seqs` counts lane-windows
consumed, cycles count passes over the train split. Intervals fire when the seqs count crosses
a multiple of `*_every_seqs`. The learning rate is a pure function of the absolute global_step
(lesson 2), so a resume lands exactly where the run stopped. Every way a run ends (done,
--stop-after-steps, Ctrl-C/SIGTERM) writes a final checkpoint (lesson 8: all state, carry too).

With train.time_budget_s the schedule runs on the run clock instead (catchat/budget.py): each step's
learning rate comes from the share of the budget's training time done, the step after which no
other fits before the deadline is the last (at lr_min), and the run ends with a checkpoint and an
eval inside the budget. Such a run is timing-dependent; unbudgeted runs are untouched by it. The
Trainer's part of it is the mixin `catchat.train_budget.BudgetedRun`.

Data parallelism (`mpiexec -n N catchat train`, catchat/distributed.py, docs/distributed.md): a
Trainer given a `comm` is one rank. Every rank cuts the same global windows and trains its share of
the lanes (its columns, its carried state); the gradient sums meet in `Comm.sum_grads` before the one
optimizer step every rank applies. Rank 0 alone holds the run directory (lock, telemetry, samples,
checkpoints): at start-up it loads or initialises the state and sends it to the others; a checkpoint
gathers every lane's carried state to it. Stopping (Ctrl-C, SIGTERM) is agreed after each step, so
all ranks stop after the same step. The Trainer's part of it is the mixin
`catchat.train_ranks.RankedRun`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from catchat import checkpoint as ck
from catchat import config as cfgmod
from catchat import distributed, rundir, vocab
from catchat import faults as faultmod
from catchat.budget import Clock
from catchat.corpus import open_corpus
from catchat.errors import CatchatError, CheckpointWriteError, DeviceLost, UsageError
from catchat.evaluate import evaluate_lanes
from catchat.faults import crash_point
from catchat.fsutil import append_line, atomic_write_text, deferred_signals
from catchat.lanes import Lanes, prefix_dropout
from catchat.lanes import n_valid as count_valid
from catchat.model import ParamLayout, init_params, param_specs
from catchat.precision import GROWTH_INTERVAL, LossScaler
from catchat.rng import step_seed
from catchat.rundir import RunFiles, RunLock
from catchat.runlog import METRICS_COLUMNS
from catchat.schedule import TimedStep, interval_crossed, lr_at, lr_at_progress, tf_at
from catchat.train_budget import BudgetedRun
from catchat.train_ranks import RankedRun
from catchat.vk.device import format_bytes
from catchat.vk.kernels.gemm import coopmat_runs, products
from catchat.vk.program import Program, StepHyper, StepStats

__all__ = ["METRICS_COLUMNS", "RunFiles", "Trainer"]


def memory_mb() -> dict:
    """This process's resident memory now (`rss_mb`, None where /proc is missing) and at its peak
    (`peak_rss_mb`, getrusage), in MiB: logged with start, resume, eval, checkpoint and end events."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    rss = None
    try:
        with open("/proc/self/statm") as f:
            rss = round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {"rss_mb": rss, "peak_rss_mb": round(peak, 1)}


def step_hyper(cfg: cfgmod.Config, lr: float, loss_scale: float = 1.0) -> StepHyper:
    """The StepHyper of a config at learning rate lr (and fp16's loss scale)."""
    t = cfg.train
    return StepHyper(lr=lr, optimizer=t.optimizer, beta1=t.beta1, beta2=t.beta2, eps=t.eps,
                     weight_decay=t.weight_decay, clip=t.clip, label_smoothing=t.label_smoothing,
                     dropout_embedding=t.dropout_embedding, dropout_hidden=t.dropout_hidden,
                     gradh_clamp=t.gradh_clamp, spectral_bound=t.spectral_bound, run_seed=t.seed,
                     tf_top_k=cfg.teacher_forcing.top_k if cfg.teacher_forcing.choice == "topk" else 0,
                     loss_scale=loss_scale)


class Trainer(BudgetedRun, RankedRun):
    """One run: builds data, device program and state (fresh or resumed), then steps.

    It holds the run directory's lock from construction to `close()` (the CLI closes it; a
    garbage-collected Trainer drops it too). Nothing in the run directory is written before every
    check has passed: a refused start (bad checkpoint, other model size, Ctrl-C) changes no file,
    and a new run directory it made is removed again."""

    def __init__(self, cfg: cfgmod.Config, run_dir: Path, dev, *, config_name: str = "run",
                 resume: str | Path | None = None, reporter=None, faults=None, allow_unverified: bool = False,
                 clock_origin: float | None = None, comm: distributed.Comm | None = None):
        """faults: injected faults (catchat.faults); None reads $CATCHAT_FAULT. clock_origin: the
        time.monotonic() from which this process's time counts (the CLI: the process's start, so a
        time budget includes start-up); None: now. comm: this process is one rank of a data-parallel
        run (catchat.distributed); None: the only process."""
        self.clock = Clock(0.0, clock_origin)
        self.cfg, self.dev, self.config_name = cfg, dev, config_name
        self.comm = comm
        self.is_root = comm is None or comm.is_root
        self.files = RunFiles(Path(run_dir))
        self.report = reporter or (lambda *_a, **_k: None)
        self.faults = faultmod.from_env() if faults is None else tuple(faults)
        self._stop_signal: str | None = None
        self._stop_agreed: str | None = None  # with ranks: the signal some rank got, agreed after a step
        self.last_checkpoint_step = -1
        self.last_eval_step = -1
        self.consecutive_skips = 0
        self._next_data = None  # (cursor, global_step, the step's data): made during the step before
        self.scaler: LossScaler | None = None  # fp16's loss scale (train.precision); None at fp32
        self._exchange = dict(wait_s=0.0, exchange_s=0.0, transfer_s=0.0, step_s=0.0, steps=0)  # with ranks
        self.lock = None
        if not self.is_root:  # a rank other than 0 touches no file of the run: it takes rank 0's state
            self._follow()
            return
        created = not self.files.root.exists()
        self.files.root.mkdir(parents=True, exist_ok=True)
        try:
            self.lock = RunLock(self.files.lock)
            self._open(resume, allow_unverified)
        except BaseException:
            if comm is not None and not getattr(self, "_shared", False):
                self._share_start(None)  # the other ranks stop too (quietly: this rank says why)
            self.close()
            if created:  # a refused start leaves nothing behind
                shutil.rmtree(self.files.root, ignore_errors=True)
            raise

    def _open(self, resume, allow_unverified: bool) -> None:
        cfg = self.cfg
        finished = rundir.recover(self.files)
        if resume is None and ck.list_checkpoints(self.files.checkpoints):
            raise UsageError(f"{self.files.root} already holds a run with checkpoints",
                             hint="continue it with --resume, or choose another --run-dir")
        ckpt = None
        if resume is not None:
            ckpt = ck.load_checkpoint(self.files.checkpoints if resume == "" else resume, with_optimizer=True,
                                      allow_unverified=allow_unverified, warn=lambda m: self.report("warning", text=m))
            self._check_source(ckpt)
            cfg = self.cfg = self._keep_budget(ckpt)
        if self.comm is not None and cfg.train.time_budget_s > 0:
            raise UsageError(f"a time budget (train.time_budget_s = {cfg.train.time_budget_s:g}) is not supported on "
                             f"{self.comm.size} ranks: each rank's clock would plan its own steps",
                             "train on several ranks with train.total_steps or train.cycles, or on one process "
                             "with the budget")
        self._build(cfg)
        if ckpt is not None:
            self._restore(ckpt)
        else:
            self._fresh()
        self.budget = self._make_budget(ckpt)
        with deferred_signals():  # the run's files change only here, and whole: a Ctrl-C waits for it
            self._commit_files(ckpt, finished)
        self._columns = rundir.metrics_header(self.files.metrics).decode().split(",")
        if self.comm is not None:
            self._share_start(self._start_state())

    def _build(self, cfg: cfgmod.Config) -> None:
        """Corpus, lanes (all of them, on every rank), this rank's share of them and its Program."""
        self.corpus = open_corpus(cfg.data.corpus, on_build=lambda s: self.report("corpus", lines=s.lines()))
        self.lanes = Lanes.from_config(self.corpus, cfg, "train")
        self.eval_lanes = self._eval_lanes()
        self.total_steps = cfgmod.planned_total_steps(cfg, self.lanes.seqs_per_cycle)
        self.spec = cfgmod.model_spec(cfg, vocab.VOCAB_SIZE)
        self.layout = ParamLayout(self.spec)
        B = cfg.data.batch_lanes
        size, rank = (1, 0) if self.comm is None else (self.comm.size, self.comm.rank)
        self.shares = [distributed.lane_share(B, size, r) for r in range(size)]
        self.share = self.shares[rank]
        lo, hi = self.share
        self.prog = Program(self.dev, self.layout, cfg.data.window, hi - lo, optimizer=cfg.train.optimizer,
                            lane_offset=lo, lanes_total=B, precision=cfg.train.precision)
        self.products = products(self.dev, cfg.train.precision)
        if self.is_root and cfg.train.precision == "fp16" and not coopmat_runs(self.dev):  # the user asked for speed
            self.report("warning", text=f"precision fp16 on {self.dev.info.name}: {self.products}")
        self.tokens_per_step = cfgmod.seqs_per_step(cfg) * cfg.data.window

    def _set_carry(self, carry: np.ndarray | None) -> None:
        """Upload this rank's lanes of the carried state [L, B, H] of all lanes (None: zeros)."""
        lo, hi = self.share
        self.prog.set_carry(None if carry is None else np.ascontiguousarray(carry[:, lo:hi]))

    def close(self) -> None:
        """Release the run directory's lock (idempotent)."""
        lock, self.lock = getattr(self, "lock", None), None
        if lock is not None:
            lock.release()

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ setup
    def _check_source(self, ckpt: ck.Checkpoint) -> None:
        """A checkpoint of another run may start this one only while this one has no history."""
        if self._in_run(ckpt.path):
            return
        if ck.list_checkpoints(self.files.checkpoints) or rundir.has_history(self.files):
            raise UsageError(f"{ckpt.path} belongs to another run, and {self.files.root} already holds a run of "
                             "its own", hint="continue another run's checkpoint in a new --run-dir")

    def _in_run(self, path: Path) -> bool:
        return Path(path).resolve().parent == self.files.checkpoints.resolve()

    def _eval_lanes(self) -> Lanes | None:
        """The eval split's lanes: for interval evals, and for the eval a time-budgeted run ends with
        (which therefore needs an eval split); None when neither asks for them."""
        cfg = self.cfg
        budgeted = cfg.train.time_budget_s > 0
        if not budgeted and cfg.eval.eval_every_seqs <= 0:
            return None
        try:
            return Lanes.from_config(self.corpus, cfg, "eval")
        except UsageError as exc:  # Lanes' own refusal of an empty eval split, said for a budgeted run
            if not budgeted:
                raise
            raise UsageError("a time-budgeted run ends with an eval, and " + exc.message,
                             'set data.eval_fraction > 0, or hold out plays (data.corpus = "shakespeare:hold-out")'
                             ) from None

    def _fresh(self):
        flat = self.layout.flatten(init_params(self.spec, self.cfg.train.seed))
        self.prog.set_params(flat)
        self.prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
        self._start_carry = None
        self._set_carry(None)
        self.global_step, self.applied_steps = 0, 0
        self.scaler = LossScaler() if self.cfg.train.precision == "fp16" else None
        self.cursor = self.lanes.start()

    def _commit_files(self, ckpt: ck.Checkpoint | None, finished: list[Path]) -> None:
        """Write the run's files for a start that passed every check: config, a branch if the start
        abandons anything, the telemetry, the start/resume event."""
        files = self.files
        files.samples.mkdir(exist_ok=True)
        atomic_write_text(files.config,
                          cfgmod.resolved_toml(self.cfg, header=f"resolved config of run {files.root.name}"))
        crash_point("resume.config")
        info = self._run_info()
        if finished:
            info["finished_branches"] = [str(p.relative_to(files.root)) for p in finished]
        if self.lock.stale_pid:
            info["stale_lock_pid"] = self.lock.stale_pid
        in_run = ckpt is not None and self._in_run(ckpt.path)
        if in_run:
            branched = rundir.needs_branch(files, ckpt.global_step)
        else:  # a fresh start over an earlier attempt's telemetry; another run's checkpoint has none (checked)
            branched = ckpt is None and rundir.has_history(files)
        if branched:
            self.report("branch", **rundir.start_branch(files, ckpt.path if in_run else None, self._record("branch")))
        if ckpt is None:
            if not branched:  # a branch left a metrics header and its own event: the new telemetry
                rundir.new_telemetry(files)
            self.event("start", config=self.config_name, total_steps=self.total_steps,
                       model=cfgmod.to_dict(self.cfg)["model"], lanes=self.lanes.describe(), **info)
            return
        dropped = rundir.trim_tail(files, self.global_step) if in_run else 0
        if not in_run:
            rundir.new_telemetry(files)
        info["foreign"] = not in_run  # a run continued from another run's checkpoint (scan reports it)
        crash_point("resume.trimmed")
        self.event("resume", **{"from": str(ckpt.path)}, seqs=self.cursor.seqs, dropped_rows=dropped, **info)

    def _run_info(self) -> dict:
        """What `catchat scan` checks a run against: the schedule in force, step sizes, memory, faults."""
        s = self.cfg.schedule
        info = dict(schedule=dict(total_steps=self.total_steps, lr=self.cfg.train.lr, warmup_fraction=s.warmup_fraction,
                                  cooldown_fraction=s.cooldown_fraction, cooldown_shape=s.cooldown_shape,
                                  lr_min=s.lr_min),
                    seqs_per_step=cfgmod.seqs_per_step(self.cfg), tokens_per_step=self.tokens_per_step,
                    seqs_per_cycle=self.lanes.seqs_per_cycle, precision=self.cfg.train.precision,
                    gemm_products=self.products, sweep_products=self.prog.sweep_products, **memory_mb())
        info["teacher_forcing"] = cfgmod.to_dict(self.cfg)["teacher_forcing"]
        if self.budget is not None:  # the lr then follows the metrics' progress column (total_steps: a cap, 0 = none)
            info["schedule"]["time_budget_s"] = self.budget.budget_s
            info["budget"] = self.budget.summary()
        if self.faults:
            info["faults"] = [str(f) for f in self.faults]
        if self.comm is not None:
            info["distributed"] = dict(ranks=self.comm.size, lanes=[list(s) for s in self.shares])
        return info

    def _restore(self, ckpt: ck.Checkpoint):
        expected = {p.name: p.shape for p in param_specs(self.spec)}
        ck.check_shapes(ckpt.params, expected, str(ckpt.path))
        saved_train = ckpt.state.get("config", {}).get("train", {})
        if saved_train.get("optimizer", self.cfg.train.optimizer) != self.cfg.train.optimizer:
            raise UsageError(f"{ckpt.path} was trained with {saved_train['optimizer']}, the config asks for "
                             f"{self.cfg.train.optimizer}", hint="keep train.optimizer when resuming")
        lay = self.layout
        self.prog.set_params(lay.flatten(ckpt.params, np.float32))
        opt = ckpt.optimizer
        try:
            m = lay.flatten({n: opt[f"exp_avg.{n}"] for n in lay.names}, np.float32)
            v = lay.flatten({n: opt[f"exp_avg_sq.{n}"] for n in lay.names}, np.float32)
            carry = opt["carry.h0"]
            u = opt["spectral.u"]
        except KeyError as exc:
            raise UsageError(f"{ckpt.path / ck.OPTIMIZER_FILE} lacks {exc}",
                             hint="resume from another checkpoint") from None
        self.prog.set_optimizer_state(m, v, u)
        if carry.shape != (self.spec.layers, self.cfg.data.batch_lanes, self.spec.hidden):
            raise UsageError(f"{ckpt.path}: carried state {carry.shape} does not match data.batch_lanes / model",
                             hint="keep data.batch_lanes and the model when resuming")
        self._start_carry = carry
        self._set_carry(carry)
        try:
            self.cursor = self.lanes.restore(ckpt.state["cursor"])
            self.global_step = ckpt.global_step
            self.applied_steps = int(ckpt.state["applied_steps"])
            self._restore_precision(ckpt)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{ckpt.path / ck.STATE_FILE} is damaged ({type(exc).__name__}: {exc})",
                             hint="resume from another checkpoint") from None
        self.last_checkpoint_step = self.global_step

    def _restore_precision(self, ckpt: ck.Checkpoint) -> None:
        """fp16's loss scale from the checkpoint (an fp32 or older one has none: a fresh scale), and a
        line when the checkpoint was trained at another precision (allowed: the weights are float32)."""
        saved = ckpt.state.get("config", {}).get("train", {}).get("precision", "fp32")
        now = self.cfg.train.precision
        if saved != now:
            self.report("warning", text=f"{ckpt.path} was trained at precision {saved}; continuing at {now}")
        if now == "fp16":
            self.scaler = LossScaler.from_state(ckpt.state.get("loss_scale"))

    # ------------------------------------------------------------------ telemetry
    def _record(self, kind: str, **fields) -> dict:
        return {"event": kind, "global_step": self.global_step, "time": round(time.time(), 3), **fields}

    def event(self, kind: str, **fields):
        if not self.is_root:
            return
        rec = self._record(kind, **fields)
        append_line(self.files.events, json.dumps(rec))
        self.report(kind, **rec)

    def _metrics_row(self, st: StepStats, lr: float, tf: float, valid: int, seconds: float, progress: float,
                     loss_scale: float):
        if not self.is_root:
            return
        row = [self.global_step, self.cursor.seqs, self.cursor.cycle, self.global_step * self.tokens_per_step,
               f"{lr:.6g}", f"{tf:.6g}", f"{st.loss:.6f}" if not st.skipped or st.n_valid else "",
               f"{st.grad_norm:.6g}", int(st.clip_scale < 1.0 and not st.skipped), valid,
               f"{self.tokens_per_step / seconds:.1f}", f"{seconds * 1e3:.2f}", st.clamp_hits, int(st.skipped)]
        later = {"elapsed_s": f"{self.clock.now():.3f}", "progress": f"{progress:.9g}",
                 "loss_scale": f"{loss_scale:.0f}"}
        row += [later.get(c, "") for c in self._columns[len(METRICS_COLUMNS):]]  # the columns the file has
        append_line(self.files.metrics, ",".join(map(str, row)))

    # ------------------------------------------------------------------ state
    def save(self, reason: str) -> Path | None:
        """Write a checkpoint of everything needed to continue exactly (lesson 8); a budgeted run's
        checkpoint also holds its run clock ("budget"), so a resume keeps the remaining budget. With
        ranks, every rank sends its lanes' carried state and rank 0 writes (the others return None)."""
        started = time.perf_counter()
        if not self.is_root:
            self.comm.gather_lanes(self.prog.get_carry(), self.shares, "gathering the carried state for a checkpoint")
            self.last_checkpoint_step = self.global_step
            return None
        lay = self.layout
        params = {n: a.copy() for n, a in lay.unflatten(self.prog.get_params()).items()}
        m, v, u = self.prog.get_optimizer_state()
        opt = {f"exp_avg.{n}": a.copy() for n, a in lay.unflatten(m).items()}
        opt.update({f"exp_avg_sq.{n}": a.copy() for n, a in lay.unflatten(v).items()})
        opt["spectral.u"] = u.reshape(self.spec.layers, 2, 3, self.spec.hidden)
        opt["carry.h0"] = self.prog.get_carry()
        if self.comm is not None:  # every lane's state, in lane order, to rank 0
            opt["carry.h0"] = self.comm.gather_lanes(opt["carry.h0"], self.shares,
                                                     "gathering the carried state for a checkpoint")
        config = cfgmod.to_dict(self.cfg)
        state = dict(applied_steps=self.applied_steps, seqs=self.cursor.seqs, cycle=self.cursor.cycle,
                     cursor=self.cursor.to_dict(), run_seed=self.cfg.train.seed, reason=reason,
                     schedule=self._schedule_state(), tokens_seen=self.global_step * self.tokens_per_step,
                     config=config, config_name=self.config_name, model=config["model"])
        if self.budget is not None:
            state["budget"] = self.budget.state()
        if self.scaler is not None:
            state["loss_scale"] = self.scaler.state()
        try:
            path = ck.save_checkpoint(self.files.checkpoints, self.global_step, params, opt, state,
                                      keep_last=self.cfg.checkpoint.keep_last)
        except OSError as exc:
            need = sum(a.nbytes for a in (*params.values(), *opt.values())) + 2**16
            where = self.files.checkpoints
            free = shutil.disk_usage(where).free if where.exists() else 0
            raise CheckpointWriteError(
                f"could not write checkpoint {ck.step_dir_name(self.global_step)} in {where}: "
                f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
                + f"; a checkpoint needs {format_bytes(need)} there, {format_bytes(free)} is free",
                hint=f"make room for {format_bytes(need)} in {where} (free disk space, a quota, ulimit -f; older "
                     "checkpoints are pruned only after a new one is written); " + self._resume_hint()) from None
        self.last_checkpoint_step = self.global_step
        if self.budget is not None:
            self.budget.costs.add_checkpoint(time.perf_counter() - started)
        self.event("checkpoint", path=str(path), reason=reason, **memory_mb())
        return path

    def _schedule_state(self) -> dict:
        """state.json's "schedule": the plan and the next step's lr (budgeted: the progress reached)."""
        if self.budget is not None:
            return dict(total_steps=self.total_steps, time_budget_s=self.budget.budget_s,
                        progress=self.budget.progress)
        return dict(total_steps=self.total_steps, lr_next=lr_at(self.global_step, self.total_steps, self.cfg))

    def _resume_hint(self) -> str:
        """Which checkpoint is intact and how to continue from it (for failure messages)."""
        try:
            last = ck.resolve(self.files.checkpoints)
        except UsageError:
            return "no checkpoint of this run was written yet: start it again"
        return (f"the last checkpoint {last} is intact and `latest` names it: continue with "
                f"`catchat train CONFIG --run-dir {self.files.root} --resume`")

    def tf_now(self) -> float:
        """Teacher forcing for the next step: a pure function of the cycles completed (lesson 2)."""
        return tf_at(self.cursor.seqs / max(self.lanes.seqs_per_cycle, 1), self.cfg)

    def run_eval(self) -> dict | None:
        """Teacher-forced and (eval.free_running) free-running metrics on the held-out split, plus
        samples in samples/ (eval.sample_chars). A budgeted run times it (the final eval's estimate)."""
        started = time.perf_counter()
        self.last_eval_step = self.global_step
        if self.is_root:
            self.write_samples()
        if self.eval_lanes is None or self.eval_lanes.windows_per_cycle == 0:
            return None
        n = self.cfg.eval.eval_windows
        res = evaluate_lanes(self.prog, self.eval_lanes, n, comm=self.comm, share=self.share)
        if self.cfg.eval.free_running:
            free = evaluate_lanes(self.prog, self.eval_lanes, n, free_running=True, comm=self.comm, share=self.share)
            res["free_running"] = {k: free[k] for k in ("loss", "bpc", "top1", "top5")}
        if self.budget is not None:
            self.budget.costs.add_eval(time.perf_counter() - started)
        self.event("eval", seqs=self.cursor.seqs, tokens=self.global_step * self.tokens_per_step, tf=self.tf_now(),
                   **res, **memory_mb())
        return res

    SAMPLE_SETTINGS = (("greedy", 0.0, 1), ("temperature 0.5", 0.5, 2), ("temperature 0.8", 0.8, 3))

    def write_samples(self) -> Path | None:
        """samples/step-NNNNNNN.txt: greedy, temperature 0.5 and 0.8 (fixed seeds) from <bos>."""
        chars = self.cfg.eval.sample_chars
        if chars <= 0:
            return None
        path = self.files.samples / f"step-{self.global_step:07d}.txt"
        path.write_text("\n".join(self._sample_texts(chars)))
        return path

    def _sample_texts(self, chars: int) -> list[str]:
        """The SAMPLE_SETTINGS samples of `chars` characters each from <bos>, as the samples file has them."""
        from catchat.generate import Generator, Sampling

        flat = self.prog.get_params()
        if getattr(self, "_sampler", None) is None:
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

    # ------------------------------------------------------------------ the loop
    def _on_signal(self, signum, _frame):
        if self._stop_signal is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._stop_signal = signal.Signals(signum).name
        self.report("stopping", signal=self._stop_signal)

    def _step_data(self, cursor, global_step: int) -> tuple[list, object]:
        """The micro-batches [(tokens, targets, resets)] of optimizer step global_step + 1 from the
        lanes at `cursor` (prefix dropout applied), and the cursor after them: a function of its
        arguments alone."""
        cfg = self.cfg
        windows, next_cursor = self.lanes.take(cursor, cfg.data.micro_batches)
        batches = [(w.tokens, *prefix_dropout(w.targets, w.resets, cfg.data.prefix_dropout,
                                               cfg.data.prefix_max_fraction, step_seed(cfg.train.seed, global_step, k)))
                   for k, w in enumerate(windows)]
        return batches, next_cursor

    def _prepare_next(self, cursor, global_step: int) -> None:
        """The next step's data, made while this step runs on the GPU (~1-3 ms of host time per step
        otherwise spent between steps). Keyed by (cursor, step): `step` uses it only if they match,
        so it cannot change what is trained; should making it fail, `step` makes it again and fails
        there, where the error belongs."""
        try:
            self._next_data = (cursor, global_step, self._step_data(cursor, global_step))
        except Exception:  # noqa: BLE001 - speculative work: the next step repeats it and reports
            self._next_data = None

    def step(self, decision: TimedStep | None = None) -> StepStats:
        """One optimizer step over the next micro-batches; logs it. `decision`: a budgeted run's
        (catchat.budget.Budget.next_step), whose progress sets the lr; None: the step schedule."""
        cfg = self.cfg
        began = time.perf_counter()
        crash_point("train.step")
        ready, self._next_data = self._next_data, None
        if ready is not None and ready[:2] == (self.cursor, self.global_step):
            batches, next_cursor = ready[2]  # prepared while the previous step ran on the GPU
        else:
            batches, next_cursor = self._step_data(self.cursor, self.global_step)
        if decision is None:
            lr, progress = lr_at(self.global_step, self.total_steps, cfg), (self.global_step + 1) / self.total_steps
        else:
            lr, progress = lr_at_progress(decision.progress, cfg), decision.progress
        tf = self.tf_now()
        hits = faultmod.at(self.faults, self.global_step + 1)
        if "zero_valid" in hits:
            batches = faultmod.zero_targets(batches)
        valid = sum(count_valid(tg) for _, tg, _ in batches)  # the whole step's, on every rank (lesson 10)
        reduce_grads = None
        if self.comm is not None:  # this rank's lanes of every window; the ranks' gradients are added
            lo, hi = self.share
            batches = [tuple(np.ascontiguousarray(a[:, lo:hi]) for a in batch) for batch in batches]
            reduce_grads = self.comm.sum_grads
        start = time.perf_counter()
        with ExitStack() as injected:
            if "nan_grad" in hits:
                injected.enter_context(faultmod.nan_gradient(self.prog))
            if "device_lost" in hits:
                injected.enter_context(faultmod.lost_device(self.prog))
            scale = 1.0 if self.scaler is None else self.scaler.scale
            st = self.prog.train_step(batches, step_hyper(cfg, lr, scale), global_step=self.global_step,
                                      opt_t=self.applied_steps + 1, tf=tf, n_valid=valid, reduce_grads=reduce_grads,
                                      while_running=lambda: self._prepare_next(next_cursor, self.global_step + 1))
        if self.comm is not None:
            st = self._add_up(st, time.perf_counter() - start)
        seconds = time.perf_counter() - start
        self.cursor = next_cursor
        self.global_step += 1
        if st.skipped:
            reason = "no valid targets" if st.n_valid == 0 else f"non-finite gradient norm ({st.grad_norm})"
            if st.n_valid and self.scaler is not None and self.scaler.overflow():
                # the scale's own doing: not a streak toward max_consecutive_skips (S halves at most
                # log2(S) times before an overflow at S = 1 counts, so a diverged run still stops)
                reason = f"fp16 overflow, loss scale {scale:.0f} -> {self.scaler.scale:.0f}"
                self.event("skipped_step", reason=reason, consecutive=self.consecutive_skips,
                           loss_scale=self.scaler.scale)
            else:
                self.consecutive_skips += 1
                self.event("skipped_step", reason=reason, consecutive=self.consecutive_skips)
        else:
            self.applied_steps += 1
            self.consecutive_skips = 0
            if self.scaler is not None and self.scaler.applied() is not None:
                self.event("loss_scale", reason=f"{GROWTH_INTERVAL} applied steps without overflow",
                           loss_scale=self.scaler.scale)
        self._metrics_row(st, lr, tf, valid, seconds, progress, scale)
        self.report("step", stats=st, lr=lr, tf=tf, seconds=seconds, global_step=self.global_step,
                    total_steps=self._steps_expected(decision), tokens_per_s=self.tokens_per_step / seconds)
        if decision is not None:
            self.budget.took(decision, time.perf_counter() - began)
        return st

    def _finished(self) -> bool:
        """The run has taken its last step (a budgeted one: the step at progress 1, or the step cap)."""
        if self.budget is None:
            return self.global_step >= self.total_steps
        return self.budget.done or 0 < self.total_steps <= self.global_step

    def run(self, stop_after_steps: int | None = None) -> str:
        """Train until the planned total (or a budgeted run's last step), `stop_after_steps` more
        steps, or a signal; returns why it ended. A final checkpoint is written in every case; a
        budgeted run that reaches its end evaluates once more."""
        cfg = self.cfg
        if self.faults:
            self.report("faults", faults=[str(f) for f in self.faults])
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        taken, reason = 0, "done"
        try:  # the handlers stay until the final checkpoint is written: a Ctrl-C then cannot cut it short
            if self.budget is not None and not self._finished() and not self._plan_budget():
                reason = "time budget spent before training"
            while reason == "done" and not self._finished():
                if self._stopping():
                    reason = f"interrupted ({self._stopping()})"
                    break
                if stop_after_steps is not None and taken >= stop_after_steps:
                    reason = "stop-after-steps"
                    break
                prev_seqs = self.cursor.seqs
                self.step(self._next_decision())
                taken += 1
                if self.consecutive_skips >= cfg.train.max_consecutive_skips:
                    raise TooManySkips(self.consecutive_skips)
                if interval_crossed(prev_seqs, self.cursor.seqs, cfg.eval.eval_every_seqs):
                    self.run_eval()
                if interval_crossed(prev_seqs, self.cursor.seqs, cfg.checkpoint.checkpoint_every_seqs):
                    self.save("interval")
            if self.last_checkpoint_step != self.global_step:
                self.save(reason)
            if self.budget is not None and reason == "done" and self.last_eval_step != self.global_step:
                self.run_eval()  # the final eval of a budgeted run (unless the last step's interval eval was it)
            self.event("end", reason=reason, **self._end_fields())
        except TooManySkips as exc:  # the weights are unchanged since the last applied step, but
            self._end(f"stopped: {exc.count} consecutive skipped steps")  # going on would only skip more
            raise CatchatError(f"stopped at step {self.global_step}: {exc.count} consecutive steps were skipped "
                               "(non-finite gradients or no valid targets; events.jsonl says which)",
                               hint="lower train.lr or check the corpus; " + self._resume_hint()) from None
        except KeyboardInterrupt:  # a second Ctrl-C: stop now, but say so in the run's own record
            self._end(f"interrupted twice ({self._stop_signal}): no final checkpoint")
            raise CatchatError(f"interrupted twice: stopped at step {self.global_step} without a final checkpoint",
                               hint=self._resume_hint(), exit_code=130) from None
        except DeviceLost as exc:  # nothing on the device can be read back: no final checkpoint
            self._failed(f"device lost: {exc.message}")
            raise DeviceLost(exc.message, hint=self._resume_hint()) from None
        except (CheckpointWriteError, distributed.RankLost) as exc:  # RankLost: another rank died or hangs
            self._failed(exc.message)
            raise
        except OSError as exc:  # metrics.csv / events.jsonl: disk full, quota, permissions
            raise CatchatError(f"could not write {exc.filename or 'a run file'}: {exc.strerror or exc}",
                               hint="free disk space; " + self._resume_hint()) from None
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        return reason

    def _failed(self, why: str) -> None:
        self._end(f"failed: {why}")

    def _end_fields(self) -> dict:
        """The end event's account of the run, however it ended: steps, memory, budget, ranks."""
        return dict(skipped_steps=self.global_step - self.applied_steps, applied_steps=self.applied_steps,
                    **memory_mb(), **self._budget_fields(), **self._exchange_summary())

    def _end(self, reason: str) -> None:
        """Log the end of a run that stops early, if the disk still takes it."""
        try:
            self.event("end", reason=reason, **self._end_fields())
        except OSError:
            pass


class TooManySkips(Exception):
    def __init__(self, count: int):
        super().__init__(count)
        self.count = count
