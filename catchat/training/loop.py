"""The training loop: lanes in order -> the recorded step -> evals -> checkpoint -> telemetry.

`Trainer.run` is that sentence, each word a part it is given (catchat/training/): the `Feed` serves
each step's micro-batches from the lanes in order, the `DeviceStep` runs them through the recorded
GPU step, `Evals` scores the model and writes samples, `Checkpoints` saves everything a resume
needs, `Telemetry` logs events and metric rows. Two more parts say how this run differs from the
plain one: its pace (`StepSchedule`, or `TimeBudget` for train.time_budget_s) and its ranks
(`OneProcess`, or `Ranks` for a data-parallel run under mpiexec).

Units (lesson 4; catchat/training/state.py): `global_step` counts optimizer steps taken, `seqs`
lane-windows consumed, cycles passes over the train split. Intervals fire when the seqs count crosses
a multiple of `*_every_seqs`. Every way a run ends (done, --stop-after-steps, Ctrl-C/SIGTERM/SIGHUP)
writes a final checkpoint (lesson 8: all state, carry too).
"""

from __future__ import annotations

import shutil
import signal
import time
from contextlib import contextmanager
from pathlib import Path

from catchat import config as cfgmod
from catchat import distributed
from catchat.errors import CatchatError, CheckpointWriteError, DeviceLost, UsageError
from catchat.fsutil import DISK_FULL, deferred_signals, disk_full_error
from catchat.run import checkpoint as ck
from catchat.run import faults as faultmod
from catchat.run import rundir
from catchat.run.budget import Clock
from catchat.run.faults import crash_point
from catchat.run.rundir import RunFiles, RunLock
from catchat.run.schedule import TimedStep, interval_crossed
from catchat.training import start
from catchat.training.budget import StepSchedule, make_pace
from catchat.training.build import Setup, build, fresh
from catchat.training.checkpoints import CarryToRoot, Checkpoints, restore, resume_hint
from catchat.training.evals import Evals, last_eval_step
from catchat.training.feed import Feed
from catchat.training.plan import ConfigSource, Plan, fresh_plan, resume_plan
from catchat.training.ranks import OneProcess, Ranks, take_start_state
from catchat.training.signals import StopSignals
from catchat.training.state import RunState
from catchat.training.step import DeviceStep, settle, step_lr
from catchat.training.telemetry import Quiet, Telemetry, memory_mb
from catchat.vk.program import StepStats


def _state_field(name: str) -> property:
    """A Trainer attribute that is the run state's field `name` (read and written there)."""
    return property(lambda self: getattr(self.state, name), lambda self, value: setattr(self.state, name, value),
                    doc=f"RunState.{name} of the run")


