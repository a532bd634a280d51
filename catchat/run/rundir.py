"""The run directory: its files, the lock that keeps one process on it, and branch-aware resume.

    runs/<name>/
        .lock            the pid, host and start time of the one process training the run, which
                         holds flock on the directory itself and on .lock (catchat/run/runlock.py)
        config.toml      the resolved config of the live run (replaced atomically)
        metrics.csv      one row per step of the live branch (appended; replaced atomically)
        events.jsonl     events of the live branch (appended; replaced atomically)
        samples/         samples at eval time
        checkpoints/     step-N directories of the live branch and `latest`
        branches/NN-after-step-S/   what a branch left behind: branch.json, metrics.csv and
                         events.jsonl rows after step S, checkpoints/ newer than S

Invariant: `latest`, checkpoints/ and the telemetry describe one live branch. Resuming from a
checkpoint older than the newest one starts a new branch: first a side directory holding the
abandoned rows, events and the list of abandoned checkpoints is committed (written aside, renamed
into place) with a PENDING mark; then `latest` names the resume point, the newer checkpoints move
into the side directory, the live telemetry is replaced without the abandoned rows plus a `branch`
event, and PENDING goes. A process killed anywhere in between leaves PENDING behind; the next one
that opens the run finishes the branch before anything else, so nothing is lost or doubled.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from catchat.fsutil import atomic_write_bytes, atomic_write_text, fsync_dir, remove_stale_temporaries
from catchat.run import checkpoint as ck
from catchat.run import runlog
from catchat.run.faults import crash_point
from catchat.run.runlock import RunLock, check_no_other_writer
from catchat.run.runlog import METRICS_COLUMNS, WRITTEN_COLUMNS

__all__ = ["RunFiles", "RunLock", "recover", "start_branch", "finish_branch", "trim_tail", "new_telemetry",
           "metrics_gap"]

PENDING, BRANCH_INFO = "PENDING", "branch.json"


class RunFiles:
    """Where a run keeps its files (docs/training.md "Files")."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.config = self.root / "config.toml"
        self.metrics = self.root / "metrics.csv"
        self.events = self.root / "events.jsonl"
        self.checkpoints = self.root / "checkpoints"
        self.samples = self.root / "samples"
        self.branches = self.root / "branches"
        self.lock = self.root / ".lock"


# ------------------------------------------------------------------------------ telemetry lines
HEADER = ",".join(WRITTEN_COLUMNS).encode()  # a new run's header; column names need no csv quoting


