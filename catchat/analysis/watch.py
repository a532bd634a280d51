"""`catchat watch RUN_DIR`: a live view of a run from its own files, in a second terminal or over SSH.

It follows metrics.csv and events.jsonl as the trainer appends to them (reading only what is new;
a file replaced by a resume or a branch is read again from its start) and redraws: step / total,
the loss curve with the evals on it, tokens/s, lr, elapsed time and ETA, the latest teacher-forced
and free-running evals, the last notable events, and the anomalies `catchat scan` finds (run every
SCAN_EVERY_S at most, since it reads the whole run). It needs neither TensorBoard nor a device.

It ends with the run: exit 0 at the run's `end` event (1 when that end is a failure: `failed: ...`,
`stopped: ...`, or no final checkpoint), 1 when the training process (named in RUN/.lock, on this
host) is gone without an end event, 124 after --timeout, 2 for a directory that is not a run. In a
terminal the view is a rich Live display; through a pipe it prints plain lines (a status line about
every PLAIN_EVERY_S, each eval, each new anomaly, the end), and `--once` prints the view once.

    watch = RunWatch(Path("runs/tiny")); watch.poll()   # the state, read incrementally
    render(watch, width) / plain_status(watch)          # what is shown
"""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import stat
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from catchat.errors import UsageError
from catchat.run.runlog import MAX_LINE_BYTES, METRICS_COLUMNS, numbers

SCAN_EVERY_S = 30.0  # the scan reads the whole run: at most this often, and at most ~5% of the time
PLAIN_EVERY_S = 10.0  # through a pipe: a status line this often while the run advances
RATE_ROWS = 50  # the recent rows that time/step and tokens/s are averaged over
EVALS_SHOWN = 5
EXIT_TIMEOUT = 124  # as timeout(1)
FAILED_ENDS = ("failed", "stopped")


def check_run_dir(run_dir: Path) -> None:
    """Refuse what is not a run directory (exit 2, nothing read further)."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory", "give a run directory, e.g. runs/tiny")
    files = [run_dir / "metrics.csv", run_dir / "events.jsonl"]
    if not any(p.exists() for p in files):
        raise UsageError(f"{run_dir} has no metrics.csv or events.jsonl: not a catchat run directory",
                         "give the directory `catchat train` writes (runs/<config name> or --run-dir); a run that "
                         "is starting has them once its checks have passed")
    for p in files:
        if p.exists() and not stat.S_ISREG(p.stat().st_mode):
            raise UsageError(f"cannot read {p}: not a regular file", "give a run directory written by catchat train")


class Tail:
    """The whole lines appended to a file since the last read; a file replaced (another inode) or
    shortened is read again from its start (`restarted`)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.inode, self.pending, self.skipping = path, 0, None, b"", False

    def read(self) -> tuple[bool, list[bytes]]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:  # not written yet (a start still in its checks)
            return False, []
        restarted = self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset)
        if restarted:
            self.offset, self.pending, self.skipping = 0, b"", False
        self.inode = st.st_ino
        if st.st_size <= self.offset or not stat.S_ISREG(st.st_mode):
            return restarted, []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(st.st_size - self.offset)
        self.offset += len(data)
        *lines, rest = (self.pending + data).split(b"\n")
        if self.skipping and lines:  # the end of an over-long line: not ours to show
            lines, self.skipping = lines[1:], False
        self.pending = rest if len(rest) <= MAX_LINE_BYTES else b""
        self.skipping = self.skipping or len(rest) > MAX_LINE_BYTES
        return restarted, [line for line in lines if len(line) <= MAX_LINE_BYTES]


@dataclass
class Eval:
    step: int
    tokens: float
    loss: float
    bpc: float
    top1: float
    top5: float
    free: dict | None = None  # loss, bpc, top1, top5 of the free-running eval


def _num(v) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


