"""Checks of the run's processes: each resume continues its run, and how the last process ended."""

from __future__ import annotations

import math
from pathlib import Path

from catchat.analysis.scan.report import FAIL, MAX_LISTED, OK, WARN, Finding, cell_text
from catchat.analysis.scan.timeline import Row, Segment

RESUME_LOSS_JUMP, RESUME_LOSS_STEPS = 1.5, 3  # mean loss of 3 steps after a resume vs 3 before


def check_resumes(rows: list[Row], segs: list[Segment], events: list[dict], run_dir: Path) -> Finding:
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
            notes.append(f"step {n}: resumed from another run's checkpoint {cell_text(seg.resume_from)}")
        elif n > 0 and n not in ckpt_steps:
            warns.append(n)
            notes.append(f"step {n}: resumed from a checkpoint this run did not log ({cell_text(seg.resume_from)})")
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
