"""A run's telemetry (the last part of the loop): events.jsonl (a line per event: start, eval,
checkpoint, skipped steps, end, ...), metrics.csv (a row per step), and the reporter that shows them
(the CLI's progress display), and TensorBoard's event files of them (catchat/run/tensorboard.py).
Rank 0 writes them; the other ranks of a data-parallel run are given `Quiet` telemetry.
"""

from __future__ import annotations

import json
import os
import sys
import time

from catchat.fsutil import append_line
from catchat.run.budget import Clock
from catchat.run.rundir import RunFiles, metrics_header
from catchat.run.runlog import METRICS_COLUMNS
from catchat.run.tensorboard import RunBoard
from catchat.training.state import RunState
from catchat.vk.program import StepStats


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


def event_record(state: RunState, kind: str, **fields) -> dict:
    """An events.jsonl record, stamped with the step the run stands at and the wall-clock time."""
    return {"event": kind, "global_step": state.global_step, "time": round(time.time(), 3), **fields}


def metrics_values(state: RunState, tokens_per_step: int, columns: list[str], *, lr: float, tf: float, loss: float,
                   n_valid: int, skipped: bool, grad_norm: float, clipped: bool, valid: int, seconds: float,
                   clamp_hits: int, elapsed_s: float, progress: float, loss_scale: float) -> list:
    """A metrics.csv row of the step just taken, in `columns` (the file's header: a run from before a
    later column was added lacks it); the loss cell is empty for a skipped step without valid targets."""
    s = state
    row = [s.global_step, s.cursor.seqs, s.cursor.cycle, s.global_step * tokens_per_step, f"{lr:.6g}", f"{tf:.6g}",
           f"{loss:.6f}" if not skipped or n_valid else "", f"{grad_norm:.6g}", int(clipped), valid,
           f"{tokens_per_step / seconds:.1f}", f"{seconds * 1e3:.2f}", clamp_hits, int(skipped)]
    later = {"elapsed_s": f"{elapsed_s:.3f}", "progress": f"{progress:.9g}", "loss_scale": f"{loss_scale:.0f}"}
    return row + [later.get(c, "") for c in columns[len(METRICS_COLUMNS):]]


class Telemetry:
    """Appends the run's events and metric rows, each stamped with the step the run stands at."""

    def __init__(self, files: RunFiles, state: RunState, clock: Clock, report, tokens_per_step: int):
        self.files, self.state, self.clock, self.report = files, state, clock, report
        self.tokens_per_step = tokens_per_step
        self.columns: list[str] = list(METRICS_COLUMNS)  # metrics.csv's header, read by `open_metrics`
        self.board = RunBoard(files.root, lambda text: report("warning", text=text))  # never raises

    def open_metrics(self) -> None:
        """Rows follow the header metrics.csv has (a run from before a column was added lacks it)."""
        self.columns = metrics_header(self.files.metrics).decode().split(",")

    def record(self, kind: str, **fields) -> dict:
        return event_record(self.state, kind, **fields)

    def event(self, kind: str, **fields) -> None:
        rec = self.record(kind, **fields)
        append_line(self.files.events, json.dumps(rec))
        self.report(kind, **rec)
        self.board.event(rec)

    def metrics_row(self, st: StepStats, lr: float, tf: float, valid: int, seconds: float, progress: float,
                    loss_scale: float) -> None:
        row = metrics_values(self.state, self.tokens_per_step, self.columns, lr=lr, tf=tf, loss=st.loss,
                             n_valid=st.n_valid, skipped=st.skipped, grad_norm=st.grad_norm,
                             clipped=st.clip_scale < 1.0 and not st.skipped, valid=valid, seconds=seconds,
                             clamp_hits=st.clamp_hits, elapsed_s=self.clock.now(), progress=progress,
                             loss_scale=loss_scale)
        append_line(self.files.metrics, ",".join(map(str, row)))
        self.board.row(dict(zip(self.columns, map(str, row))))


class Quiet(Telemetry):
    """A rank other than 0: it touches no file of the run and reports nothing."""

    def event(self, kind: str, **fields) -> None:
        pass

    def metrics_row(self, *args, **kwargs) -> None:
        pass
