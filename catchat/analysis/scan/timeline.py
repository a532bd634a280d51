"""Reading a run for the scan: metrics rows of the live branch, the processes (segments) from the
events, config.toml."""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from catchat.errors import UsageError
from catchat.run.runlog import MetricsLog, numbers


@dataclass
class Row:
    step: int
    seqs: int
    cycle: int
    tokens: int
    lr: float
    tf: float
    loss: float  # nan when empty (a skipped step without valid targets)
    grad_norm: float
    valid: int
    tps: float
    skipped: bool
    progress: float = float("nan")  # the schedule's input (metrics.csv of a newer catchat); nan when absent


def read_rows(log: MetricsLog) -> list[Row]:
    """The well-formed rows of metrics.csv (catchat.run.runlog checked every cell) as Rows."""
    out = []
    for cells in log.rows:
        v = numbers(cells, log.header)
        out.append(Row(step=v["global_step"], seqs=v["seqs"], cycle=v["cycle"], tokens=v["tokens"], lr=v["lr"],
                       tf=v["tf"], loss=v["loss"], grad_norm=v["grad_norm"], valid=v["valid_tokens"],
                       tps=v["tokens_per_s"], skipped=v["skipped"] == 1, progress=v.get("progress", float("nan"))))
    return out


def timeline(rows: list[Row], events: list[dict]) -> tuple[list[Row], list[int]]:
    """The rows of the live branch, and the branch steps that cut some off.

    A `branch` event at step S means the run went back to its checkpoint at S: what was logged after
    S belongs to the abandoned branch. The trainer moves those rows aside; should they still be in
    the file, the steps go back to S + 1 right after them, and the rows after S before that point
    are dropped here, so no check counts them (or calls the rewind a defect)."""
    branches = Counter(max(e["branch_step"], 0) for e in events if e["event"] == "branch")
    out: list[Row] = []
    cuts = []
    for r in rows:
        b = r.step - 1
        if out and r.step <= out[-1].step and branches[b] > 0:
            branches[b] -= 1
            while out and out[-1].step > b:
                out.pop()
            cuts.append(b)
        out.append(r)
    return out, cuts


@dataclass
class Segment:
    """One process's part of the run: from a start or resume event to the next one."""

    kind: str  # "start" | "resume"
    from_step: int  # rows with global_step > from_step were logged by this process
    schedule: dict | None
    seqs_per_step: int | None
    tokens_per_step: int | None
    events: list[dict]
    teacher_forcing: dict | None = None
    seqs_per_cycle: int | None = None
    resume_seqs: int | None = None
    resume_from: str = ""
    foreign: bool | None = None  # the trainer's word on a resume from another run's checkpoint


class Segments(list):
    """The run's processes in log order, with `of(step)`: the one that logged metrics row `step`
    (the last one that started before it), found by bisection (many resumes x many rows stays fast)."""

    def of(self, step: int) -> Segment | None:
        if getattr(self, "_keys", None) is None or len(self._order) != len(self):
            self._order = sorted(range(len(self)), key=lambda i: self[i].from_step)
            self._keys = [self[i].from_step for i in self._order]
            self._latest = list(itertools.accumulate(self._order, max))  # last in log order among the first k
        k = bisect.bisect_left(self._keys, step)  # segments that started before `step`
        return self[self._latest[k - 1]] if k else None


def segments(events: list[dict]) -> Segments:
    segs = Segments()
    for e in events:
        if e["event"] in ("start", "resume"):
            sched = e.get("schedule")
            if sched is None and e["event"] == "start" and "total_steps" in e:
                sched = {"total_steps": e["total_steps"]}
            segs.append(Segment(e["event"], int(e.get("global_step", 0)), sched, e.get("seqs_per_step"),
                                e.get("tokens_per_step"), [e], e.get("teacher_forcing"), e.get("seqs_per_cycle"),
                                resume_seqs=e.get("seqs"), resume_from=e.get("from", ""), foreign=e.get("foreign")))
        elif segs:
            segs[-1].events.append(e)
    return segs


def read_config(path: Path):
    if not path.is_file():
        return None
    from catchat import config as cfgmod

    try:
        return cfgmod.load(path)
    except UsageError:
        return None
