"""Measuring catchat, apart from the product: nothing here is imported by the trainer.

    timing.py      medians of timed calls and of recorded sequences
    bench.py       catchat's own figures: a step's throughput, its split, memory, how the sweeps
                   run, the --profile of the micro-batch's dispatch groups
    torch_twin.py  the PyTorch twin of the model (`torch_model`) and its throughput (`bench_torch`)
    tuner.py       tile tuning: every candidate at the config's shapes, timed and checked, the
                   fastest cached for catchat/vk/tune.py
    bench_command.py  `catchat bench`: runs them, prints the tables, writes the JSON
"""