@dataclass
class RunState:
    """What the view shows, rebuilt from the files' lines."""

    header: list[str] = field(default_factory=list)
    steps: array = field(default_factory=lambda: array("d"))
    losses: array = field(default_factory=lambda: array("d"))
    recent: deque = field(default_factory=lambda: deque(maxlen=RATE_ROWS))  # number dicts of the last rows
    process_from: int = 0  # the step the running process started from (rates are taken within it)
    total_steps: int = 0
    budget_s: float = 0.0
    evals: list[Eval] = field(default_factory=list)
    notes: deque = field(default_factory=lambda: deque(maxlen=4))  # the last notable events, as lines
    skipped: int = 0
    ended: dict | None = None  # the end event after the last start/resume
    bad_lines: int = 0

    @property
    def step(self) -> int:
        return int(self.steps[-1]) if self.steps else 0

    @property
    def last(self) -> dict:
        return self.recent[-1] if self.recent else {}


class RunWatch:
    """A run's files, followed: `poll()` reads what was appended and says whether anything changed."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.metrics, self.events = Tail(self.run_dir / "metrics.csv"), Tail(self.run_dir / "events.jsonl")
        self.state = RunState()
        self.anomalies: list = []  # scan Findings (warn / FAIL)
        self.scanned_at: float | None = None
        self.next_scan = 0.0

    def poll(self) -> bool:
        m_restart, m_lines = self.metrics.read()
        e_restart, e_lines = self.events.read()
        if m_restart or e_restart:  # a resume or a branch rewrote the files: read both again, whole
            self.metrics, self.events, self.state = Tail(self.metrics.path), Tail(self.events.path), RunState()
            return self.poll() or True
        for line in e_lines:
            self._event(line)
        for line in m_lines:
            self._row(line)
        return bool(m_lines or e_lines)

    # ------------------------------------------------------------------ metrics.csv
    def _row(self, raw: bytes) -> None:
        s = self.state
        try:
            text = raw.decode("utf-8")
            cells = next(csv.reader([text], strict=True)) if text.strip() else None
        except (UnicodeDecodeError, csv.Error, StopIteration):
            s.bad_lines += 1
            return
        if cells is None:
            return
        if not s.header:
            if tuple(cells[:len(METRICS_COLUMNS)]) == METRICS_COLUMNS:
                s.header = cells
            else:
                s.bad_lines += 1
            return
        try:
            if len(cells) != len(s.header):
                raise ValueError("cells")
            v = numbers(cells, s.header)
        except ValueError:
            s.bad_lines += 1
            return
        while s.steps and s.steps[-1] >= v["global_step"]:  # a rewind the files still hold: the later row wins
            s.steps.pop()
            s.losses.pop()
        s.steps.append(v["global_step"])
        s.losses.append(v["loss"])
        s.recent.append(v)

    # ------------------------------------------------------------------ events.jsonl
    def _event(self, raw: bytes) -> None:
        s = self.state
        try:
            e = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            s.bad_lines += 1
            return
        step = e.get("global_step") if isinstance(e, dict) else None
        if not isinstance(e, dict) or not isinstance(e.get("event"), str) or type(step) is not int:
            s.bad_lines += 1
            return
        kind = e["event"]
        if kind in ("start", "resume", "branch"):
            back_to = e.get("branch_step", step) if kind == "branch" else step
            back_to = back_to if type(back_to) is int else step
            s.evals = [ev for ev in s.evals if ev.step <= back_to]
        if kind in ("start", "resume"):
            s.ended, s.process_from = None, step
            total = e.get("total_steps", (e.get("schedule") or {}).get("total_steps") if isinstance(
                e.get("schedule"), dict) else None)
            s.total_steps = total if type(total) is int else s.total_steps
            budget = (e.get("schedule") or {}).get("time_budget_s") if isinstance(e.get("schedule"), dict) else None
            s.budget_s = _num(budget) if budget is not None else 0.0
            s.notes.append(f"{kind} at step {step}" + (f" from {e['from']}" if isinstance(e.get("from"), str) else ""))
        elif kind == "eval" and math.isfinite(_num(e.get("loss"))):
            free = e.get("free_running")
            s.evals.append(Eval(step, _num(e.get("tokens")), _num(e.get("loss")), _num(e.get("bpc")),
                                _num(e.get("top1")), _num(e.get("top5")),
                                {k: _num(free.get(k)) for k in ("loss", "bpc", "top1", "top5")}
                                if isinstance(free, dict) else None))
        elif kind == "checkpoint":
            s.notes.append(f"checkpoint at step {step} ({_text(e.get('reason'))})")
        elif kind == "skipped_step":
            s.skipped += 1
            s.notes.append(f"skipped step {step}: {_text(e.get('reason'))}")
        elif kind == "end":
            s.ended = e  # shown by end_line

    # ------------------------------------------------------------------ anomalies
    def scan_due(self, now: float) -> bool:
        return now >= self.next_scan

    def scan(self, now: float) -> None:
        """The anomalies `catchat scan` finds now (its 'run end' check only once the run has ended:
        a running run has no end event yet)."""
        from catchat.analysis.scan import OK, Finding, scan_run

        began = time.monotonic()
        try:
            report = scan_run(self.run_dir)
            found = [f for f in report.findings if f.status != OK
                     and (f.check != "run end" or self.state.ended is not None)]
        except UsageError:  # metrics.csv not there yet
            found = []
        except Exception as exc:  # noqa: BLE001 (the view goes on; the scan's failure is shown as one)
            found = [Finding("scan", "FAIL", f"catchat scan failed: {type(exc).__name__}: {exc}")]
        took = time.monotonic() - began
        self.anomalies, self.scanned_at = found, now
        self.next_scan = now + max(SCAN_EVERY_S, 20 * took)

    # ------------------------------------------------------------------ the process
    def process_gone(self) -> str | None:
        """Why the run cannot end any more, when it cannot: the process named in .lock is on this
        host and no longer exists (killed). None when it runs, or cannot be told (another host)."""
        try:
            holder = (self.run_dir / ".lock").read_text(errors="replace").split()
        except OSError:
            return None
        if len(holder) < 2 or not holder[0].isdigit() or holder[1] != socket.gethostname():
            return None
        try:
            os.kill(int(holder[0]), 0)
        except ProcessLookupError:
            return f"the training process (pid {holder[0]}) is gone without an end event (killed?)"
        except PermissionError:  # another user's process: it exists
            return None
        return None


def _text(v) -> str:
    """A string from the files, fit for one line."""
    text = str(v) if v is not None else "-"
    text = "".join(c if c.isprintable() else " " for c in text[:200])
    return text


# ---------------------------------------------------------------------------------------------
# What is shown
# ---------------------------------------------------------------------------------------------

def duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s" if m else f"{s}s"


def seconds_per_step(state: RunState) -> float:
    """Wall time per step over the recent rows of the running process (evals and checkpoints
    included, from the run clock `elapsed_s`); the mean step time when the file has no clock."""
    rows = [r for r in state.recent if r["global_step"] > state.process_from]
    clock = [(r["global_step"], r.get("elapsed_s", math.nan)) for r in rows]
    clock = [(s, t) for s, t in clock if math.isfinite(t)]
    if len(clock) >= 2 and clock[-1][0] > clock[0][0]:
        return (clock[-1][1] - clock[0][1]) / (clock[-1][0] - clock[0][0])
    ms = [r["step_ms"] for r in rows if math.isfinite(r["step_ms"])]
    return float(np.mean(ms)) / 1e3 if ms else math.nan


def eta_s(state: RunState) -> float:
    last = state.last
    if state.budget_s > 0:
        return state.budget_s - last.get("elapsed_s", math.nan)
    if state.total_steps > 0:
        return (state.total_steps - state.step) * seconds_per_step(state)
    return math.nan


def recent_loss(state: RunState, n: int = 10) -> float:
    tail = np.array(state.losses[-n:], np.float64)
    tail = tail[np.isfinite(tail)]
    return float(tail.mean()) if tail.size else math.nan


def plain_status(state: RunState) -> str:
    """One line: step / total, loss, lr, tokens/s, elapsed, ETA."""
    last = state.last
    if not last:
        return "no steps yet"
    total = f"/{state.total_steps}" if state.total_steps else ""
    pct = f" ({state.step / state.total_steps:.0%})" if state.total_steps else ""
    tps = [r["tokens_per_s"] for r in state.recent if math.isfinite(r["tokens_per_s"])]
    return (f"step {state.step}{total}{pct}  loss {recent_loss(state):.4f}  lr {last['lr']:.3g}  "
            f"{np.mean(tps) if tps else math.nan:,.0f} tok/s  elapsed {duration(last.get('elapsed_s', math.nan))}  "
            f"eta {duration(eta_s(state))}")


def eval_line(ev: Eval) -> str:
    line = (f"eval step {ev.step}: loss {ev.loss:.4f} nats/char ({ev.bpc:.3f} bpc), "
            f"top-1 {ev.top1:.1%}, top-5 {ev.top5:.1%}")
    if ev.free:
        line += f"; free-running loss {ev.free['loss']:.4f}, top-1 {ev.free['top1']:.1%}"
    return line


def anomaly_line(f) -> str:
    return f"anomaly: {f.status} {f.check}: {_text(f.detail)}"


def end_line(state: RunState) -> str:
    e = state.ended
    return f"run ended at step {e['global_step']}: {_text(e.get('reason'))}"


def end_code(state: RunState) -> int:
    """0 for a plain end (done, a stop with its checkpoint), 1 for a failure or no final checkpoint."""
    reason = str(state.ended.get("reason", ""))
    return 1 if reason.startswith(FAILED_ENDS) or "no final checkpoint" in reason else 0


def render(watch: RunWatch, width: int):
    """The terminal view: a panel of the status, the loss chart, the evals, anomalies and events."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.text import Text

    from catchat.analysis.termchart import LABEL_WIDTH, braille_chart
    from catchat.console import new_table

    s, inner = watch.state, max(width - 4, 20)
    parts: list = [Text(plain_status(s))]
    if s.total_steps:
        parts.append(ProgressBar(total=s.total_steps, completed=min(s.step, s.total_steps), width=inner))
    if s.steps:
        parts.append(Text.assemble(("loss", "bold"), " (nats/char) by step: ", ("train", "cyan"), ", ",
                                   ("eval", "magenta"), " (teacher-forced)"))
        ev_x, ev_y = [e.step for e in s.evals], [e.loss for e in s.evals]
        parts += braille_chart([(np.asarray(s.steps), np.asarray(s.losses), "cyan"),
                                (np.asarray(ev_x, np.float64), np.asarray(ev_y, np.float64), "magenta")],
                               width_cells=inner - LABEL_WIDTH, height_cells=8)
    if s.evals:
        table = new_table("step", "tokens", "loss", "bpc", "top-1", "top-5", "free loss", "free top-1",
                          title="evals (teacher-forced, then free-running)")
        for ev in s.evals[-EVALS_SHOWN:]:
            free = ev.free or {}
            table.add_row(str(ev.step), f"{ev.tokens:,.0f}", f"{ev.loss:.4f}", f"{ev.bpc:.3f}", f"{ev.top1:.1%}",
                          f"{ev.top5:.1%}", f"{free['loss']:.4f}" if free else "-",
                          f"{free['top1']:.1%}" if free else "-")
        parts.append(table)
    else:
        parts.append(Text("evals: none yet", style="dim"))
    ago = f" (scan {duration(time.monotonic() - watch.scanned_at)} ago)" if watch.scanned_at is not None else ""
    if watch.anomalies:
        parts.append(Text(f"anomalies{ago}:", style="bold"))
        for f in watch.anomalies:
            parts.append(Text(anomaly_line(f), style="red" if f.status == "FAIL" else "yellow"))
    else:
        parts.append(Text(f"anomalies: none{ago}", style="green"))
    parts += [Text(n, style="dim") for n in s.notes]
    if s.ended is not None:
        parts.append(Text(end_line(s), style="bold"))
    return Panel(Group(*parts), title=f"catchat watch {watch.run_dir}", title_align="left", width=width)


