"""The one reader of a run's telemetry: metrics.csv and events.jsonl (scan, plot and the trainer use it).

Both files are appended to while a run goes on, so a reader may meet a last line cut short (a crash,
or a write in flight); and a file may be damaged or hostile. The readers never raise on content:
every line that cannot be used is reported in `bad` as (1-based line number, why) and skipped, so a
consumer can say what it skipped and go on with the rest. They raise OSError only when the file
cannot be read at all (missing, unreadable, not a regular file: a FIFO would block).

    log = read_metrics(run / "metrics.csv")   # MetricsLog: header, rows (raw cells), line_nos, bad
    numbers(log.rows[0])                      # {"global_step": 1, "lr": 0.001, "loss": nan, ...}
    ev = read_events(run / "events.jsonl")    # EventsLog: events (dicts, types checked), bad

Rules both readers share:
- A file is read in chunks and split on b"\\n" here (no csv field-size limit, no universal newlines);
  memory stays within one line (at most MAX_LINE_BYTES) plus one chunk whatever the file holds.
- A line longer than MAX_LINE_BYTES is bad ("longer than 128 KiB"); the rest of it is skipped
  unread into memory. A line that is not valid UTF-8 is bad ("not valid UTF-8").
- An empty (or, in events.jsonl, whitespace-only) line is ignored: it carries nothing.
- A last line without its newline was not completely written: it is never used, and not reported
  in `bad`; `truncated_tail` says it is there. (The trainer writes each line with one write ending
  in a newline, so this is a crash mid-write, or a reader racing the writer.)
- At most MAX_BAD bad lines are listed; `n_bad` counts them all (a file of garbage stays small).

metrics.csv: the header must begin with METRICS_COLUMNS (in that order; columns a later trainer
appends after them are kept as raw cells). Any other header is bad (line 1) and no row is read: the
columns could not be told apart. A row is well formed when csv parses the line into exactly as many
cells as the header has, and every METRICS_COLUMNS cell is a number of its column's kind: a decimal
integer in int64 range for INT_COLUMNS (global_step >= 0), a float (empty allowed: nan, e.g. the
loss of a skipped step without valid targets) for the others. LATER_COLUMNS are what this trainer
appends (the run clock and the schedule's progress); a file written before them lacks them and
stays readable, and where the header has them their cells are checked as floats too.

events.jsonl: each line is a JSON object with a str "event" and an int "global_step" (not a bool,
>= 0, int64). The fields that scan and plot read (EVENT_FIELDS) are checked when present, with their
types, nested ones included; an event with a wrong-typed known field is bad and skipped whole, so a
consumer may index every known field it finds without checking it again. Unknown events and
unknown fields pass untouched. Deeply nested or over-long numbers in a line are bad, not a crash.
"""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

METRICS_COLUMNS = ("global_step", "seqs", "cycle", "tokens", "lr", "tf", "loss", "grad_norm", "clipped",
                   "valid_tokens", "tokens_per_s", "step_ms", "gradh_clamp_hits", "skipped")
INT_COLUMNS = frozenset({"global_step", "seqs", "cycle", "tokens", "clipped", "valid_tokens", "gradh_clamp_hits",
                         "skipped"})  # what the trainer writes as integers; the rest are floats
# Appended after METRICS_COLUMNS by this trainer (floats): elapsed_s, the run clock when the step ended
# (a time-budgeted run's budget clock, which a resume continues; otherwise seconds since the process
# started); progress, the share of the plan done after the step (the schedule's input); loss_scale, the
# loss scale S the step ran with (train.precision = "fp16"; 1 at fp32). A metrics.csv begun by an older
# catchat lacks some or all of them, and a resumed run keeps writing its columns.
LATER_COLUMNS = ("elapsed_s", "progress", "loss_scale")
WRITTEN_COLUMNS = METRICS_COLUMNS + LATER_COLUMNS

