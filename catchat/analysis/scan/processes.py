"""Checks of the run's processes: each resume continues its run, and how the last process ended."""

from __future__ import annotations

import math
from pathlib import Path

from catchat.analysis.scan.records import first_step, known_ranges
from catchat.analysis.scan.report import FAIL, MAX_LISTED, OK, WARN, Finding, cell_text
from catchat.analysis.scan.timeline import Row, Segment
from catchat.run.runlog import missing_ranges, subtract_ranges

RESUME_LOSS_JUMP, RESUME_LOSS_STEPS = 1.5, 3  # mean loss of 3 steps after a resume vs 3 before


def check_resumes(rows: list[Row], segs: list[Segment], events: list[dict], run_dir: Path) -> Finding:
    """A resume continues from a checkpoint this run logged, at its seqs, with every row up to it still in
    metrics.csv, without a loss jump (lesson 8); one from another run's checkpoint is a warning (the
    run's history before it is not here). A checkpoint whose event a kill cut off (after the save's
    rename, before the event) is no warning: a note in the ok detail."""
    name = "resume signatures"
    resumes = [s for s in segs if s.kind == "resume"]
    if not resumes:
        return Finding(name, OK, "no resumes")
    by_step = {r.step: r for r in rows}
    ckpt_steps = {e["global_step"] for e in events if e["event"] == "checkpoint"}
    first = first_step(segs, rows)
    prev_of = {id(s): segs[i - 1] for i, s in enumerate(segs) if i}  # the process each one followed
    known = known_ranges(events)
    fails, warns, notes, infos = [], [], [], []
    for seg in resumes:
        n = seg.from_step
        row = by_step.get(n)
        if _foreign(seg, run_dir):
            warns.append(n)
            notes.append(f"step {n}: resumed from another run's checkpoint {cell_text(seg.resume_from)}")
        else:
            if n > 0 and n not in ckpt_steps:
                if _saved_then_killed(n, prev_of.get(id(seg)), by_step, run_dir):
                    infos.append(f"step {n}: its checkpoint has no checkpoint event: the process before was "
                                 "killed right after saving it (no end event), as a kill may leave it")
                else:
                    warns.append(n)
                    notes.append(f"step {n}: resumed from a checkpoint this run did not log "
                                 f"({cell_text(seg.resume_from)})")
            lost = _rows_missing_before(list(by_step), first, n, known)
            if lost:
                fails.append(n)
                notes.append(lost)
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
    notes += infos  # after the defects and warnings: the first listed are the ones that need a look
    detail = "; ".join(notes[:MAX_LISTED]) + (f"; (+{len(notes) - MAX_LISTED} more)" if len(notes) > MAX_LISTED else "")
    if fails:
        return Finding(name, FAIL, detail, sorted(set(fails)))
    if warns:
        return Finding(name, WARN, detail, warns)
    shown = ", ".join(str(s.from_step) for s in resumes[:MAX_LISTED]) + (", ..." if len(resumes) > MAX_LISTED else "")
    return Finding(name, OK, f"{len(resumes)} resume(s) at steps {shown}: "
                   "continuous seqs, lr and loss" + "".join(f"; {t}" for t in infos[:MAX_LISTED]))


def _saved_then_killed(n: int, prev: Segment | None, by_step: dict[int, Row], run_dir: Path) -> bool:
    """Whether a resume at step n lacks its checkpoint's `checkpoint` event only because a kill came
    between the save's rename and the event's write: the process before the resume (`prev`) began
    before step n, reached it (its row, or the checkpoint on disk), and logged no `end` (a process
    that ends has logged every save it made)."""
    if prev is None or prev.from_step >= n or any(e["event"] == "end" for e in prev.events):
        return False
    return n in by_step or (run_dir / "checkpoints" / f"step-{n:07d}").is_dir()


def _rows_missing_before(steps: list[int], first: int, n: int, known: list[tuple[int, int]]) -> str | None:
    """A resume at step n continues a run that logged one row per step from `first` (records.first_step)
    up to n: fewer rows at or before n (the file cut after some step < n, or rows gone from its middle)
    were there once and are lost, most likely metrics.csv truncated from outside. `steps`: the rows'
    steps; `known`: the ranges a resume found missing and recorded (metrics_gap events: the step check
    warns of them). The detail, or None when every row is there or recorded missing."""
    gaps = missing_ranges(steps, first, n)
    unknown = [p for g in gaps for p in subtract_ranges(g, known)]
    if not unknown:
        return None
    held = (n - first + 1) - sum(hi - lo + 1 for lo, hi in gaps)
    return (f"step {n}: resumed from a checkpoint at step {n}, but metrics.csv holds {held} of the "
            f"{n - first + 1} rows logged up to it (missing from step {unknown[0][0]}): rows lost, metrics.csv "
            "truncated or edited from outside?")


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


