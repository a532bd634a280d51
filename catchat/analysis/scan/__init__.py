"""`catchat scan RUN_DIR`: the anomaly scan of a run's telemetry (metrics.csv, events.jsonl, config.toml).

Each check gives a status: `ok`, `warn` (worth a look: the run may still be sound) or `FAIL` (a
defect: the run's record or its training is wrong). `catchat scan` prints the table and exits 1
when any check fails (`--strict`: also on a warning). docs/reliability.md lists the rules.

    report = scan_run(Path("runs/tiny"))
    report.defects          # the FAIL findings

The package: report (statuses, Finding, ScanReport, table_rows), timeline (reading the rows of
the live branch and the processes), and the checks in groups, each with its thresholds: records
(the telemetry files, steps, counters, non-finite and skipped steps), schedules (lr and tf against
their formulas), health (loss, grad norm, throughput, memory), processes (resumes, plan changes, the run's end).
"""

from __future__ import annotations

from pathlib import Path

from catchat.analysis.scan.health import check_grad_spikes, check_memory, check_running_loss, check_throughput
from catchat.analysis.scan.processes import check_end, check_plan_changes, check_resumes
from catchat.analysis.scan.records import (
    check_counters,
    check_events_file,
    check_metrics_file,
    check_nonfinite,
    check_skipped,
    check_steps,
)
from catchat.analysis.scan.report import FAIL, OK, WARN, Finding, ScanReport, table_rows
from catchat.analysis.scan.schedules import check_lr, check_tf
from catchat.analysis.scan.timeline import read_config, read_rows, segments, timeline
from catchat.errors import UsageError
from catchat.run.runlog import EventsLog, read_events, read_metrics, read_or_refuse

__all__ = ["FAIL", "OK", "WARN", "Finding", "ScanReport", "scan_run", "table_rows"]


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
    rows, branch_cuts = timeline(read_rows(mlog), events)
    cfg = read_config(run_dir / "config.toml")
    segs = segments(events)
    out = [check_metrics_file(mlog), check_events_file(elog, segs)]
    out.append(check_steps(rows, segs, events, branch_cuts))
    out.append(check_counters(rows, segs, cfg))
    out.append(check_nonfinite(rows, events))
    out.append(check_skipped(rows, events))
    out.append(check_lr(rows, segs, cfg))
    out.append(check_tf(rows, segs, cfg))
    out.append(check_running_loss(rows))
    out.append(check_grad_spikes(rows))
    out.append(check_throughput(rows, segs))
    out.append(check_memory(segs))
    out.append(check_resumes(rows, segs, events, run_dir))
    out.append(check_plan_changes(segs))
    out.append(check_end(segs))
    return ScanReport(run_dir, len(rows), out)