MAX_LINE_BYTES = 128 * 1024  # far above any line the trainer writes (an eval event is < 1 KiB)
MAX_BAD = 1000  # bad lines listed; n_bad counts the rest
CHUNK = 64 * 1024
INT64 = 2**63
TOO_LONG = f"longer than {MAX_LINE_BYTES // 1024} KiB"
NOT_UTF8 = "not valid UTF-8"


@dataclass
class MetricsLog:
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)  # raw cells of the well-formed rows, in file order
    line_nos: list[int] = field(default_factory=list)  # 1-based line of each row
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line, why), the first MAX_BAD
    truncated_tail: bool = False  # the last line had no newline (not used)
    n_bad: int = 0  # all bad lines, listed or not


@dataclass
class EventsLog:
    events: list[dict] = field(default_factory=list)
    line_nos: list[int] = field(default_factory=list)  # 1-based line of each event
    bad: list[tuple[int, str]] = field(default_factory=list)
    truncated_tail: bool = False
    n_bad: int = 0


def _note_bad(log, lineno: int, why: str) -> None:
    log.n_bad += 1
    if len(log.bad) < MAX_BAD:
        log.bad.append((lineno, why))


# ---------------------------------------------------------------------------------------------
# Lines
# ---------------------------------------------------------------------------------------------