class Trainer:
    """One run: builds data, device program and state (fresh or resumed), then steps.

    It holds the run directory's lock from construction to `close()` (the CLI closes it; a
    garbage-collected Trainer drops it too). Nothing in the run directory is written before every
    check has passed: a refused start (bad checkpoint, other model size, Ctrl-C) changes no file,
    and a new run directory it made is removed again."""

    global_step = _state_field("global_step")
    applied_steps = _state_field("applied_steps")
    cursor = _state_field("cursor")
    scaler = _state_field("scaler")  # the test hook: set the run's loss scale before its first step

    def __init__(self, cfg: cfgmod.Config | None, run_dir: Path, dev, *, config_name: str = "run",
                 resume: str | Path | None = None, reporter=None, faults=None, allow_unverified: bool = False,
                 clock_origin: float | None = None, comm: distributed.Comm | None = None,
                 source: ConfigSource | None = None):
        """cfg: the run's config; on resume the whole plan (every difference from the checkpoint's
        recorded config is a change). source: the command line's CONFIG and overrides instead (the CLI):
        a fresh start reads them, a resume applies the overrides to the recorded config
        (catchat/training/plan.py); cfg may then be None. faults: injected faults (catchat.run.faults);
        None reads $CATCHAT_FAULT. clock_origin: the time.monotonic() from which this process's time
        counts (the CLI: the process's start, so a time budget includes start-up); None: now. comm:
        this process is one rank of a data-parallel run (catchat.distributed); None: the only process."""
        clock = Clock(0.0, clock_origin)
        self.cfg, self.dev, self.config_name, self.source = cfg, dev, config_name, source
        self.file_values = None  # the config file's values a checkpoint records (plan.py)
        self.comm = comm
        self.files = RunFiles(Path(run_dir))
        self.report = reporter or (lambda *_a, **_k: None)
        self.faults = faultmod.from_env() if faults is None else tuple(faults)
        self.signals = StopSignals(self.report)
        self.ranks = OneProcess(self.signals) if comm is None else Ranks(comm, self.signals)
        self.is_root = self.ranks.is_root
        self.lock = None
        if not self.is_root:  # a rank other than 0 touches no file of the run: it takes rank 0's state
            sent = self.ranks.follow()
            self.cfg = sent["cfg"]
            setup = build(self.cfg, dev, self.ranks, self.report)
            self._assemble(setup, take_start_state(sent, setup.prog, setup.lanes, self.ranks),
                           StepSchedule(self.cfg, setup.total_steps, clock))
            return
        created = not self.files.root.exists()
        try:
            start.make_run_dir(self.files.root)
            self.lock = RunLock(self.files.lock)
            self._open(resume, allow_unverified, clock)
        except BaseException as exc:
            self.ranks.refused()  # the other ranks stop too (quietly: this rank says why)
            self.close()
            if created:  # a refused start leaves nothing behind
                shutil.rmtree(self.files.root, ignore_errors=True)
            if isinstance(exc, OSError) and exc.errno in DISK_FULL:  # nothing trained yet: bad input, exit 2
                raise disk_full_error(exc, self.files.root) from None
            raise

    def _open(self, resume, allow_unverified: bool, clock: Clock) -> None:
        """Rank 0 (or the only process): check and load the start, then write the run's files."""
        files = self.files
        if resume == "":  # before recover(): a refused start changes no file
            start.check_resumable(files)
        finished = rundir.recover(files)
        if resume is None and ck.list_checkpoints(files.checkpoints):
            raise UsageError(f"{files.root} already holds a run with checkpoints",
                             hint="continue it with --resume, or choose another --run-dir")
        ckpt = None
        if resume is not None:
            ckpt = ck.load_checkpoint(files.checkpoints if resume == "" else resume, with_optimizer=True,
                                      allow_unverified=allow_unverified, warn=lambda m: self.report("warning", text=m))
            start.check_source(files, ckpt)
            plan = resume_plan(self.source, self.cfg, ckpt, self.report)
        else:
            plan = fresh_plan(self.source, self.cfg)
        for note in plan.notes:
            self.report("warning", text=note)
        cfg = self.cfg = plan.cfg
        self.file_values = plan.file_values
        self.ranks.refuse_budget(cfg)
        setup = build(cfg, self.dev, self.ranks, self.report)
        if ckpt is not None:
            state, carry = restore(ckpt, setup.prog, setup.layout, setup.lanes, cfg, self.ranks, self.report)
            state.last_eval_step = last_eval_step(files.events, state.global_step)  # a finished run: not again
        else:
            state, carry = fresh(setup, cfg, self.ranks), None
        self._assemble(setup, state, make_pace(cfg, setup.total_steps, ckpt, clock, setup.layout))
        changed = self._plan_change(plan, ckpt, state)
        if changed:  # the checkpoint resumed from holds the old plan: the final save records the new one,
            state.last_checkpoint_step = -1  # even when no step is taken (a plan shortened to the step reached)
        with deferred_signals():  # the run's files change only here, and whole: a Ctrl-C waits for it
            start.commit_files(files, cfg, ckpt, finished=finished, stale_pid=self.lock.stale_pid,
                               info=start.run_info(cfg, setup, pace=self.pace, faults=self.faults, ranks=self.ranks),
                               telemetry=self.telemetry, state=state, report=self.report,
                               start_fields=dict(config=self.config_name, total_steps=setup.total_steps,
                                                 model=cfgmod.to_dict(cfg)["model"], lanes=setup.lanes.describe()),
                               plan_change=changed)
        self.telemetry.open_metrics()
        if ckpt is not None:  # the console's running loss goes on from the rows the run has (progress.py)
            self.report("history", metrics=files.metrics)
        self.ranks.send_start(cfg, setup.prog, state, carry)

    def _plan_change(self, plan: Plan, ckpt: ck.Checkpoint | None, state: RunState) -> dict | None:
        """The plan_change event's fields of a resume that changes the plan (None otherwise)."""
        if ckpt is None:
            return None
        return plan.event(ckpt.state.get("schedule"), self.pace.schedule_state(state.global_step))

    def _assemble(self, setup: Setup, state: RunState, pace: StepSchedule) -> None:
        """The parts the loop is given: rank 0 writes the run's files, the other ranks only take part."""
        cfg, ranks = self.cfg, self.ranks
        self.setup, self.state, self.pace = setup, state, pace
        self.prog, self.lanes, self.eval_lanes = setup.prog, setup.lanes, setup.eval_lanes
        self.layout, self.total_steps, self.tokens_per_step = setup.layout, setup.total_steps, setup.tokens_per_step
        self.budget = pace.budget  # catchat.run.budget.Budget of a time-budgeted run, else None
        self.feed = Feed(setup.lanes, cfg)
        self.device_step = DeviceStep(setup.prog, cfg, ranks, self.faults)
        tel = Telemetry if self.is_root else Quiet
        self.telemetry = tel(self.files, state, pace.clock, self.report, setup.tokens_per_step)
        self.evals = Evals(setup.prog, self.dev, setup.layout, setup.eval_lanes, cfg,
                           samples=self.files.samples if self.is_root else None, ranks=ranks, pace=pace,
                           telemetry=self.telemetry, tokens_per_step=setup.tokens_per_step)
        self.checkpoints = (Checkpoints(self.files, setup.prog, setup.layout, cfg, config_name=self.config_name,
                                        tokens_per_step=setup.tokens_per_step, ranks=ranks, pace=pace,
                                        telemetry=self.telemetry, config_file=self.file_values)
                            if self.is_root else CarryToRoot(setup.prog, ranks))

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

    # ------------------------------------------------------------------ the parts, as the loop uses them
    def event(self, kind: str, **fields) -> None:
        self.telemetry.event(kind, **fields)

    def tf_now(self) -> float:
        """Teacher forcing for the next step: a pure function of the cycles completed (lesson 2)."""
        return self.feed.tf_at(self.state.cursor)

    def run_eval(self) -> dict | None:
        """Eval metrics and samples (catchat/training/evals.py) of the model as it stands."""
        return self.evals.run(self.state, self.tf_now())

    def write_samples(self) -> Path | None:
        return self.evals.write_samples(self.state.global_step)

    def save(self, reason: str) -> Path | None:
        """A checkpoint of everything needed to continue exactly (lesson 8); a budgeted run's also
        holds its run clock, so a resume keeps the remaining budget. With ranks, every rank sends its
        lanes' carried state and rank 0 writes (the others return None)."""
        return self.checkpoints.save(self.state, reason)

    # ------------------------------------------------------------------ the loop
    def step(self, decision: TimedStep | None = None) -> StepStats:
        """One optimizer step over the next micro-batches; logs it. `decision`: a budgeted run's
        (catchat.run.budget.Budget.next_step), whose progress sets the lr; None: the step schedule."""
        state = self.state
        began = time.perf_counter()
        crash_point("train.step")
        batches, next_cursor = self.feed.take(state.cursor, state.global_step)
        lr, progress = step_lr(decision, state.global_step, self.total_steps, self.cfg)
        tf = self.tf_now()
        after = state.global_step + 1
        st, valid, seconds, scale = self.device_step.run(
            batches, state, lr=lr, tf=tf, while_running=lambda: self.feed.prepare_next(next_cursor, after))
        state.cursor = next_cursor
        state.global_step += 1
        settle(state, st, scale, self.telemetry.event)
        self.telemetry.metrics_row(st, lr, tf, valid, seconds, progress, scale)
        self.report("step", stats=st, lr=lr, tf=tf, seconds=seconds, global_step=state.global_step,
                    total_steps=self.pace.steps_expected(decision, state.global_step),
                    tokens_per_s=self.tokens_per_step / seconds)
        self.pace.took(decision, time.perf_counter() - began)
        return st

    def run(self, stop_after_steps: int | None = None) -> str:
        """Train until the planned total (or a budgeted run's last step), `stop_after_steps` more
        steps, or a signal; returns why it ended. A final checkpoint is written in every case; a run
        that reaches its end evaluates once more unless its last step's interval eval was that one."""
        cfg, state, pace = self.cfg, self.state, self.pace
        if self.faults:
            self.report("faults", faults=[str(f) for f in self.faults])
        taken, reason = 0, "done"
        # the handlers stay until the final checkpoint is written: a Ctrl-C then cannot cut it short
        with self.signals.installed(), hangup_stops(self.signals):
            try:
                if not pace.finished(state.global_step) and not pace.start(self.evals, self.telemetry):
                    reason = "time budget spent before training"
                while reason == "done" and not pace.finished(state.global_step):
                    if self.ranks.stopping():
                        reason = f"interrupted ({self.ranks.stopping()})"
                        break
                    if stop_after_steps is not None and taken >= stop_after_steps:
                        reason = "stop-after-steps"
                        break
                    prev_seqs = state.cursor.seqs
                    self.step(pace.next_step(state))
                    taken += 1
                    if state.consecutive_skips >= cfg.train.max_consecutive_skips:
                        raise TooManySkips(state.consecutive_skips)
                    if interval_crossed(prev_seqs, state.cursor.seqs, cfg.eval.eval_every_seqs):
                        self.run_eval()
                    if interval_crossed(prev_seqs, state.cursor.seqs, cfg.checkpoint.checkpoint_every_seqs):
                        self.save("interval")
                if state.last_checkpoint_step != state.global_step:
                    self.save(reason)
                if self.evals.final_due(reason, state):
                    self.run_eval()  # after the final checkpoint: a run planned in steps or time ends with an eval
                self.event("end", reason=reason, **self._end_fields())
            except TooManySkips as exc:  # the weights are unchanged since the last applied step, but
                self._end(f"stopped: {exc.count} consecutive skipped steps")  # going on would only skip more
                raise CatchatError(f"stopped at step {state.global_step}: {exc.count} consecutive steps were skipped "
                                   "(non-finite gradients or no valid targets; events.jsonl says which)",
                                   hint="lower train.lr or check the corpus; " + resume_hint(self.files)) from None
            except KeyboardInterrupt:  # a second Ctrl-C: stop now, but say so in the run's own record
                self._end(f"interrupted twice ({self.signals.caught}): no final checkpoint")
                raise CatchatError(f"interrupted twice: stopped at step {state.global_step} without a final "
                                   "checkpoint", hint=resume_hint(self.files), exit_code=130) from None
            except DeviceLost as exc:  # nothing on the device can be read back: no final checkpoint
                self._end(f"failed: device lost: {exc.message}")
                raise DeviceLost(exc.message, hint=resume_hint(self.files)) from None
            except (CheckpointWriteError, distributed.RankLost) as exc:  # RankLost: another rank died or hangs
                self._end(f"failed: {exc.message}")
                raise
            except OSError as exc:  # metrics.csv / events.jsonl: disk full, quota, permissions
                message = f"could not write {exc.filename or 'a run file'}: {exc.strerror or exc}"
                self._end(f"failed: {message}")  # where the other file still takes it
                raise CatchatError(message, hint="free disk space; " + resume_hint(self.files)) from None
        return reason

    def _end_fields(self) -> dict:
        """The end event's account of the run, however it ended: steps, memory, budget, ranks."""
        state = self.state
        return dict(skipped_steps=state.global_step - state.applied_steps, applied_steps=state.applied_steps,
                    **memory_mb(), **self.pace.end_fields(), **self.ranks.end_fields())

    def _end(self, reason: str) -> None:
        """Log the end of a run that stops early, if the disk still takes it."""
        try:
            self.event("end", reason=reason, **self._end_fields())
        except OSError:
            pass


@contextmanager
def hangup_stops(signals: StopSignals):
    """SIGHUP (the SSH session or terminal closed) stops the run as Ctrl-C does: after the step in
    flight, with a final checkpoint, rather than killing it with the steps since the last one.
    Not where SIGHUP is ignored (started under nohup): that run was asked to outlive its terminal."""
    try:
        before = signal.getsignal(signal.SIGHUP)
    except (AttributeError, ValueError):  # no SIGHUP on this system
        yield
        return
    if before is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGHUP, signals.handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


class TooManySkips(Exception):
    def __init__(self, count: int):
        super().__init__(count)
        self.count = count