def metrics_header(path: Path) -> bytes:
    """The header line (no newline) that `path`'s rows go with: its own when it begins with
    METRICS_COLUMNS (a run begun by an older catchat keeps its columns: rows and header must agree),
    else HEADER."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 16).rstrip(b"\r\n")
    except FileNotFoundError:
        return HEADER
    if first.split(b",")[:len(METRICS_COLUMNS)] == [c.encode() for c in METRICS_COLUMNS]:
        return first
    return HEADER


def _lines(path: Path) -> list[bytes]:
    """The whole lines of a file, split at b"\n" as catchat.run.runlog numbers them (a last line cut
    short by a crash is not one)."""
    return [line + b"\n" for line in path.read_bytes().split(b"\n")[:-1]] if path.exists() else []


def _placed(path: Path) -> dict[int, int]:
    """Line number -> global_step of every line catchat.run.runlog reads as a whole metrics row or event
    (the one definition of a readable line); the metrics header is placed at step -1."""
    if not path.exists():
        return {}
    if path.suffix == ".csv":
        log = runlog.read_metrics(path)
        return ({1: -1} if log.header else {}) | {n: int(r[0]) for r, n in zip(log.rows, log.line_nos)}
    log = runlog.read_events(path)
    return {n: e["global_step"] for e, n in zip(log.events, log.line_nos)}


def _split(path: Path, step: int) -> tuple[list[bytes], list[bytes]]:
    """(lines to keep, lines logged after `step`) of metrics.csv or events.jsonl. A line no reader
    can place (damaged by hand or by a disk) stays where it is: `catchat scan` reports it, nothing
    deletes it. For a fresh start (`step` -1) every line goes. The metrics header is in neither
    list (writers put it back first)."""
    placed, keep, rest = _placed(path), [], []
    for n, line in enumerate(_lines(path), 1):
        s = placed.get(n)
        if s == -1 and n == 1:  # the metrics header (_placed puts it at step -1)
            continue
        (rest if step < 0 or (s is not None and s > step) else keep).append(line)
    return keep, rest


def _write_metrics(path: Path, rows: list[bytes], header: bytes = HEADER) -> None:
    atomic_write_bytes(path, header + b"\n" + b"".join(rows))


def _is_whole(path: Path) -> bool:
    """Whether a file ends at a line end (or is empty / missing)."""
    if not path.exists() or path.stat().st_size == 0:
        return True
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def new_telemetry(files: RunFiles) -> None:
    """An empty metrics.csv (its header) and events.jsonl for a fresh run."""
    _write_metrics(files.metrics, [])
    atomic_write_bytes(files.events, b"")


def trim_tail(files: RunFiles, step: int) -> int:
    """Replace metrics.csv and events.jsonl without what was logged after checkpoint `step` by a
    process that stopped before its next checkpoint (a crash tail: resuming logs it again), and
    without a line cut short. Never in place: a kill leaves the old file or the new one. Returns
    the number of metrics rows dropped."""
    keep, rest = _split(files.metrics, step)
    header = metrics_header(files.metrics)
    if rest or not _is_whole(files.metrics) or _lines(files.metrics)[:1] != [header + b"\n"]:
        _write_metrics(files.metrics, keep, header)
    ev_keep, ev_rest = _split(files.events, step)
    if ev_rest or not _is_whole(files.events):
        atomic_write_bytes(files.events, b"".join(ev_keep))
    return len(rest)


def metrics_gap(files: RunFiles, step: int) -> dict | None:
    """The fields of a `metrics_gap` event when metrics.csv lacks rows of steps up to checkpoint `step`
    that the run logged once (the file cut or edited outside catchat while the run was stopped), not
    counting gaps an earlier resume recorded; None when none is missing. Nothing is written here: the
    rows cannot be made again (the run's history is not replayed), so the resume goes on and the
    event lets `catchat scan` tell a known gap from an unexplained one."""
    events = runlog.read_events(files.events).events if files.events.exists() else []
    first = 1
    opening = next((e for e in events if e["event"] in ("start", "resume")), None)
    if opening is not None and opening["event"] == "resume" and opening.get("foreign"):
        first = opening["global_step"] + 1  # begun from another run's checkpoint: no rows up to it
    missing = runlog.missing_ranges(_placed(files.metrics).values(), first, step)
    known = [(r[0], r[1]) for e in events if e["event"] == "metrics_gap" and e["global_step"] <= step
             for r in e["missing"]]
    missing = [r for gap in missing for r in runlog.subtract_ranges(gap, known)]
    if not missing:
        return None
    n = sum(hi - lo + 1 for lo, hi in missing)
    shown = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in missing[:5])
    more = f" and {len(missing) - 5} more ranges" if len(missing) > 5 else ""
    done = (f"the {step} steps the checkpoint has done" if first == 1
            else f"the {step - first + 1} steps {first}-{step} this run took up to the checkpoint")
    note = (f"{files.metrics} lacks steps {shown}{more} ({n} of {done}: truncated or edited outside catchat); "
            "training goes on, the gap stays in the file")
    return {"missing": [[lo, hi] for lo, hi in missing], "note": note}


# ------------------------------------------------------------------------------ branches
def has_history(files: RunFiles) -> bool:
    """Whether the run directory holds rows or events (of an attempt that never checkpointed)."""
    return bool(_split(files.metrics, -1)[1] or _lines(files.events))


def needs_branch(files: RunFiles, step: int) -> bool:
    """Whether continuing at checkpoint `step` of this run abandons a newer checkpoint."""
    return any(ck.dir_step(p) > step for p in ck.list_checkpoints(files.checkpoints))


def start_branch(files: RunFiles, source: Path | None, event: dict) -> dict:
    """Move everything after checkpoint `source` (of this run; None: a fresh start, everything)
    aside into branches/NN-after-step-S and make `source` the live branch's latest. `event` is the
    start of the `branch` event appended to the live events.jsonl; the branch's fields (`from`,
    `branch_step` (-1 for a fresh start), `abandoned_step`, `side_dir`, `abandoned_checkpoints`,
    `abandoned_rows`) are added here. Returns the whole event."""
    check_no_other_writer(files.root)
    step = ck.dir_step(source) if source else -1
    abandoned = [p.name for p in ck.list_checkpoints(files.checkpoints) if ck.dir_step(p) > step]
    _, rows = _split(files.metrics, step)
    _, events = _split(files.events, step)
    row_steps = [s for n, s in _placed(files.metrics).items() if s > step]
    files.branches.mkdir(exist_ok=True)
    n = 1 + max((int(p.name.split("-")[0]) for p in files.branches.iterdir() if p.name.split("-")[0].isdigit()),
                default=0)
    side = files.branches / (f"{n:02d}-after-step-{step:07d}" if source else f"{n:02d}-before-fresh-start")
    info = {**event, "from": source.name if source else None, "branch_step": step,
            "abandoned_step": max([ck.dir_step(Path(a)) for a in abandoned] + row_steps, default=step),
            "side_dir": str(side.relative_to(files.root)), "abandoned_checkpoints": abandoned,
            "abandoned_rows": len(row_steps)}
    tmp = files.branches / f".tmp-{side.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / "checkpoints").mkdir()
    _write_metrics(tmp / "metrics.csv", rows, metrics_header(files.metrics))
    atomic_write_bytes(tmp / "events.jsonl", b"".join(events))
    atomic_write_text(tmp / BRANCH_INFO, json.dumps(info, indent=1) + "\n")
    atomic_write_text(tmp / PENDING, "this branch is being made; the next catchat on this run finishes it\n")
    crash_point("branch.side_written")
    os.replace(tmp, side)  # the commit point: from here on the branch happens, whoever finishes it
    fsync_dir(files.branches)
    crash_point("branch.committed")
    finish_branch(files, side)
    return info


def finish_branch(files: RunFiles, side: Path) -> None:
    """Complete a committed branch (idempotent: every step checks what is already done)."""
    check_no_other_writer(files.root)
    info = json.loads((side / BRANCH_INFO).read_text())
    step = int(info["branch_step"])
    if info.get("from"):
        ck.point_latest(files.checkpoints, info["from"])
    crash_point("branch.latest")
    for name in info["abandoned_checkpoints"]:
        if (files.checkpoints / name).exists() and not (side / "checkpoints" / name).exists():
            os.replace(files.checkpoints / name, side / "checkpoints" / name)
            crash_point("branch.moved")
    if info["abandoned_checkpoints"]:
        fsync_dir(files.checkpoints)
        fsync_dir(side / "checkpoints")
    if not info.get("from") and files.checkpoints.exists() and not ck.list_checkpoints(files.checkpoints):
        (files.checkpoints / ck.LATEST).unlink(missing_ok=True)
    rows = _split(files.metrics, step)[0]  # none left (a fresh start): the new run gets this catchat's columns
    _write_metrics(files.metrics, rows, metrics_header(files.metrics) if rows else HEADER)
    crash_point("branch.metrics")
    keep, _ = _split(files.events, step)
    mark = json.dumps(info).encode() + b"\n"
    if mark not in keep:
        keep.append(mark)
    atomic_write_bytes(files.events, b"".join(keep))
    crash_point("branch.events")
    (side / PENDING).unlink()
    fsync_dir(side)


def recover(files: RunFiles) -> list[Path]:
    """What a killed process left, put right before anything else touches the run: half-written
    checkpoint and side directories and temporary files removed, committed branches finished.
    Returns the branches finished."""
    check_no_other_writer(files.root)  # what looks half-written may be a live writer's work in progress
    if files.checkpoints.exists():
        ck.remove_stale(files.checkpoints)
    remove_stale_temporaries(files.root)
    finished = []
    if files.branches.exists():
        for p in sorted(files.branches.glob(".tmp-*")):
            shutil.rmtree(p, ignore_errors=True)
        for side in sorted(files.branches.iterdir()):
            if (side / PENDING).exists():
                finish_branch(files, side)
                finished.append(side)
    _roll_latest_forward(files)
    return finished


def _roll_latest_forward(files: RunFiles) -> None:
    """A save killed between renaming its directory into place and replacing `latest` leaves a
    complete checkpoint newer than `latest`: checkpoints/ holds only the live branch, so it is the
    live branch's newest and `latest` is made to name it."""
    done = ck.list_checkpoints(files.checkpoints)
    named = ck.latest_name(files.checkpoints)
    if done and named != done[-1].name:  # `latest` missing, damaged, or behind the newest
        ck.point_latest(files.checkpoints, done[-1].name)
