"""`catchat scan RUN_DIR`: the anomaly scan of a run's telemetry (metrics.csv, events.jsonl, config.toml).

Each check gives a status: `ok`, `warn` (worth a look: the run may still be sound) or `FAIL` (a
defect: the run's record or its training is wrong). `catchat scan` prints the table and exits 1
when any check fails (`--strict`: also on a warning). docs/reliability.md lists the rules.

    report = scan_run(Path("runs/tiny"))
    report.defects          # the FAIL findings
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from catchat.errors import UsageError
from catchat.runlog import EventsLog, MetricsLog, describe_bad, numbers, read_events, read_metrics, read_or_refuse
from catchat.vocab import VOCAB_SIZE

OK, WARN, FAIL = "ok", "warn", "FAIL"

# Thresholds (docs/reliability.md)
SPIKE_FACTOR = 5.0  # grad norm > this x the running mean of the previous SPIKE_WINDOW finite norms
SPIKE_WINDOW, SPIKE_MIN_HISTORY = 50, 10
LOSS_RISE = 1.10  # a block of steps whose mean loss exceeds the previous block's by 10%: warn
LOSS_DIVERGED = 1.5  # the last block's mean loss above 1.5x the best block's: FAIL
# A loss this far above a uniform prediction's (ln V nats) is no model at all: divergence, already in
# the first rows (the block comparison above needs a good block first). >= 3 such applied steps: FAIL.
LOSS_UNIFORM = math.log(VOCAB_SIZE)
LOSS_ABSURD, ABSURD_STEPS = 2 * LOSS_UNIFORM, 3
DROP_FACTOR, DROP_RUN, DROP_WINDOW = 0.5, 5, 50  # >= 5 steps in a row below half the running median
MEMORY_GROWTH_MB, MEMORY_GROWTH_FRACTION = 64.0, 0.25  # RSS growth within one process: warn above both
RESUME_LOSS_JUMP, RESUME_LOSS_STEPS = 1.5, 3  # mean loss of 3 steps after a resume vs 3 before
LR_RTOL = 2e-5  # metrics.csv writes lr with 6 significant digits
MAX_LISTED = 5  # steps listed per finding
MAX_STEPS = 1000  # steps kept in a finding (a gap may be any size)


@dataclass
class Finding:
    check: str
    status: str
    detail: str
    steps: list[int] = field(default_factory=list)
    total: int | None = None  # how many steps are concerned, when more than `steps` holds

    @property
    def count(self) -> int:
        return len(self.steps) if self.total is None else self.total


@dataclass
class ScanReport:
    run_dir: Path
    rows: int
    findings: list[Finding]

    @property
    def defects(self) -> list[Finding]:
        return [f for f in self.findings if f.status == FAIL]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.status == WARN]

    def status(self, check: str) -> str:
        return next(f.status for f in self.findings if f.check == check)

    def finding(self, check: str) -> Finding:
        return next(f for f in self.findings if f.check == check)


def _steps_text(steps: list[int]) -> str:
    shown = ", ".join(str(s) for s in steps[:MAX_LISTED])
    return f"step{'s' if len(steps) > 1 else ''} {shown}" + (f" (+{len(steps) - MAX_LISTED} more)"
                                                           if len(steps) > MAX_LISTED else "")


def _text(value, limit: int = 120) -> str:
    """A string from the telemetry, fit for one table cell: control characters escaped, cut at `limit`."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value)[:limit + 1])
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

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


def _rows(log: MetricsLog) -> list[Row]:
    """The well-formed rows of metrics.csv (catchat.runlog checked every cell) as Rows."""
    out = []
    for cells in log.rows:
        v = numbers(cells)
        out.append(Row(step=v["global_step"], seqs=v["seqs"], cycle=v["cycle"], tokens=v["tokens"], lr=v["lr"],
                       tf=v["tf"], loss=v["loss"], grad_norm=v["grad_norm"], valid=v["valid_tokens"],
                       tps=v["tokens_per_s"], skipped=v["skipped"] == 1))
    return out


def _timeline(rows: list[Row], events: list[dict]) -> tuple[list[Row], list[int]]:
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


def _segments(events: list[dict]) -> Segments:
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


def _segment_of(segs: Segments, step: int) -> Segment | None:
    """The process that logged metrics row `step` (the last one that started before it)."""
    return segs.of(step)


