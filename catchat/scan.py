"""`catchat scan RUN_DIR`: the anomaly scan of a run's telemetry (metrics.csv, events.jsonl, config.toml).

Each check gives a status: `ok`, `warn` (worth a look: the run may still be sound) or `FAIL` (a
defect: the run's record or its training is wrong). `catchat scan` prints the table and exits 1
when any check fails (`--strict`: also on a warning). docs/reliability.md lists the rules.

    report = scan_run(Path("runs/tiny"))
    report.defects          # the FAIL findings
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from catchat.errors import UsageError

OK, WARN, FAIL = "ok", "warn", "FAIL"
COLUMNS = ("global_step", "seqs", "cycle", "tokens", "lr", "tf", "loss", "grad_norm", "clipped", "valid_tokens",
           "tokens_per_s", "step_ms", "gradh_clamp_hits", "skipped")

# Thresholds (docs/reliability.md)
SPIKE_FACTOR = 5.0  # grad norm > this x the running mean of the previous SPIKE_WINDOW finite norms
SPIKE_WINDOW, SPIKE_MIN_HISTORY = 50, 10
LOSS_RISE = 1.10  # a block of steps whose mean loss exceeds the previous block's by 10%: warn
LOSS_DIVERGED = 1.5  # the last block's mean loss above 1.5x the best block's: FAIL
DROP_FACTOR, DROP_RUN, DROP_WINDOW = 0.5, 5, 50  # >= 5 steps in a row below half the running median
MEMORY_GROWTH_MB, MEMORY_GROWTH_FRACTION = 64.0, 0.25  # RSS growth within one process: warn above both
RESUME_LOSS_JUMP, RESUME_LOSS_STEPS = 1.5, 3  # mean loss of 3 steps after a resume vs 3 before
LR_RTOL = 2e-5  # metrics.csv writes lr with 6 significant digits
MAX_LISTED = 5  # steps listed per finding


@dataclass
class Finding:
    check: str
    status: str
    detail: str
    steps: list[int] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.steps)


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


def _float(text: str) -> float:
    return float(text) if text not in ("", None) else math.nan


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
    loss_text: str


def read_metrics(path: Path) -> tuple[list[Row], list[str]]:
    """Rows of metrics.csv and the problems found reading it (with line numbers)."""
    rows, problems = [], []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return [], [f"{path.name} is empty (no header)"]
        if tuple(header) != COLUMNS:
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                return [], [f"{path.name}: header lacks {', '.join(missing)}"]
        col = {c: header.index(c) for c in COLUMNS}
        for lineno, r in enumerate(reader, 2):
            if not r:
                continue
            try:
                get = lambda c: r[col[c]]  # noqa: E731
                rows.append(Row(step=int(get("global_step")), seqs=int(get("seqs")), cycle=int(get("cycle")),
                                tokens=int(get("tokens")), lr=float(get("lr")), tf=float(get("tf")),
                                loss=_float(get("loss")), grad_norm=_float(get("grad_norm")),
                                valid=int(get("valid_tokens")), tps=_float(get("tokens_per_s")),
                                skipped=get("skipped") == "1", loss_text=get("loss")))
            except (ValueError, IndexError) as exc:
                problems.append(f"line {lineno}: {exc}")
    return rows, problems


def read_events(path: Path) -> tuple[list[dict], list[int]]:
    """Events and the line numbers that are not JSON objects."""
    events, bad = [], []
    if not path.exists():
        return events, bad
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                bad.append(lineno)
                continue
            if isinstance(e, dict) and "event" in e:
                events.append(e)
            else:
                bad.append(lineno)
    return events, bad


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


def _segments(events: list[dict]) -> list[Segment]:
    segs: list[Segment] = []
    for e in events:
        if e["event"] in ("start", "resume"):
            sched = e.get("schedule")
            if sched is None and e["event"] == "start" and "total_steps" in e:
                sched = {"total_steps": e["total_steps"]}
            segs.append(Segment(e["event"], int(e.get("global_step", 0)), sched, e.get("seqs_per_step"),
                                e.get("tokens_per_step"), [e], e.get("teacher_forcing"), e.get("seqs_per_cycle"),
                                resume_seqs=e.get("seqs"), resume_from=str(e.get("from", ""))))
        elif segs:
            segs[-1].events.append(e)
    return segs


def _segment_of(segs: list[Segment], step: int) -> Segment | None:
    """The process that logged metrics row `step` (the last one that started before it)."""
    owner = None
    for s in segs:
        if s.from_step < step:
            owner = s
    return owner


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
    rows, problems = read_metrics(metrics)
    events, bad_lines = read_events(run_dir / "events.jsonl")
    cfg = _read_config(run_dir / "config.toml")
    segs = _segments(events)
    out: list[Finding] = []

    # --- the record itself
    if problems:
        out.append(Finding("metrics.csv", FAIL, f"{len(problems)} unreadable rows: " + "; ".join(problems[:3])))
    else:
        out.append(Finding("metrics.csv", OK, f"{len(rows)} rows"))
    if bad_lines:
        last = bad_lines == [_count_lines(run_dir / "events.jsonl")]
        out.append(Finding("events.jsonl", WARN if last else FAIL,
                           ("the last line is cut short (a crash while writing it)" if last else
                            f"lines {', '.join(map(str, bad_lines[:MAX_LISTED]))} are not JSON events"), bad_lines))
    elif not events:
        out.append(Finding("events.jsonl", WARN, "no events (missing or empty file)"))
    else:
        injected = sorted({f for e in events for f in e.get("faults", [])})
        out.append(Finding("events.jsonl", OK, f"{len(events)} events, {len(segs)} process(es)"
                           + (f"; faults injected on purpose ($CATCHAT_FAULT): {', '.join(injected)}" if injected else "")))

    out.append(_check_steps(rows))
    out.append(_check_counters(rows, segs, cfg))
    out.append(_check_nonfinite(rows))
    out.append(_check_skipped(rows, events))
    out.append(_check_lr(rows, segs, cfg))
    out.append(_check_tf(rows, segs, cfg))
    out.append(_check_running_loss(rows))
    out.append(_check_grad_spikes(rows))
    out.append(_check_throughput(rows, segs))
    out.append(_check_memory(segs))
    out.append(_check_resumes(rows, segs, events))
    out.append(_check_end(segs))
    return ScanReport(run_dir, len(rows), out)


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def _read_config(path: Path):
    if not path.is_file():
        return None
    from catchat import config as cfgmod

    try:
        return cfgmod.load(path)
    except UsageError:
        return None


def _check_steps(rows: list[Row]) -> Finding:
    name = "step sequence"
    if not rows:
        return Finding(name, WARN, "no steps logged")
    bad = [(i + 1, r.step) for i, r in enumerate(rows) if r.step != i + 1]
    if bad:
        return Finding(name, FAIL, f"global_step is not 1, 2, 3, ... (row {bad[0][0]} has step {bad[0][1]}): "
                       "rows lost, repeated, or not truncated on resume", [b[1] for b in bad])
    return Finding(name, OK, f"steps 1..{len(rows)}, none missing or repeated")


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
    for r in rows:
        wsd, total = _schedule_for(_segment_of(segs, r.step), cfg)
        if wsd is None or not total:
            continue
        want = lr_at(r.step - 1, total, wsd)
        checked += 1
        if not math.isclose(r.lr, want, rel_tol=LR_RTOL, abs_tol=1e-12):
            bad.append((r.step, r.lr, want))
    first_bad = f"step {bad[0][0]}: {bad[0][1]:g}, the formula gives {bad[0][2]:g}" if bad else ""
    if bad:
        return Finding(name, FAIL, f"{len(bad)} step(s) whose lr is not schedule.lr_at(global_step - 1) "
                       f"({first_bad}): a re-run warmup (lesson 2) or a schedule not restored", [x[0] for x in bad])
    if not checked:
        return Finding(name, WARN, "not checked: no schedule in events.jsonl and no readable config.toml")
    return Finding(name, OK, f"{checked} steps follow the WSD formula")


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
    for r in rows:
        tf, spc = _tf_for(_segment_of(segs, r.step), cfg)
        if tf is None:
            want = 1.0  # a catchat without a teacher-forcing schedule: always the data's token
        elif getattr(tf, "schedule", "constant") == "constant" or tf.start <= tf.floor:
            want = float(tf.start)
        elif spc and sps:
            want = tf_at((r.seqs - sps) / spc, tf)
        else:
            unchecked += 1
            continue
        checked += 1
        if not math.isclose(r.tf, want, rel_tol=LR_RTOL, abs_tol=1e-9):
            bad.append((r.step, r.tf, want))
    if bad:
        return Finding(name, FAIL, f"{len(bad)} step(s) whose tf is not schedule.tf_at(cycles done) (step {bad[0][0]}: "
                       f"{bad[0][1]:g}, the formula gives {bad[0][2]:g})", [b[0] for b in bad])
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
    name = "running loss"
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


def _check_resumes(rows: list[Row], segs: list[Segment], events: list[dict]) -> Finding:
    """A resume continues from a checkpoint this run logged, at its seqs, without a loss jump (lesson 8)."""
    name = "resume signatures"
    resumes = [s for s in segs if s.kind == "resume"]
    if not resumes:
        return Finding(name, OK, "no resumes")
    by_step = {r.step: r for r in rows}
    ckpt_steps = {int(e.get("global_step", -1)) for e in events if e["event"] == "checkpoint"}
    fails, warns, notes = [], [], []
    for seg in resumes:
        n = seg.from_step
        row = by_step.get(n)
        if n > 0 and n not in ckpt_steps:
            warns.append(n)
            notes.append(f"step {n}: resumed from a checkpoint this run did not log ({seg.resume_from})")
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
    if fails:
        return Finding(name, FAIL, "; ".join(notes), fails)
    if warns:
        return Finding(name, WARN, "; ".join(notes), warns)
    return Finding(name, OK, f"{len(resumes)} resume(s) at steps {', '.join(str(s.from_step) for s in resumes)}: "
                   "continuous seqs, lr and loss")


def _check_end(segs: list[Segment]) -> Finding:
    name = "run end"
    if not segs:
        return Finding(name, WARN, "no start event")
    ends = [e for e in segs[-1].events if e["event"] == "end"]
    if not ends:
        return Finding(name, WARN, "the last process logged no end event (killed, or still running)")
    reason = str(ends[-1].get("reason", ""))
    if reason.startswith("failed"):
        return Finding(name, WARN, f"ended at step {ends[-1].get('global_step')}: {reason}")
    return Finding(name, OK, f"ended at step {ends[-1].get('global_step')}: {reason}")


def table_rows(report: ScanReport) -> list[tuple[str, str, str, str]]:
    """(check, status, count, detail) per finding, for the CLI table."""
    return [(f.check, f.status, str(f.count) if f.steps else "", f.detail) for f in report.findings]