def once_lines(watch: RunWatch) -> list[str]:
    """--once through a pipe: the view as plain lines."""
    s = watch.state
    lines = [plain_status(s)] + [eval_line(ev) for ev in s.evals[-EVALS_SHOWN:]]
    lines += [anomaly_line(f) for f in watch.anomalies] or ["anomalies: none"]
    if s.ended is not None:
        lines.append(end_line(s))
    return lines


def follow(run_dir: Path, console, *, interval_s: float = 2.0, timeout_s: float | None = None,
           once: bool = False) -> int:
    """Watch the run until it ends (the exit code, module doc); `once`: show it now and return 0."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    watch = RunWatch(run_dir)
    watch.poll()
    watch.scan(time.monotonic())
    say = lambda text, style=None: console.print(text, style=style, highlight=False, markup=False,  # noqa: E731
                                                 soft_wrap=True)
    if once:
        if console.is_terminal:
            console.print(render(watch, console.width))
        else:
            for line in once_lines(watch):
                say(line)
        return 0
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if console.is_terminal:
        from rich.live import Live

        with Live(render(watch, console.width), console=console, auto_refresh=False) as live:
            code = _loop(watch, interval_s, deadline, lambda: live.update(render(watch, console.width), refresh=True))
    else:
        plain = _Plain(watch, say)
        plain.emit()
        code = _loop(watch, interval_s, deadline, plain.emit)
        plain.emit(final=True)
    if code == EXIT_TIMEOUT:
        say(f"watch: the run is still going after --timeout {timeout_s:g} s (exit {EXIT_TIMEOUT})")
    elif watch.state.ended is not None:
        say(end_line(watch.state), "bold" if code == 0 else "red")
    else:
        say(watch.process_gone() or "the run stopped", "red")
    return code


def _loop(watch: RunWatch, interval_s: float, deadline: float | None, show) -> int:
    """Poll, rescan now and then, show what changed; the exit code once the run is over."""
    while True:
        code = _over(watch)
        if code is not None:
            watch.scan(time.monotonic())  # the last word on the whole run
            show()
            return code
        if deadline is not None and time.monotonic() >= deadline:
            return EXIT_TIMEOUT
        time.sleep(interval_s)
        changed = watch.poll()
        now = time.monotonic()
        if watch.scan_due(now):
            watch.scan(now)
            changed = True
        if changed:
            show()


def _over(watch: RunWatch) -> int | None:
    if watch.state.ended is not None:
        return end_code(watch.state)
    if watch.process_gone():
        watch.poll()  # its end event may have landed just before it exited
        return end_code(watch.state) if watch.state.ended is not None else 1
    return None


class _Plain:
    """Through a pipe: each eval and new anomaly once, a status line about every PLAIN_EVERY_S."""

    def __init__(self, watch: RunWatch, say):
        self.watch, self.say = watch, say
        self.evals_shown: set[int] = set()
        self.anomalies_shown: set[tuple] = set()
        self.status_at, self.status_step = -math.inf, -1

    def emit(self, final: bool = False) -> None:
        s, now = self.watch.state, time.monotonic()
        if s.step != self.status_step and (final or now - self.status_at >= PLAIN_EVERY_S):
            self.say(plain_status(s))
            self.status_at, self.status_step = now, s.step
        for ev in s.evals:
            if ev.step not in self.evals_shown:
                self.evals_shown.add(ev.step)
                self.say(eval_line(ev))
        for f in self.watch.anomalies:
            key = (f.check, f.status, f.detail)
            if key not in self.anomalies_shown:
                self.anomalies_shown.add(key)
                self.say(anomaly_line(f))