# ---------------------------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------------------------

def scan_run(run_dir: Path) -> ScanReport:
    """Scan a run directory; raises UsageError when it is not a run (no metrics.csv)."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.csv"
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory", "give a run directory, e.g. runs/tiny")
    if not metrics.is_file():
        raise UsageError(f"{run_dir} has no metrics.csv: not a catchat run directory",
                         "give the directory `catchat train` wrote (runs/<config name> or --run-dir)")
    mlog = read_or_refuse(metrics, read_metrics)
    events_path = run_dir / "events.jsonl"
    elog = read_or_refuse(events_path, read_events) if events_path.exists() else EventsLog()
    events = elog.events
    rows, branch_cuts = _timeline(_rows(mlog), events)
    cfg = _read_config(run_dir / "config.toml")
    segs = _segments(events)
    out = [_check_metrics_file(mlog), _check_events_file(elog, segs)]
    out.append(_check_steps(rows, segs, events, branch_cuts))
    out.append(_check_counters(rows, segs, cfg))
    out.append(_check_nonfinite(rows))
    out.append(_check_skipped(rows, events))
    out.append(_check_lr(rows, segs, cfg))
    out.append(_check_tf(rows, segs, cfg))
    out.append(_check_running_loss(rows))
    out.append(_check_grad_spikes(rows))
    out.append(_check_throughput(rows, segs))
    out.append(_check_memory(segs))
    out.append(_check_resumes(rows, segs, events, run_dir))
    out.append(_check_end(segs))
    return ScanReport(run_dir, len(rows), out)


CUT_SHORT = "the last line is cut short (a crash while writing it, or a write in flight): not used"


def _check_metrics_file(log: MetricsLog) -> Finding:
    """Every line of metrics.csv a whole, well-formed row (catchat.runlog says why not)."""
    name = "metrics.csv"
    if log.n_bad:
        return Finding(name, FAIL, describe_bad(log) + ", skipped" + (f"; {CUT_SHORT}" if log.truncated_tail else ""))
    if log.truncated_tail:
        return Finding(name, WARN, f"{len(log.rows)} rows; {CUT_SHORT}")
    return Finding(name, OK, f"{len(log.rows)} rows")


def _check_events_file(log: EventsLog, segs: list[Segment]) -> Finding:
    """Every line of events.jsonl a JSON event whose known fields have their types."""
    name = "events.jsonl"
    if log.n_bad:
        return Finding(name, FAIL, describe_bad(log) + ", skipped" + (f"; {CUT_SHORT}" if log.truncated_tail else ""))
    if log.truncated_tail:
        return Finding(name, WARN, f"{len(log.events)} events; {CUT_SHORT}")
    if not log.events:
        return Finding(name, WARN, "no events (missing or empty file)")
    injected = sorted({_text(f, 40) for s in segs for f in s.events[0].get("faults", [])})
    return Finding(name, OK, f"{len(log.events)} events, {len(segs)} process(es)"
                   + (f"; faults injected on purpose ($CATCHAT_FAULT): {', '.join(injected)}" if injected else ""))


def _read_config(path: Path):
    if not path.is_file():
        return None
    from catchat import config as cfgmod

    try:
        return cfgmod.load(path)
    except UsageError:
        return None


def _first_step(segs: list[Segment], rows: list[Row]) -> int:
    """The step the run's first row should have: 1, or N + 1 when its first process resumed another
    run's checkpoint at step N (the trainer then starts new telemetry there, so no row is <= N)."""
    if segs and segs[0].kind == "resume" and rows[0].step > segs[0].from_step:
        return segs[0].from_step + 1
    return 1


def _gaps(steps: list[int], first: int) -> list[tuple[int, int]]:
    """The ranges (lo, hi) of steps from `first` to the last one that no row has."""
    gaps, want = [], first
    for s in sorted(set(steps)):
        if s > want:
            gaps.append((want, s - 1))
        want = max(want, s + 1)
    return gaps


def _missing(gaps: list[tuple[int, int]]) -> list[int]:
    """The first MAX_STEPS missing steps (a gap can be any size)."""
    out: list[int] = []
    for lo, hi in gaps:
        out.extend(range(lo, min(hi, lo + MAX_STEPS - len(out) - 1) + 1))
        if len(out) >= MAX_STEPS:
            break
    return out


