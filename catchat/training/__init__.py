"""Training: the loop and its parts, one module each (docs/architecture.md "Training").

    loop.py         Trainer: lanes in order -> recorded step -> evals -> checkpoint -> telemetry
    state.py        RunState: cursor, step counters, fp16's loss scale
    feed.py         Feed: each step's micro-batches from the lanes in order (the next made ahead)
    step.py         DeviceStep: the recorded GPU step and its outcome (applied, skipped, overflow)
    evals.py        Evals: eval metrics and samples
    checkpoints.py  Checkpoints: save and restore side by side (CarryToRoot on other ranks)
    telemetry.py    Telemetry: events.jsonl, metrics.csv, the reporter (Quiet on other ranks)
    budget.py       the pace: StepSchedule, or TimeBudget (train.time_budget_s)
    ranks.py        OneProcess, or Ranks (a data-parallel rank)
    signals.py      StopSignals: Ctrl-C and SIGTERM
    build.py        Setup: corpus, lanes, layout and Program from the config; a fresh start
    start.py        opening a run on rank 0: checks, the run's files, the start/resume event

`catchat.train.Trainer` is the import path the CLI and the tests use.
"""
