"""Opening a run on rank 0: which start is allowed, and the run's files for a start that passed
every check. Nothing in the run directory is written before every check has passed: a refused
start (bad checkpoint, other model size, Ctrl-C) changes no file.
"""

from __future__ import annotations

from pathlib import Path

from catchat import config as cfgmod
from catchat.errors import UsageError
from catchat.fsutil import atomic_write_text
from catchat.run import checkpoint as ck
from catchat.run import rundir
from catchat.run.faults import crash_point
from catchat.run.rundir import RunFiles
from catchat.training.build import Setup
from catchat.training.state import RunState
from catchat.training.telemetry import Telemetry, memory_mb
from catchat.vk.program.wavefront import recording_info


def in_run(files: RunFiles, path: Path) -> bool:
    """The checkpoint at `path` is one of this run's own."""
    return Path(path).resolve().parent == files.checkpoints.resolve()


def make_run_dir(root: Path) -> None:
    """Create the run directory (and its parents), or refuse a path that cannot be one (exit 2)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except (NotADirectoryError, FileExistsError):
        blocker = next((p for p in [root, *root.parents] if p.exists() and not p.is_dir()), root)
        raise UsageError(f"--run-dir {root}: {blocker} is a file, not a directory",
                         hint="choose a --run-dir whose path is made of directories") from None
    except PermissionError as exc:
        raise UsageError(f"cannot create --run-dir {root}: {exc.strerror} ({exc.filename})",
                         hint="choose a --run-dir where you may write") from None


def check_resumable(files: RunFiles) -> None:
    """A plain --resume needs a checkpoint; a run killed before its first one has none, and the way
    on is a fresh start (which keeps the earlier attempt's rows aside in branches/)."""
    if ck.list_checkpoints(files.checkpoints) or (files.checkpoints / ck.LATEST).exists():
        return  # a damaged `latest` is load_checkpoint's to report
    what = ("its first attempt stopped before its first checkpoint" if rundir.has_history(files)
            else "nothing was trained there yet")
    raise UsageError(f"no checkpoint at {files.root} to resume from: {what}",
                     hint=f"start it without --resume (catchat train CONFIG --run-dir {files.root})")


def check_source(files: RunFiles, ckpt: ck.Checkpoint) -> None:
    """A checkpoint of another run may start this one only while this one has no history."""
    if in_run(files, ckpt.path):
        return
    if ck.list_checkpoints(files.checkpoints) or rundir.has_history(files):
        raise UsageError(f"{ckpt.path} belongs to another run, and {files.root} already holds a run of "
                         "its own", hint="continue another run's checkpoint in a new --run-dir")


def plan_info(cfg: cfgmod.Config, pace, total_steps: int, tokens_per_step: int, seqs_per_cycle: int) -> dict:
    """The plan a run's start event records, what `catchat scan` checks its lr and tf columns against:
    the schedule in force, step sizes, precision, teacher forcing and the pace's budget (also the
    speedrun's PyTorch row's, catchat/analysis/torch_train.py)."""
    s = cfg.schedule
    info = dict(schedule=dict(total_steps=total_steps, lr=cfg.train.lr, warmup_fraction=s.warmup_fraction,
                              cooldown_fraction=s.cooldown_fraction, cooldown_shape=s.cooldown_shape,
                              lr_min=s.lr_min),
                seqs_per_step=cfgmod.seqs_per_step(cfg), tokens_per_step=tokens_per_step,
                seqs_per_cycle=seqs_per_cycle, precision=cfg.train.precision,
                teacher_forcing=cfgmod.to_dict(cfg)["teacher_forcing"])
    pace.describe(info)
    return info


def run_info(cfg: cfgmod.Config, setup: Setup, *, pace, faults: tuple, ranks) -> dict:
    """What `catchat scan` checks a run against: the plan (`plan_info`), the products, memory, faults."""
    info = plan_info(cfg, pace, setup.total_steps, setup.tokens_per_step, setup.lanes.seqs_per_cycle)
    prog = setup.prog
    info.update(gemm_products=setup.products, sweep_products=prog.sweep_products,
                recording=recording_info(prog.dev, prog.geometry, prog.fwd, prog.bwd), **memory_mb())
    if faults:
        info["faults"] = [str(f) for f in faults]
    info.update(ranks.info())
    return info


def commit_files(files: RunFiles, cfg: cfgmod.Config, ckpt: ck.Checkpoint | None, *, finished: list[Path],
                 info: dict, stale_pid, telemetry: Telemetry, state: RunState, start_fields: dict, report,
                 plan_change: dict | None = None) -> None:
    """Write the run's files for a start that passed every check: config, a branch if the start
    abandons anything, the telemetry, the start/resume event (`start_fields`: a fresh start's own) and
    a resume's metrics_gap event (rows up to its checkpoint missing from metrics.csv) and plan_change event
    (catchat/training/plan.py), right after its resume event."""
    files.samples.mkdir(exist_ok=True)
    atomic_write_text(files.config, cfgmod.resolved_toml(cfg, header=f"resolved config of run {files.root.name}"))
    crash_point("resume.config")
    if finished:
        info["finished_branches"] = [str(p.relative_to(files.root)) for p in finished]
    if stale_pid:
        info["stale_lock_pid"] = stale_pid
    own = ckpt is not None and in_run(files, ckpt.path)
    if own:
        branched = rundir.needs_branch(files, ckpt.global_step)
    else:  # a fresh start over an earlier attempt's telemetry; another run's checkpoint has none (checked)
        branched = ckpt is None and rundir.has_history(files)
    if branched:
        report("branch", **rundir.start_branch(files, ckpt.path if own else None, telemetry.record("branch")))
    if ckpt is None:
        if not branched:  # a branch left a metrics header and its own event: the new telemetry
            rundir.new_telemetry(files)
        telemetry.event("start", **start_fields, **info)
        return
    dropped = rundir.trim_tail(files, state.global_step) if own else 0
    if not own:
        rundir.new_telemetry(files)
    info["foreign"] = not own  # a run continued from another run's checkpoint (scan reports it)
    crash_point("resume.trimmed")
    gap = rundir.metrics_gap(files, state.global_step) if own else None  # another run's: new telemetry
    telemetry.event("resume", **{"from": str(ckpt.path)}, seqs=state.cursor.seqs, dropped_rows=dropped, **info)
    if gap:  # rows cut from outside cannot be made again: said once, recorded, and the run goes on
        telemetry.event("metrics_gap", **gap)
    if plan_change:
        telemetry.event("plan_change", **plan_change)