def _check_steps(rows: list[Row], segs: list[Segment], events: list[dict], branch_cuts: list[int]) -> Finding:
    """global_step runs first, first + 1, ...: none missing (rows lost), none repeated or going back
    (not truncated on resume). A branch is no defect: the live rows continue from the branch step."""
    name = "step sequence"
    if not rows:
        return Finding(name, WARN, "no steps logged")
    first = _first_step(segs, rows)
    steps = [r.step for r in rows]
    gaps = _gaps(steps, first)
    n_missing = sum(hi - lo + 1 for lo, hi in gaps)
    repeated = sorted(s for s, n in Counter(steps).items() if n > 1)
    back = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
    early = sorted({s for s in steps if s < first})
    problems = []
    if gaps:
        shown = ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in gaps[:MAX_LISTED])
        problems.append(f"{n_missing} step(s) missing: {shown}{', ...' if len(gaps) > MAX_LISTED else ''} "
                        "(rows lost)")
    if repeated:
        problems.append(f"{_steps_text(repeated)} logged more than once")
    if back:
        i = back[0]
        problems.append(f"row {i + 1} has step {steps[i]} after step {steps[i - 1]} "
                        f"({len(back)} time(s) out of order: rows not truncated on resume?)")
    if early:
        problems.append(f"{_steps_text(early)} before the first step {first}")
    branched = _branch_notes(events, branch_cuts)
    if problems:
        listed = sorted({*repeated, *(steps[i] for i in back), *early, *_missing(gaps)})[:MAX_STEPS]
        return Finding(name, FAIL, "; ".join(problems + branched), listed,
                       total=n_missing + len(set(repeated) | {steps[i] for i in back} | set(early)))
    return Finding(name, OK, "; ".join([f"steps {first}..{steps[-1]}, none missing or repeated"] + branched))


def _branch_notes(events: list[dict], cuts: list[int]) -> list[str]:
    """What each `branch` event says (the run went back to an older checkpoint), for the detail."""
    notes = []
    for e in [e for e in events if e["event"] == "branch"][:MAX_LISTED]:
        b, a = max(e["branch_step"], 0), e["abandoned_step"]
        notes.append(f"branched at step {b}" + (f" from {_text(e['from'], 60)}" if e.get("from") else "")
                     + (f": steps {b + 1}..{a} abandoned" if a > b else "")
                     + (f", kept in {_text(e['side_dir'], 60)}" if e.get("side_dir") else ""))
    if cuts:
        notes.append(f"rows of abandoned branches dropped after step(s) {', '.join(map(str, cuts[:MAX_LISTED]))}")
    return notes


def _check_counters(rows: list[Row], segs: list[Segment], cfg) -> Finding:
    """seqs and tokens advance by exactly one step's worth per row; cycle never goes back."""
    name = "seqs / tokens / cycle"
    if not rows:
        return Finding(name, OK, "no steps")
    sps = next((s.seqs_per_step for s in segs if s.seqs_per_step), None)
    tps = next((s.tokens_per_step for s in segs if s.tokens_per_step), None)
    if sps is None and cfg is not None:
        sps = cfg.data.micro_batches * cfg.data.batch_lanes
        tps = sps * cfg.data.window
    if sps is None:
        sps = rows[0].seqs
        tps = rows[0].tokens
    bad = [r.step for i, r in enumerate(rows)
           if r.seqs != r.step * sps or (tps and r.tokens != r.step * tps)
           or (i and r.cycle < rows[i - 1].cycle)]
    if bad:
        return Finding(name, FAIL, f"seqs/tokens do not advance by {sps} seqs / {tps} tokens per step, or the cycle "
                       "goes back: the data cursor was not restored exactly", bad)
    return Finding(name, OK, f"{sps} seqs, {tps} tokens per step")


def _check_nonfinite(rows: list[Row]) -> Finding:
    name = "non-finite steps"
    applied = [r.step for r in rows if not r.skipped and not (math.isfinite(r.loss) and math.isfinite(r.grad_norm))]
    skipped = [r.step for r in rows if r.skipped and r.valid > 0 and not math.isfinite(r.grad_norm)]
    if applied:
        return Finding(name, FAIL, f"{len(applied)} applied step(s) with a non-finite loss or gradient norm "
                       f"({_steps_text(applied)}): the skip guard did not hold", applied)
    if skipped:
        return Finding(name, WARN, f"{len(skipped)} step(s) with a non-finite gradient, skipped by the guard "
                       f"({_steps_text(skipped)})", skipped)
    return Finding(name, OK, "every loss and gradient norm finite")


