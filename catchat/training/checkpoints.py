"""Checkpoints (the fourth part of the loop): everything needed to continue exactly (lesson 8),
written and read back side by side. `Checkpoints` writes them (rank 0); a rank other than 0 is
given `CarryToRoot`, which sends its lanes' carried state to rank 0 instead. `restore` loads one
into a built program: parameters, optimizer moments, spectral vectors, the carried state, the data
cursor, the counters and fp16's loss scale.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np

from catchat import config as cfgmod
from catchat.data.lanes import Lanes
from catchat.errors import CheckpointWriteError, UsageError
from catchat.model import ParamLayout, param_specs
from catchat.precision import LossScaler
from catchat.run import checkpoint as ck
from catchat.run.rundir import RunFiles
from catchat.training.ranks import OneProcess
from catchat.training.state import RunState
from catchat.training.telemetry import memory_mb
from catchat.vk.device import format_bytes
from catchat.vk.program import Program


def resume_hint(files: RunFiles) -> str:
    """Which checkpoint is intact and how to continue from it (for failure messages)."""
    try:
        last = ck.resolve(files.checkpoints)
    except UsageError:
        return "no checkpoint of this run was written yet: start it again"
    return (f"the last checkpoint {last} is intact and `latest` names it: continue with "
            f"`catchat train CONFIG --run-dir {files.root} --resume`")


class Checkpoints:
    """Writes checkpoints/step-NNNNNNN of the run (keeping checkpoint.keep_last) and logs them; its
    time goes to `pace` (a budgeted run's estimates), whose state (the run clock) it keeps too."""

    def __init__(self, files: RunFiles, prog: Program, layout: ParamLayout, cfg: cfgmod.Config, *, config_name: str,
                 tokens_per_step: int, ranks: OneProcess, pace, telemetry, config_file: dict | None = None):
        """config_file: the config file's values without overrides (catchat/training/plan.py), kept so that
        a resume tells an edited file from the overrides the run was started with."""
        self.files, self.prog, self.layout, self.cfg, self.config_name = files, prog, layout, cfg, config_name
        self.tokens_per_step, self.ranks, self.pace, self.telemetry = tokens_per_step, ranks, pace, telemetry
        self.config_file = config_file

    def save(self, state: RunState, reason: str) -> Path:
        """Write a checkpoint of the run at state.global_step; with ranks, every lane's carried state."""
        started = time.perf_counter()
        lay, spec = self.layout, self.layout.spec
        params = {n: a.copy() for n, a in lay.unflatten(self.prog.get_params()).items()}
        m, v, u = self.prog.get_optimizer_state()
        opt = {f"exp_avg.{n}": a.copy() for n, a in lay.unflatten(m).items()}
        opt.update({f"exp_avg_sq.{n}": a.copy() for n, a in lay.unflatten(v).items()})
        opt["spectral.u"] = u.reshape(spec.layers, 2, 3, spec.hidden)
        opt["carry.h0"] = self.ranks.gather_carry(self.prog.get_carry())
        config = cfgmod.to_dict(self.cfg)
        st = dict(applied_steps=state.applied_steps, seqs=state.cursor.seqs, cycle=state.cursor.cycle,
                  cursor=state.cursor.to_dict(), run_seed=self.cfg.train.seed, reason=reason,
                  schedule=self.pace.schedule_state(state.global_step),
                  tokens_seen=state.global_step * self.tokens_per_step,
                  config=config, config_name=self.config_name, model=config["model"])
        st.update(self.pace.checkpoint_state())
        if self.config_file is not None:
            st["config_file"] = self.config_file
        if state.scaler is not None:
            st["loss_scale"] = state.scaler.state()
        try:
            path = ck.save_checkpoint(self.files.checkpoints, state.global_step, params, opt, st,
                                      keep_last=self.cfg.checkpoint.keep_last)
        except OSError as exc:
            raise self._write_error(exc, state.global_step, params, opt) from None
        state.last_checkpoint_step = state.global_step
        self.pace.add_checkpoint(time.perf_counter() - started)
        self.telemetry.event("checkpoint", path=str(path), reason=reason, **memory_mb())
        return path

    def _write_error(self, exc: OSError, global_step: int, params: dict, opt: dict) -> CheckpointWriteError:
        """What a checkpoint that could not be written says: the file, the room it needs, the one intact."""
        need = sum(a.nbytes for a in (*params.values(), *opt.values())) + 2**16
        where = self.files.checkpoints
        free = shutil.disk_usage(where).free if where.exists() else 0
        return CheckpointWriteError(
            f"could not write checkpoint {ck.step_dir_name(global_step)} in {where}: "
            f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
            + f"; a checkpoint needs {format_bytes(need)} there, {format_bytes(free)} is free",
            hint=f"make room for {format_bytes(need)} in {where} (free disk space, a quota, ulimit -f; older "
                 "checkpoints are pruned only after a new one is written); " + resume_hint(self.files))


class CarryToRoot:
    """A rank other than 0's part of a checkpoint: its lanes' carried state, sent to rank 0 (which writes)."""

    def __init__(self, prog: Program, ranks: OneProcess):
        self.prog, self.ranks = prog, ranks

    def save(self, state: RunState, reason: str) -> None:
        self.ranks.gather_carry(self.prog.get_carry())
        state.last_checkpoint_step = state.global_step


def restore(ckpt: ck.Checkpoint, prog: Program, layout: ParamLayout, lanes: Lanes, cfg: cfgmod.Config,
            ranks: OneProcess, report) -> tuple[RunState, np.ndarray]:
    """Load `ckpt` into the program (this process's lanes of its carried state); returns the run's
    state and every lane's carried state [L, B, H]. Anything missing or not matching is refused."""
    spec = layout.spec
    expected = {p.name: p.shape for p in param_specs(spec)}
    ck.check_shapes(ckpt.params, expected, str(ckpt.path))
    saved_train = ckpt.state.get("config", {}).get("train", {})
    if saved_train.get("optimizer", cfg.train.optimizer) != cfg.train.optimizer:
        raise UsageError(f"{ckpt.path} was trained with {saved_train['optimizer']}, the config asks for "
                         f"{cfg.train.optimizer}", hint="keep train.optimizer when resuming")
    prog.set_params(layout.flatten(ckpt.params, np.float32))
    opt = ckpt.optimizer
    try:
        m = layout.flatten({n: opt[f"exp_avg.{n}"] for n in layout.names}, np.float32)
        v = layout.flatten({n: opt[f"exp_avg_sq.{n}"] for n in layout.names}, np.float32)
        carry = opt["carry.h0"]
        u = opt["spectral.u"]
    except KeyError as exc:
        raise UsageError(f"{ckpt.path / ck.OPTIMIZER_FILE} lacks {exc}",
                         hint="resume from another checkpoint") from None
    prog.set_optimizer_state(m, v, u)
    if carry.shape != (spec.layers, cfg.data.batch_lanes, spec.hidden):
        raise UsageError(f"{ckpt.path}: carried state {carry.shape} does not match data.batch_lanes / model",
                         hint="keep data.batch_lanes and the model when resuming")
    prog.set_carry(ranks.my_carry(carry))
    try:
        state = RunState(cursor=lanes.restore(ckpt.state["cursor"]), global_step=ckpt.global_step,
                         applied_steps=int(ckpt.state["applied_steps"]))
        state.scaler = _restore_precision(ckpt, cfg, report)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"{ckpt.path / ck.STATE_FILE} is damaged ({type(exc).__name__}: {exc})",
                         hint="resume from another checkpoint") from None
    state.last_checkpoint_step = state.global_step
    return state, carry


def _restore_precision(ckpt: ck.Checkpoint, cfg: cfgmod.Config, report) -> LossScaler | None:
    """fp16's loss scale from the checkpoint (an fp32 or older one has none: a fresh scale), and a
    line when the checkpoint was trained at another precision (allowed: the weights are float32)."""
    saved = ckpt.state.get("config", {}).get("train", {}).get("precision", "fp32")
    now = cfg.train.precision
    if saved != now:
        report("warning", text=f"{ckpt.path} was trained at precision {saved}; continuing at {now}")
    if now == "fp16":
        return LossScaler.from_state(ckpt.state.get("loss_scale"))
    return None
