"""Analysis: reading runs and models, and measuring catchat, apart from the product: nothing here is
imported by the trainer.

Runs and models:
    plot.py        a run's summary, PNG plots and HTML page (`catchat plot`)
    scan/          the anomaly scan of a run's telemetry (`catchat scan`)
    landscape/     loss landscapes of a checkpoint, GPU or numpy (`catchat landscape`)
    weights.py     a checkpoint's weight statistics, numpy only (`catchat inspect`)

Measuring catchat (`catchat bench`):
    timing.py      medians of timed calls and of recorded sequences
    bench.py       catchat's own figures: a step's throughput, its split, memory, how the sweeps
                   run, the --profile of the micro-batch's dispatch groups
    torch_twin.py  the PyTorch twin of the model (`torch_model`) and its throughput (`bench_torch`)
    tuner.py       tile tuning: every candidate at the config's shapes, timed and checked, the
                   fastest cached for catchat/vk/tune.py
    bench_command.py  `catchat bench`: runs them, prints the tables, writes the JSON

The speedrun's PyTorch row (tools/speedrun.py --torch, docs/speedrun.md "The PyTorch row"):
    torch_train.py    catchat's recipe trained in PyTorch: data, schedule, time budget, evals, run files
    torch_program.py  its model and step on torch_twin's modules (cuDNN GRU in segments cut at resets)
"""