def _check_skipped(rows: list[Row], events: list[dict]) -> Finding:
    """Every skipped step is logged as a skipped_step event; a step without valid targets is never applied."""
    name = "skipped steps"
    logged = {int(e.get("global_step", -1)) for e in events if e["event"] == "skipped_step"}
    skipped = [r.step for r in rows if r.skipped]
    unlogged = [s for s in skipped if s not in logged]
    applied_empty = [r.step for r in rows if r.valid == 0 and not r.skipped]
    if applied_empty:
        return Finding(name, FAIL, f"step(s) with no valid targets applied ({_steps_text(applied_empty)}): "
                       "lesson 10", applied_empty)
    if unlogged and events:
        return Finding(name, FAIL, f"skipped step(s) without a skipped_step event ({_steps_text(unlogged)})", unlogged)
    if skipped:
        empty = sum(1 for r in rows if r.skipped and r.valid == 0)
        return Finding(name, OK, f"{len(skipped)} skipped ({empty} without valid targets), each logged", skipped)
    return Finding(name, OK, "none")


def _schedule_for(seg: Segment | None, cfg):
    """(WSD, total_steps) in force for a segment: its event's schedule, else config.toml."""
    from catchat.schedule import WSD

    sched = (seg.schedule if seg else None) or {}
    total = sched.get("total_steps")
    if "lr" in sched:
        return WSD(lr=sched["lr"], warmup_fraction=sched["warmup_fraction"],
                   cooldown_fraction=sched["cooldown_fraction"], cooldown_shape=sched["cooldown_shape"],
                   lr_min=sched["lr_min"]), total
    if cfg is None:
        return None, total
    if total is None and cfg.train.total_steps > 0:
        total = cfg.train.total_steps
    return WSD.from_config(cfg), total


def _check_lr(rows: list[Row], segs: list[Segment], cfg) -> Finding:
    """Each row's lr equals schedule.lr_at(global_step - 1) under the schedule of the process that logged it."""
    from catchat.schedule import lr_at

    name = "lr vs schedule"
    bad, checked = [], 0
    unusable: list[tuple[int, Exception]] = []
    for r in rows:
        wsd, total = _schedule_for(_segment_of(segs, r.step), cfg)
        if wsd is None or not total:
            continue
        try:
            want = lr_at(r.step - 1, total, wsd)
        except FORMULA_ERRORS as exc:  # a damaged schedule in events.jsonl (total_steps 0, lr nan, ...)
            unusable.append((r.step, exc))
            continue
        checked += 1
        if not math.isclose(r.lr, want, rel_tol=LR_RTOL, abs_tol=1e-12):
            bad.append((r.step, r.lr, want))
    note = _unusable_note(unusable, "schedule")
    if bad:
        return Finding(name, FAIL, f"{len(bad)} step(s) whose lr is not schedule.lr_at(global_step - 1) "
                       f"(step {bad[0][0]}: {bad[0][1]:g}, the formula gives {bad[0][2]:g}): a re-run warmup "
                       f"(lesson 2) or a schedule not restored" + note, [x[0] for x in bad])
    if unusable:
        return Finding(name, WARN, f"{checked} steps follow the WSD formula" + note, [u[0] for u in unusable])
    if not checked:
        return Finding(name, WARN, "not checked: no schedule in events.jsonl and no readable config.toml")
    return Finding(name, OK, f"{checked} steps follow the WSD formula")


FORMULA_ERRORS = (ValueError, ArithmeticError)  # what lr_at / tf_at raise on values no trainer logs


def _unusable_note(unusable: list[tuple[int, Exception]], what: str) -> str:
    if not unusable:
        return ""
    step, exc = unusable[0]
    return (f"; {len(unusable)} step(s) not checked: the {what} logged for them cannot be evaluated "
            f"(step {step}: {_text(exc, 80)})")


