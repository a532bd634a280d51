"""Checks of the run's record: both telemetry files whole, the step sequence, the counters, non-finite
and skipped steps."""

from __future__ import annotations

import itertools
import math
from collections import Counter

from catchat.analysis.scan.report import FAIL, MAX_LISTED, MAX_STEPS, OK, WARN, Finding, cell_text, steps_text
from catchat.analysis.scan.timeline import Row, Segment
from catchat.run.runlog import EventsLog, MetricsLog, describe_bad, missing_ranges, subtract_ranges

CUT_SHORT = "the last line is cut short (a crash while writing it, or a write in flight): not used"


def check_metrics_file(log: MetricsLog) -> Finding:
    """Every line of metrics.csv a whole, well-formed row (catchat.run.runlog says why not)."""
    name = "metrics.csv"
    if log.n_bad:
        return Finding(name, FAIL, describe_bad(log) + ", skipped" + (f"; {CUT_SHORT}" if log.truncated_tail else ""))
    if log.truncated_tail:
        return Finding(name, WARN, f"{len(log.rows)} rows; {CUT_SHORT}")
    return Finding(name, OK, f"{len(log.rows)} rows")


def check_events_file(log: EventsLog, segs: list[Segment]) -> Finding:
    """Every line of events.jsonl a JSON event whose known fields have their types."""
    name = "events.jsonl"
    if log.n_bad:
        return Finding(name, FAIL, describe_bad(log) + ", skipped" + (f"; {CUT_SHORT}" if log.truncated_tail else ""))
    if log.truncated_tail:
        return Finding(name, WARN, f"{len(log.events)} events; {CUT_SHORT}")
    if not log.events:
        return Finding(name, WARN, "no events (missing or empty file)")
    injected = sorted({cell_text(f, 40) for s in segs for f in s.events[0].get("faults", [])})
    return Finding(name, OK, f"{len(log.events)} events, {len(segs)} process(es)"
                   + (f"; faults injected on purpose ($CATCHAT_FAULT): {', '.join(injected)}" if injected else ""))


def first_step(segs: list[Segment], rows: list[Row]) -> int:
    """The step the run's first row should have: 1, or N + 1 when its first process resumed another
    run's checkpoint at step N (the trainer then starts new telemetry there, so no row is <= N)."""
    if segs and segs[0].kind == "resume" and rows and rows[0].step > segs[0].from_step:
        return segs[0].from_step + 1
    return 1


def _missing(gaps: list[tuple[int, int]]) -> list[int]:
    """The first MAX_STEPS missing steps (a gap can be any size)."""
    out: list[int] = []
    for lo, hi in gaps:
        out.extend(range(lo, min(hi, lo + MAX_STEPS - len(out) - 1) + 1))
        if len(out) >= MAX_STEPS:
            break
    return out


def check_steps(rows: list[Row], segs: list[Segment], events: list[dict], branch_cuts: list[int]) -> Finding:
    """global_step runs first, first + 1, ...: none missing (rows lost), none repeated or going back
    (not truncated on resume). A branch is no defect: the live rows continue from the branch step."""
    name = "step sequence"
    if not rows:
        return Finding(name, WARN, "no steps logged")
    first = first_step(segs, rows)
    steps = [r.step for r in rows]
    gaps, known = _known_gaps(missing_ranges(steps, first, max(steps)), events)
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
        problems.append(f"{steps_text(repeated)} logged more than once")
    if back:
        i = back[0]
        problems.append(f"row {i + 1} has step {steps[i]} after step {steps[i - 1]} "
                        f"({len(back)} time(s) out of order: rows not truncated on resume?)")
    if early:
        problems.append(f"{steps_text(early)} before the first step {first}")
    branched = _branch_notes(events, branch_cuts)
    if problems:
        listed = sorted({*repeated, *(steps[i] for i in back), *early, *_missing(gaps)})[:MAX_STEPS]
        return Finding(name, FAIL, "; ".join(problems + [t for _, t in known] + branched), listed,
                       total=n_missing + len(set(repeated) | {steps[i] for i in back} | set(early)))
    if known:
        return Finding(name, WARN, "; ".join([t for _, t in known] + branched), [s for s, _ in known])
    return Finding(name, OK, "; ".join([f"steps {first}..{steps[-1]}, none missing or repeated"] + branched))