def check_end(segs: list[Segment]) -> Finding:
    """How the last process ended: a failure, a guard's stop or an end without a final checkpoint is
    worth a look; a plain end or an interruption (with its checkpoint) is not."""
    name = "run end"
    if not segs:
        return Finding(name, WARN, "no start event")
    ends = [e for e in segs[-1].events if e["event"] == "end"]
    if not ends:
        return Finding(name, WARN, "the last process logged no end event (killed, or still running)")
    reason = ends[-1].get("reason", "")
    detail = f"ended at step {ends[-1]['global_step']}: {cell_text(reason)}"
    if reason.startswith(("failed", "stopped")):
        return Finding(name, WARN, detail)
    if "no final checkpoint" in reason:
        return Finding(name, WARN, detail + " (the steps after the last checkpoint are logged again on resume)")
    return Finding(name, OK, detail)


# config key -> its field in a start/resume event's schedule (the teacher_forcing keys are the
# event's teacher_forcing fields of the same name)
SCHEDULE_FIELDS = {"train.lr": "lr", "schedule.warmup_fraction": "warmup_fraction",
                   "schedule.cooldown_fraction": "cooldown_fraction", "schedule.cooldown_shape": "cooldown_shape",
                   "schedule.lr_min": "lr_min", "train.time_budget_s": "time_budget_s"}


def check_plan_changes(segs: list[Segment]) -> Finding:
    """A resume that changed the plan (catchat/training/plan.py) logs a plan_change event: worth a look,
    not a defect. A resume whose schedule or teacher forcing differs from the process before it
    without one is a warning too (a catchat before plan_change events changed plans silently); an event
    that does not match the schedules the two processes logged is a defect."""
    name = "plan changes"
    said, silent, wrong = [], [], []
    for i, seg in enumerate(segs):
        step = seg.from_step
        prev = next((p for p in reversed(segs[:i]) if _continued(p, step)), None)
        if seg.kind != "resume" or prev is None:
            continue
        moved = _moved(prev, seg)
        events = [e for e in seg.events if e["event"] == "plan_change"]
        if not events:
            if moved:
                silent.append((step, f"step {step}: {_pairs(moved)} with no plan_change event"))
            continue
        changes = {k: c for e in events for k, c in e["changes"].items()}
        said.append((step, f"step {step}: " + _pairs({k: (c.get("old"), c.get("new")) for k, c in changes.items()})))
        # the schedule's own account (planned steps, next lr) beside the config keys
        logged = {**changes, **{f"schedule.{k}": c for e in events for k, c in e.get("schedule", {}).items()}}
        off = [k for k, (old, new) in moved.items()
               if (c := logged.get(_key_of(k))) is None or c.get("old") != old or c.get("new") != new]
        if off:
            wrong.append((step, f"step {step}: the processes logged {_pairs({k: moved[k] for k in off})}, "
                                "which its plan_change event does not say"))
    found = wrong or silent or said
    detail = "; ".join(text for _, text in found[:MAX_LISTED]) + (
        f"; (+{len(found) - MAX_LISTED} more)" if len(found) > MAX_LISTED else "")
    if wrong:
        return Finding(name, FAIL, detail, [s for s, _ in wrong])
    if silent:
        return Finding(name, WARN, detail + " (the lr check follows each process's own schedule)",
                       [s for s, _ in silent])
    if said:
        return Finding(name, WARN, "changed on resume: " + detail, [s for s, _ in said])
    return Finding(name, OK, "none: every resume continued the run's plan")


def _continued(seg: Segment, step: int) -> bool:
    """Whether a process can have written the checkpoint a later resume at `step` continued: it began
    before that step, or at it and saved there (a resume whose new plan took no step). One that
    resumed at the step and died before saving left nothing to continue."""
    return seg.from_step < step or any(e["event"] == "checkpoint" and e["global_step"] == step for e in seg.events)


_FIELD_OF = {f"schedule.{f}": k for k, f in SCHEDULE_FIELDS.items()}  # the event's name for a schedule field


def _key_of(name: str) -> str:
    """The plan_change key that records a moved schedule field: its config key, or schedule.total_steps."""
    return _FIELD_OF.get(name, name)


def _moved(prev: Segment, seg: Segment) -> dict:
    """'schedule.F' and 'teacher_forcing.F' -> (before, after) for the fields two processes logged differently."""
    out = {}
    for section, a, b in (("schedule", prev.schedule, seg.schedule),
                          ("teacher_forcing", prev.teacher_forcing, seg.teacher_forcing)):
        if not isinstance(a, dict) or not isinstance(b, dict):
            continue  # an older catchat's event without it: nothing to compare
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                out[f"{section}.{k}"] = (a.get(k), b.get(k))
    return out


def _pairs(changes: dict) -> str:
    shown = [f"{cell_text(k, 40)} {cell_text(old, 20)} -> {cell_text(new, 20)}" for k, (old, new) in changes.items()]
    return ", ".join(shown[:MAX_LISTED]) + (", ..." if len(shown) > MAX_LISTED else "")