def _tf_for(seg: Segment | None, cfg):
    """(teacher-forcing settings, seqs_per_cycle) in force for a segment: its event's, else config.toml's."""
    from types import SimpleNamespace

    tf = (seg.teacher_forcing if seg else None)
    if tf is None and cfg is not None and hasattr(cfg, "teacher_forcing"):
        tf = dataclasses.asdict(cfg.teacher_forcing)
    return (SimpleNamespace(**tf) if tf else None), (seg.seqs_per_cycle if seg else None)


def _check_tf(rows: list[Row], segs: list[Segment], cfg) -> Finding:
    """Each row's tf equals schedule.tf_at(cycles done before the step) (1 where there is no schedule)."""
    from catchat.schedule import tf_at

    name = "tf vs schedule"
    sps = next((s.seqs_per_step for s in segs if s.seqs_per_step), None)
    bad, checked, unchecked = [], 0, 0
    unusable: list[tuple[int, Exception]] = []
    for r in rows:
        tf, spc = _tf_for(_segment_of(segs, r.step), cfg)
        try:
            if tf is None:
                want = 1.0  # a catchat without a teacher-forcing schedule: always the data's token
            elif getattr(tf, "schedule", "constant") == "constant" or tf.start <= tf.floor:
                want = float(tf.start)
            elif spc and sps:
                want = tf_at((r.seqs - sps) / spc, tf)
            else:
                unchecked += 1
                continue
        except FORMULA_ERRORS as exc:  # a damaged teacher_forcing in events.jsonl (decay_cycles 0, ...)
            unusable.append((r.step, exc))
            continue
        checked += 1
        if not math.isclose(r.tf, want, rel_tol=LR_RTOL, abs_tol=1e-9):
            bad.append((r.step, r.tf, want))
    note = _unusable_note(unusable, "teacher-forcing schedule")
    if bad:
        return Finding(name, FAIL, f"{len(bad)} step(s) whose tf is not schedule.tf_at(cycles done) (step {bad[0][0]}: "
                       f"{bad[0][1]:g}, the formula gives {bad[0][2]:g})" + note, [b[0] for b in bad])
    if unusable:
        return Finding(name, WARN, f"{checked} steps follow the teacher-forcing schedule" + note,
                       [u[0] for u in unusable])
    if unchecked and not checked:
        return Finding(name, WARN, "not checked: a decaying schedule but no seqs_per_cycle in events.jsonl")
    return Finding(name, OK, f"{checked} steps follow the teacher-forcing schedule")