def known_ranges(events: list[dict]) -> list[tuple[int, int]]:
    """The step ranges a resume found missing from metrics.csv and recorded (`metrics_gap` events)."""
    return [(lo, hi) for e in events if e["event"] == "metrics_gap" for lo, hi in e["missing"]]


def _known_gaps(gaps: list[tuple[int, int]], events: list[dict]) -> tuple[list[tuple[int, int]], list[tuple[int, str]]]:
    """(the gaps no `metrics_gap` event recorded, (first step, note) for each recorded one): a gap the
    trainer found at a resume and logged is known (rows cut outside catchat, which it cannot make
    again): a warning with the event's note, not an unexplained defect."""

    known = known_ranges(events)
    if not known:
        return gaps, []
    notes = ((max(lo, klo), f"steps {max(lo, klo)}..{min(hi, khi)} missing, recorded at the resume at step "
              f"{e['global_step']}: {cell_text(e['note'], 300)}")
             for e in events if e["event"] == "metrics_gap" for klo, khi in e["missing"]
             for lo, hi in gaps if lo <= khi and klo <= hi)
    return [p for g in gaps for p in subtract_ranges(g, known)], list(itertools.islice(notes, MAX_LISTED))


def _branch_notes(events: list[dict], cuts: list[int]) -> list[str]:
    """What each `branch` event says (the run went back to an older checkpoint), for the detail."""
    notes = []
    for e in [e for e in events if e["event"] == "branch"][:MAX_LISTED]:
        b, a = max(e["branch_step"], 0), e["abandoned_step"]
        notes.append(f"branched at step {b}" + (f" from {cell_text(e['from'], 60)}" if e.get("from") else "")
                     + (f": steps {b + 1}..{a} abandoned" if a > b else "")
                     + (f", kept in {cell_text(e['side_dir'], 60)}" if e.get("side_dir") else ""))
    if cuts:
        notes.append(f"rows of abandoned branches dropped after step(s) {', '.join(map(str, cuts[:MAX_LISTED]))}")
    return notes


def check_counters(rows: list[Row], segs: list[Segment], cfg) -> Finding:
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


def check_nonfinite(rows: list[Row], events: list[dict] = ()) -> Finding:
    """Applied non-finite steps fail; skipped ones warn, except fp16 overflows (a skipped_step event with
    a loss_scale: the loss scale halving, catchat/precision.py), which are how loss scaling works."""
    name = "non-finite steps"
    overflows = {int(e["global_step"]) for e in events if e["event"] == "skipped_step" and "loss_scale" in e}
    applied = [r.step for r in rows if not r.skipped and not (math.isfinite(r.loss) and math.isfinite(r.grad_norm))]
    skipped = [r.step for r in rows if r.skipped and r.valid > 0 and not math.isfinite(r.grad_norm)]
    scaled = [s for s in skipped if s in overflows]
    skipped = [s for s in skipped if s not in overflows]
    if applied:
        return Finding(name, FAIL, f"{len(applied)} applied step(s) with a non-finite loss or gradient norm "
                       f"({steps_text(applied)}): the skip guard did not hold", applied)
    if skipped:
        return Finding(name, WARN, f"{len(skipped)} step(s) with a non-finite gradient, skipped by the guard "
                       f"({steps_text(skipped)})", skipped)
    if scaled:
        return Finding(name, OK, f"{len(scaled)} fp16 overflow step(s), skipped as the loss scale halved "
                       f"({steps_text(scaled)})", scaled)
    return Finding(name, OK, "every loss and gradient norm finite")


def check_skipped(rows: list[Row], events: list[dict]) -> Finding:
    """Every skipped step is logged as a skipped_step event; a step without valid targets is never applied."""
    name = "skipped steps"
    logged = {int(e.get("global_step", -1)) for e in events if e["event"] == "skipped_step"}
    skipped = [r.step for r in rows if r.skipped]
    unlogged = [s for s in skipped if s not in logged]
    applied_empty = [r.step for r in rows if r.valid == 0 and not r.skipped]
    if applied_empty:
        return Finding(name, FAIL, f"step(s) with no valid targets applied ({steps_text(applied_empty)}): "
                       "lesson 10", applied_empty)
    if unlogged and events:
        return Finding(name, FAIL, f"skipped step(s) without a skipped_step event ({steps_text(unlogged)})", unlogged)
    if skipped:
        empty = sum(1 for r in rows if r.skipped and r.valid == 0)
        return Finding(name, OK, f"{len(skipped)} skipped ({empty} without valid targets), each logged", skipped)
    return Finding(name, OK, "none")
