"""Checks of the logged lr and tf against their formulas, under the schedule in force for each step."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from catchat.analysis.scan.report import FAIL, OK, WARN, Finding, cell_text
from catchat.analysis.scan.timeline import Row, Segment, Segments

LR_RTOL = 2e-5  # metrics.csv writes lr with 6 significant digits (tf too)


def _schedule_for(seg: Segment | None, cfg):
    """(WSD, total_steps) in force for a segment: its event's schedule, else config.toml."""
    from catchat.run.schedule import WSD

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


FORMULA_ERRORS = (ValueError, ArithmeticError)  # what lr_at / tf_at raise on values no trainer logs


@dataclass
class _Tally:
    """Rows held against a formula: mismatches (step, logged, formula), rows whose formula could not be
    evaluated (step, error), rows checked, rows it did not apply to."""

    bad: list[tuple[int, float, float]] = field(default_factory=list)
    unusable: list[tuple[int, Exception]] = field(default_factory=list)
    checked: int = 0
    skipped: int = 0


def _tally(rows: list[Row], logged: Callable[[Row], float], formula: Callable[[Row], Callable[[], float] | None],
           abs_tol: float) -> _Tally:
    """Each row's logged value against its formula: formula(row) is None where it does not apply, else
    a thunk of the value (FORMULA_ERRORS from it, a damaged schedule in events.jsonl such as
    total_steps 0, lr nan or decay_cycles 0, mark the row unusable)."""
    t = _Tally()
    for r in rows:
        want = formula(r)
        if want is None:
            t.skipped += 1
            continue
        try:
            value = want()
        except FORMULA_ERRORS as exc:
            t.unusable.append((r.step, exc))
            continue
        t.checked += 1
        if not math.isclose(logged(r), value, rel_tol=LR_RTOL, abs_tol=abs_tol):
            t.bad.append((r.step, logged(r), value))
    return t


def _finding(name: str, t: _Tally, *, field_name: str, formula: str, cause: str, follows: str, what: str,
             not_checked: str | None) -> Finding:
    """FAIL on a mismatch; WARN where some rows' formula could not be evaluated, or (`not_checked`) none
    was checked; else OK."""
    note = _unusable_note(t.unusable, what)
    if t.bad:
        step, got, want = t.bad[0]
        return Finding(name, FAIL, f"{len(t.bad)} step(s) whose {field_name} is not {formula} (step {step}: "
                       f"{got:g}, the formula gives {want:g}){cause}" + note, [b[0] for b in t.bad])
    if t.unusable:
        return Finding(name, WARN, f"{t.checked} steps follow {follows}" + note, [u[0] for u in t.unusable])
    if not_checked:
        return Finding(name, WARN, not_checked)
    return Finding(name, OK, f"{t.checked} steps follow {follows}")


def _unusable_note(unusable: list[tuple[int, Exception]], what: str) -> str:
    if not unusable:
        return ""
    step, exc = unusable[0]
    return (f"; {len(unusable)} step(s) not checked: the {what} logged for them cannot be evaluated "
            f"(step {step}: {cell_text(exc, 80)})")


def _budgeted(seg: Segment | None, cfg) -> bool:
    """Whether the process that logged a segment ran on a time budget (its lr follows the progress column)."""
    sched = (seg.schedule if seg else None) or {}
    if "time_budget_s" in sched:
        return bool(sched["time_budget_s"])
    return seg is None and cfg is not None and cfg.train.time_budget_s > 0


def check_lr(rows: list[Row], segs: Segments, cfg) -> Finding:
    """Each row's lr equals schedule.lr_at(global_step - 1) under the schedule of the process that logged it
    (a time-budgeted process: schedule.lr_at_progress of the row's progress column)."""
    from catchat.run.schedule import lr_at, lr_at_progress

    def formula(r: Row):
        seg = segs.of(r.step)
        wsd, total = _schedule_for(seg, cfg)
        if wsd is not None and _budgeted(seg, cfg):
            return None if math.isnan(r.progress) else (lambda: lr_at_progress(r.progress, wsd))
        if wsd is None or not total:
            return None
        return lambda: lr_at(r.step - 1, total, wsd)

    t = _tally(rows, lambda r: r.lr, formula, abs_tol=1e-12)
    return _finding("lr vs schedule", t, field_name="lr", formula="schedule.lr_at(global_step - 1)",
                    cause=": a re-run warmup (lesson 2) or a schedule not restored", follows="the WSD formula",
                    what="schedule", not_checked=None if t.checked else
                    "not checked: no schedule in events.jsonl and no readable config.toml")


def _tf_for(seg: Segment | None, cfg):
    """(teacher-forcing settings, seqs_per_cycle) in force for a segment: its event's, else config.toml's."""
    from types import SimpleNamespace

    tf = (seg.teacher_forcing if seg else None)
    if tf is None and cfg is not None and hasattr(cfg, "teacher_forcing"):
        tf = dataclasses.asdict(cfg.teacher_forcing)
    return (SimpleNamespace(**tf) if tf else None), (seg.seqs_per_cycle if seg else None)


def check_tf(rows: list[Row], segs: Segments, cfg) -> Finding:
    """Each row's tf equals schedule.tf_at(cycles done before the step) (1 where there is no schedule)."""
    from catchat.run.schedule import tf_at

    sps = next((s.seqs_per_step for s in segs if s.seqs_per_step), None)

    def formula(r: Row):
        tf, spc = _tf_for(segs.of(r.step), cfg)
        if tf is None:
            return lambda: 1.0  # a catchat without a teacher-forcing schedule: always the data's token
        if getattr(tf, "schedule", "constant") == "constant" or tf.start <= tf.floor:
            return lambda: float(tf.start)
        if spc and sps:
            return lambda: tf_at((r.seqs - sps) / spc, tf)
        return None

    t = _tally(rows, lambda r: r.tf, formula, abs_tol=1e-9)
    return _finding("tf vs schedule", t, field_name="tf", formula="schedule.tf_at(cycles done)", cause="",
                    follows="the teacher-forcing schedule", what="teacher-forcing schedule",
                    not_checked="not checked: a decaying schedule but no seqs_per_cycle in events.jsonl"
                    if t.skipped and not t.checked else None)
