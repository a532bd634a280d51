"""A run's plan and files: what the trainer writes and reads again, and what analysis reads.

    schedule.py    the learning-rate and teacher-forcing schedule, interval checks: pure functions
    budget.py      a time-budgeted run's clock, measured costs and plan, and the state a checkpoint keeps
    tensorfile.py  safetensors written and read by catchat: byte-identical for identical state
    checkpoint.py  atomic save, verified load, keep-last-K, the `latest` pointer
    runlog.py      the one reader of metrics.csv and events.jsonl (trainer, scan, plot)
    rundir.py      the run directory: its files, its lock, branch-aware resume
    faults.py      CATCHAT_FAULT and CATCHAT_CRASH_AT: the faults a real run can be made to meet
"""