def _open_regular(path: Path) -> int:
    """A read descriptor of a regular file; O_NONBLOCK so a FIFO in its place cannot hang the open."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def _lines(path: Path) -> Iterator[tuple[int, str | None, str | None, bool]]:
    """(line number, text, why it is bad, ends in a newline) per line; text None when bad.

    Streams: a line is held only up to MAX_LINE_BYTES; past that its bytes are dropped as they come."""
    with os.fdopen(_open_regular(Path(path)), "rb") as f:
        buf, too_long, lineno = bytearray(), False, 1
        while chunk := f.read(CHUNK):
            start = 0
            while (nl := chunk.find(b"\n", start)) >= 0:
                if not too_long:
                    buf += chunk[start:nl]
                yield (lineno, *_decode(buf, too_long), True)
                buf.clear()
                too_long, lineno, start = False, lineno + 1, nl + 1
            if not too_long:
                buf += chunk[start:]
                if len(buf) > MAX_LINE_BYTES:
                    too_long = True
                    buf.clear()
        if buf or too_long:
            yield (lineno, *_decode(buf, too_long), False)


def _decode(buf: bytearray, too_long: bool) -> tuple[str | None, str | None]:
    if too_long or len(buf) > MAX_LINE_BYTES:
        return None, TOO_LONG
    try:
        return buf.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"{NOT_UTF8} (byte {exc.start})"


def describe_bad(log: MetricsLog | EventsLog, shown: int = 3) -> str:
    """'N unusable line(s) (line 5: not valid UTF-8 (byte 3); ...)': a log's bad lines for a message
    (each `why` is printable: the readers escape what they quote from the file)."""
    listed = "; ".join(f"line {n}: {why}" for n, why in log.bad[:shown])
    return f"{log.n_bad} unusable line(s) ({listed}{'; ...' if log.n_bad > shown else ''})"


# ---------------------------------------------------------------------------------------------
# metrics.csv
# ---------------------------------------------------------------------------------------------

_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")  # int64 has 19 digits: no huge-int parsing


def numbers(cells: list[str], header: list[str] | None = None) -> dict[str, int | float]:
    """The METRICS_COLUMNS cells of a row as numbers: int for INT_COLUMNS, float (nan when empty)
    for the others; with the file's `header`, also the LATER_COLUMNS it has. Raises ValueError naming
    the column when a cell is not one."""
    out: dict[str, int | float] = {}
    later = [(n, cells[i]) for i, n in enumerate(header or ()) if n in LATER_COLUMNS and i < len(cells)]
    for name, text in [*zip(METRICS_COLUMNS, cells), *later]:
        if name in INT_COLUMNS:
            if not _INT_TEXT.fullmatch(text) or not -INT64 <= int(text) < INT64:
                raise ValueError(f"{name} is not an integer: {text[:40]!r}")
            out[name] = int(text)
        else:
            try:
                out[name] = float(text) if text.strip() else math.nan
            except ValueError:
                raise ValueError(f"{name} is not a number: {text[:40]!r}") from None
    if out["global_step"] < 0:
        raise ValueError(f"global_step is negative: {out['global_step']}")
    return out


def _cells(text: str) -> list[str] | None:
    """The csv cells of one line (quoting honoured), None when csv cannot make one row of it."""
    try:
        rows = list(csv.reader([text], strict=True))
    except csv.Error:
        return None
    return rows[0] if len(rows) == 1 else None


def read_metrics(path: Path) -> MetricsLog:
    """metrics.csv, every line checked (module doc). Raises OSError only when the file cannot be read."""
    log = MetricsLog()
    for lineno, text, why, whole in _lines(path):
        if not whole:
            log.truncated_tail = True
        elif lineno == 1:
            _read_header(log, text, why)
        elif why is not None:
            _note_bad(log, lineno, why)
        elif text.strip() and log.header:
            _read_row(log, lineno, text)
    if not log.header and not log.bad:
        _note_bad(log, 1, "no header: the line is cut short" if log.truncated_tail else "no header (empty file)")
    return log


def _read_header(log: MetricsLog, text: str | None, why: str | None) -> None:
    cells = _cells(text) if text is not None else None
    if cells is not None and tuple(cells[:len(METRICS_COLUMNS)]) == METRICS_COLUMNS:
        log.header = cells
    else:
        _note_bad(log, 1, f"header is not {','.join(METRICS_COLUMNS)}: {why or repr((text or '')[:80])}; "
                          "no row read")


def _read_row(log: MetricsLog, lineno: int, text: str) -> None:
    cells = _cells(text)
    if cells is None:
        _note_bad(log, lineno, "not one csv row")
    elif len(cells) != len(log.header):
        _note_bad(log, lineno, f"{len(cells)} cells, the header has {len(log.header)}")
    else:
        try:
            numbers(cells, log.header)
        except ValueError as exc:
            _note_bad(log, lineno, str(exc))
            return
        log.rows.append(cells)
        log.line_nos.append(lineno)


def recent_losses(path: Path, n: int) -> list[float]:
    """The losses of the last `n` applied steps with a finite loss in metrics.csv, oldest first (rows
    that read_metrics would not use, skipped steps and a last line cut short are left out; [] when
    the file cannot be read). Read from the end: a resume of a long run does not read all of it."""
    try:
        with os.fdopen(_open_regular(Path(path)), "rb") as f:
            header = _cells(f.readline(MAX_LINE_BYTES).decode("utf-8", "replace").rstrip("\r\n"))
            if not header or tuple(header[:len(METRICS_COLUMNS)]) != METRICS_COLUMNS:
                return []
            body, end = f.tell(), f.seek(0, os.SEEK_END)
            span = CHUNK
            while True:
                lo = max(body, end - span)
                f.seek(lo)
                lines = f.read(end - lo).split(b"\n")[:-1]  # the last piece: empty, or a line cut short
                losses = [x for line in lines[1 if lo > body else 0:]  # a read from mid-file starts mid-line
                          if (x := _applied_loss(line, header)) is not None]
                if len(losses) >= n or lo == body:
                    return losses[-n:] if n > 0 else []
                span *= 4
    except OSError:
        return []


def _applied_loss(line: bytes, header: list[str]) -> float | None:
    """The loss of a whole, well-formed metrics row of an applied step with a finite loss, else None."""
    try:
        cells = _cells(line.decode("utf-8"))
        if cells is None or len(cells) != len(header):
            return None
        v = numbers(cells, header)
    except ValueError:  # UnicodeDecodeError too
        return None
    return float(v["loss"]) if v["skipped"] == 0 and math.isfinite(v["loss"]) else None


# ---------------------------------------------------------------------------------------------
# events.jsonl
# ---------------------------------------------------------------------------------------------

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -INT64 <= v < INT64


def _is_str(v) -> bool:
    """A str that can be printed: JSON escapes can make lone surrogates, which no console encodes."""
    if not isinstance(v, str):
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# A check takes a field's value and says why it does not fit (None when it does).
def _kind(test, what: str):
    return lambda v: None if test(v) else f"is {_short(v)}, not {what}"


INT = _kind(_is_int, "an integer")
NUM = _kind(lambda v: _is_int(v) or isinstance(v, float), "a number")
STR = _kind(_is_str, "a string")
BOOL = _kind(lambda v: isinstance(v, bool), "true or false")


def _or_none(check):
    return lambda v: None if v is None else check(v)


def _list_of(check, what: str):
    return _kind(lambda v: isinstance(v, list) and all(check(x) is None for x in v), what)


def _map_of(check):
    """A dict of string keys whose every value passes `check`."""
    def each(v):
        if not isinstance(v, dict):
            return f"is {_short(v)}, not an object"
        for k, x in v.items():
            if not _is_str(k):
                return f"has the key {_short(k)}, not a string"
            if (why := check(x)) is not None:
                return f".{k}{why}" if why.startswith(".") else f".{k} {why}"
        return None
    return each


def _object(fields: dict, required: bool, optional: dict | None = None):
    """A dict whose known fields have their types (every one of `fields` present when `required`;
    `optional` ones checked when present)."""
    def check(v):
        if not isinstance(v, dict):
            return f"is {_short(v)}, not an object"
        why = _bad_field(v, {**fields, **(optional or {})}, fields if required else ())
        return f".{why}" if why else None  # a path: schedule.lr is ...
    return check


_STEP_RANGE = _kind(lambda v: isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v)
                    and 0 <= v[0] <= v[1], "a [first, last] step range")
_SCHEDULE = {"total_steps": INT, "lr": NUM, "warmup_fraction": NUM, "cooldown_fraction": NUM,
             "cooldown_shape": STR, "lr_min": NUM}
_SCHEDULE_LATER = {"time_budget_s": NUM}  # a time-budgeted run's schedule (absent from older events)
_TEACHER_FORCING = {"start": NUM, "floor": NUM, "schedule": STR, "hold_cycles": NUM, "decay_cycles": NUM}
_SCORES = {"loss": NUM, "bpc": NUM, "top1": NUM, "top5": NUM}
_RUN_INFO = {"total_steps": INT, "schedule": _object(_SCHEDULE, True, _SCHEDULE_LATER),
             "teacher_forcing": _object(_TEACHER_FORCING, True), "seqs_per_step": INT,
             "tokens_per_step": INT, "seqs_per_cycle": INT, "faults": _list_of(STR, "a list of strings")}
_COMMON = {"time": NUM, "rss_mb": _or_none(NUM), "peak_rss_mb": _or_none(NUM)}

# event -> {field: check} for the fields consumers read; the REQUIRED ones must be present.
EVENT_FIELDS: dict[str, dict] = {
    "start": _RUN_INFO,
    "resume": {**_RUN_INFO, "from": STR, "seqs": INT, "foreign": BOOL},
    "eval": {**_SCORES, "tokens": NUM, "seqs": INT, "tf": NUM, "n_valid": INT,
             "free_running": _object(_SCORES, False)},
    "checkpoint": {"path": STR, "reason": STR},
    "skipped_step": {"reason": STR, "loss_scale": NUM},  # loss_scale: an fp16 overflow, the halved scale
    "end": {"reason": STR, "skipped_steps": INT, "applied_steps": INT},
    # a resume that changed the run's plan (catchat/training/plan.py): key -> {old, new, by}; the
    # schedule's total_steps / lr_next -> {old, new} where they moved
    "plan_change": {"changes": _map_of(_object({"by": STR}, True)), "schedule": _map_of(_object({}, False))},
    # a resume from an older checkpoint of the run: what came after branch_step moved to side_dir
    # ("from" None and branch_step -1: a fresh start over an earlier attempt)
    "branch": {"from": _or_none(STR), "branch_step": INT, "abandoned_step": INT, "side_dir": STR},
    # a resume that found rows of steps up to its checkpoint missing from metrics.csv (cut or edited
    # outside catchat): the missing [first, last] step ranges, and what the trainer said about them
    "metrics_gap": {"missing": _list_of(_STEP_RANGE, "a list of [first, last] step ranges"), "note": STR},
}
REQUIRED = {"eval": ("loss",), "resume": ("from",), "branch": ("branch_step", "abandoned_step"),
            "plan_change": ("changes",), "metrics_gap": ("missing", "note")}


def _bad_field(obj: dict, fields: dict, required) -> str | None:
    """Why `obj` does not fit `fields` (None when it does)."""
    for name in required:
        if name not in obj:
            return f"{name} is missing"
    for name, check in fields.items():
        if name in obj and (why := check(obj[name])) is not None:
            return f"{name}{why}" if why.startswith(".") else f"{name} {why}"
    return None


def _short(v) -> str:
    """A value for a message: JSON, ASCII only, at most 40 characters."""
    try:
        text = json.dumps(v, ensure_ascii=True)
    except (ValueError, RecursionError):
        text = type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _event_problem(e) -> str | None:
    """Why a parsed line is not a usable event (None when it is)."""
    if not isinstance(e, dict):
        return f"not a JSON object ({type(e).__name__})"
    if not _is_str(e.get("event")):
        return f"event is {_short(e.get('event'))}, not a string"
    step = e.get("global_step")
    if not _is_int(step) or step < 0:
        return f"global_step is {_short(step)}, not a step number"
    why = _bad_field(e, _COMMON, ())
    kind = e["event"]
    if why is None and kind in EVENT_FIELDS:
        why = _bad_field(e, EVENT_FIELDS[kind], REQUIRED.get(kind, ()))
    return f"{_short(kind)} event: {why}" if why else None


def read_events(path: Path) -> EventsLog:
    """events.jsonl, every line checked (module doc). Raises OSError only when the file cannot be read."""
    log = EventsLog()
    for lineno, text, why, whole in _lines(path):
        if not whole:
            log.truncated_tail = True
            continue
        if why is None and not text.strip():
            continue
        if why is None:
            try:
                e = json.loads(text)
            except RecursionError:  # "[[[[...": nesting deeper than the parser's stack
                why = "nested too deeply"
            except ValueError as exc:  # not JSON; also an integer of more than 4300 digits
                why = f"not JSON ({str(exc)[:60]})"
            else:
                why = _event_problem(e)
        if why is not None:
            _note_bad(log, lineno, why)
        else:
            log.events.append(e)
            log.line_nos.append(lineno)
    return log


def missing_ranges(steps, first: int, last: int) -> list[tuple[int, int]]:
    """The ranges (lo, hi) of the steps in [first, last] that `steps` does not hold."""
    gaps, want = [], first
    for s in sorted(set(steps)):
        if s > last:
            break
        if s > want:
            gaps.append((want, s - 1))
        want = max(want, s + 1)
    if want <= last:
        gaps.append((want, last))
    return gaps


def subtract_ranges(gap: tuple[int, int], known: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the step range `gap` (first, last) that no range of `known` covers."""
    parts = [gap]
    for klo, khi in known:
        parts = [p for lo, hi in parts for p in ((lo, min(hi, klo - 1)), (max(lo, khi + 1), hi)) if p[0] <= p[1]]
    return parts


def read_or_refuse(path: Path, reader):
    """reader(path) (read_metrics or read_events) with a file that cannot be read at all
    (permissions, not a regular file) as a one-line UsageError, for the commands."""
    from catchat.errors import UsageError

    try:
        return reader(path)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}",
                         hint="give a run directory whose files you can read") from None