def _blocks(rows: list[Row]) -> tuple[int, list[tuple[int, float]]]:
    """(block size, [(last step of block, mean loss of its applied finite steps)])."""
    good = [r for r in rows if not r.skipped and math.isfinite(r.loss)]
    w = max(10, len(good) // 30)
    out = []
    for i in range(0, len(good) - w + 1, w):
        chunk = good[i:i + w]
        out.append((chunk[-1].step, sum(r.loss for r in chunk) / len(chunk)))
    return w, out


def _check_running_loss(rows: list[Row]) -> Finding:
    """Divergence: losses far above a uniform prediction's (from the first row on), or the last block
    of steps well above the best one; a rise from one block to the next is a warning."""
    name = "running loss"
    absurd = [r for r in rows if not r.skipped and math.isfinite(r.loss) and r.loss > LOSS_ABSURD]
    if absurd:
        top = max(absurd, key=lambda r: r.loss)
        what = (f"loss above 2 x ln {VOCAB_SIZE} = {LOSS_ABSURD:.2f} nats (a uniform prediction scores "
                f"{LOSS_UNIFORM:.2f}) at {len(absurd)} applied step(s) ({_steps_text([r.step for r in absurd])}; "
                f"highest {top.loss:.6g} at step {top.step})")
        if len(absurd) >= ABSURD_STEPS:
            return Finding(name, FAIL, f"diverged: {what}: lower train.lr, or check the data",
                           [r.step for r in absurd][:MAX_STEPS], total=len(absurd))
        return Finding(name, WARN, what, [r.step for r in absurd])
    w, blocks = _blocks(rows)
    if len(blocks) < 2:
        return Finding(name, OK, f"too few steps for blocks of {w}")
    rises = [blocks[i][0] for i in range(1, len(blocks)) if blocks[i][1] > blocks[i - 1][1] * LOSS_RISE]
    best = min(b[1] for b in blocks)
    last = blocks[-1][1]
    if last > best * LOSS_DIVERGED and blocks[-1][1] != best:
        return Finding(name, FAIL, f"diverged: mean loss of the last {w} steps {last:.3f} vs best {best:.3f}",
                       [blocks[-1][0]])
    if rises:
        return Finding(name, WARN, f"mean loss over {w}-step blocks rose by > {LOSS_RISE - 1:.0%} "
                       f"at the block ending at {_steps_text(rises)}", rises)
    return Finding(name, OK, f"{blocks[0][1]:.3f} -> {last:.3f} over {len(blocks)} blocks of {w} steps, no rise "
                   f"> {LOSS_RISE - 1:.0%}")


def _check_grad_spikes(rows: list[Row]) -> Finding:
    name = "grad-norm spikes"
    hist: list[float] = []
    spikes = []
    for r in rows:
        g = r.grad_norm
        if not math.isfinite(g):
            continue
        if len(hist) >= SPIKE_MIN_HISTORY:
            mean = sum(hist[-SPIKE_WINDOW:]) / len(hist[-SPIKE_WINDOW:])
            if g > SPIKE_FACTOR * mean:
                spikes.append(r.step)
        hist.append(g)
    if spikes:
        return Finding(name, WARN, f"{len(spikes)} step(s) with a gradient norm > {SPIKE_FACTOR:g}x the running "
                       f"mean of the previous {SPIKE_WINDOW} ({_steps_text(spikes)})", spikes)
    return Finding(name, OK, f"none > {SPIKE_FACTOR:g}x the running mean")


def _check_throughput(rows: list[Row], segs: list[Segment]) -> Finding:
    """Sustained drops: DROP_RUN steps in a row below DROP_FACTOR x the running median, within one process."""
    name = "throughput"
    drops = []
    hist: list[float] = []
    run: list[int] = []
    owner = None
    for r in rows:
        seg = _segment_of(segs, r.step)
        if seg is not owner:  # a new process: its own warm-up and speed
            owner, hist, run = seg, [], []
        if not math.isfinite(r.tps) or r.tps <= 0:
            continue
        if len(hist) >= SPIKE_MIN_HISTORY and r.tps < DROP_FACTOR * statistics.median(hist[-DROP_WINDOW:]):
            run.append(r.step)
            if len(run) == DROP_RUN:
                drops.append(run[0])
            continue  # a slow step does not lower the baseline
        run = []
        hist.append(r.tps)
    if drops:
        return Finding(name, WARN, f"tokens/s fell below {DROP_FACTOR:g}x the running median for >= {DROP_RUN} steps "
                       f"from {_steps_text(drops)}", drops)
    tps = [r.tps for r in rows if math.isfinite(r.tps)]
    return Finding(name, OK, f"median {statistics.median(tps):,.0f} tokens/s, no sustained drop" if tps else "no data")


def _check_memory(segs: list[Segment]) -> Finding:
    """Resident memory within each process, from the rss_mb (else peak_rss_mb) of its events after the first."""
    name = "memory growth"
    grown, seen = [], 0
    for seg in segs:
        vals = [(int(e.get("global_step", 0)), e.get("rss_mb") if e.get("rss_mb") is not None else e.get("peak_rss_mb"))
                for e in seg.events if e["event"] in ("eval", "checkpoint", "end")]
        vals = [(s, float(v)) for s, v in vals if v is not None]
        if len(vals) < 3:
            continue
        seen += 1
        base = vals[0][1]  # after the first step's allocations
        step, top = max(vals[1:], key=lambda sv: sv[1])
        if top - base > MEMORY_GROWTH_MB and top > base * (1 + MEMORY_GROWTH_FRACTION):
            grown.append((step, base, top))
    if grown:
        s, a, b = grown[0]
        return Finding(name, WARN, f"resident memory grew {a:.0f} -> {b:.0f} MiB within one process (by step {s})",
                       [g[0] for g in grown])
    if not seen:
        return Finding(name, OK, "not measured (events without rss_mb, or fewer than 3 per process)")
    return Finding(name, OK, f"no growth > {MEMORY_GROWTH_MB:.0f} MiB and {MEMORY_GROWTH_FRACTION:.0%} "
                   f"in {seen} process(es)")


def _check_resumes(rows: list[Row], segs: list[Segment], events: list[dict], run_dir: Path) -> Finding:
    """A resume continues from a checkpoint this run logged, at its seqs, without a loss jump (lesson 8);
    one from another run's checkpoint is a warning (the run's history before it is not here)."""
    name = "resume signatures"
    resumes = [s for s in segs if s.kind == "resume"]
    if not resumes:
        return Finding(name, OK, "no resumes")
    by_step = {r.step: r for r in rows}
    ckpt_steps = {e["global_step"] for e in events if e["event"] == "checkpoint"}
    fails, warns, notes = [], [], []
    for seg in resumes:
        n = seg.from_step
        row = by_step.get(n)
        if _foreign(seg, run_dir):
            warns.append(n)
            notes.append(f"step {n}: resumed from another run's checkpoint {_text(seg.resume_from)}")
        elif n > 0 and n not in ckpt_steps:
            warns.append(n)
            notes.append(f"step {n}: resumed from a checkpoint this run did not log ({_text(seg.resume_from)})")
        if row is not None and seg.resume_seqs is not None and seg.resume_seqs != row.seqs:
            fails.append(n)
            notes.append(f"step {n}: resumed at {seg.resume_seqs} seqs, the run was at {row.seqs}")
        before = [by_step[s].loss for s in range(n - RESUME_LOSS_STEPS + 1, n + 1)
                  if s in by_step and not by_step[s].skipped and math.isfinite(by_step[s].loss)]
        after = [by_step[s].loss for s in range(n + 1, n + 1 + RESUME_LOSS_STEPS)
                 if s in by_step and not by_step[s].skipped and math.isfinite(by_step[s].loss)]
        if before and after and sum(after) / len(after) > RESUME_LOSS_JUMP * sum(before) / len(before):
            warns.append(n)
            notes.append(f"step {n}: loss jumped {sum(before) / len(before):.3f} -> {sum(after) / len(after):.3f} "
                         "after the resume (optimizer state or carry not restored?)")
    detail = "; ".join(notes[:MAX_LISTED]) + (f"; (+{len(notes) - MAX_LISTED} more)" if len(notes) > MAX_LISTED else "")
    if fails:
        return Finding(name, FAIL, detail, fails)
    if warns:
        return Finding(name, WARN, detail, warns)
    shown = ", ".join(str(s.from_step) for s in resumes[:MAX_LISTED]) + (", ..." if len(resumes) > MAX_LISTED else "")
    return Finding(name, OK, f"{len(resumes)} resume(s) at steps {shown}: "
                   "continuous seqs, lr and loss")


def _foreign(seg: Segment, run_dir: Path) -> bool:
    """Whether a resume started from another run's checkpoint: the trainer says so ("foreign"), else
    its "from" path (relative ones taken from the cwd, as the trainer wrote them) lies outside this
    run's checkpoints/."""
    if seg.foreign is not None:
        return seg.foreign
    if len(seg.resume_from) > 4096:  # longer than any path the kernel takes; resolving it costs an lstat a part
        return True
    try:
        return not Path(seg.resume_from).resolve().is_relative_to((run_dir / "checkpoints").resolve())
    except (OSError, ValueError, RuntimeError):  # a NUL in the path, a symlink loop: not this run's
        return True


def _check_end(segs: list[Segment]) -> Finding:
    """How the last process ended: a failure, a guard's stop or an end without a final checkpoint is
    worth a look; a plain end or an interruption (with its checkpoint) is not."""
    name = "run end"
    if not segs:
        return Finding(name, WARN, "no start event")
    ends = [e for e in segs[-1].events if e["event"] == "end"]
    if not ends:
        return Finding(name, WARN, "the last process logged no end event (killed, or still running)")
    reason = ends[-1].get("reason", "")
    detail = f"ended at step {ends[-1]['global_step']}: {_text(reason)}"
    if reason.startswith(("failed", "stopped")):
        return Finding(name, WARN, detail)
    if "no final checkpoint" in reason:
        return Finding(name, WARN, detail + " (the steps after the last checkpoint are logged again on resume)")
    return Finding(name, OK, detail)


def table_rows(report: ScanReport) -> list[tuple[str, str, str, str]]:
    """(check, status, count, detail) per finding, for the CLI table."""
    return [(f.check, f.status, str(f.count) if f.steps else "", f.detail) for f in report.findings]
