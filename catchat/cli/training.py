"""`catchat train`: one process, or one rank of a data-parallel run under mpiexec."""

from __future__ import annotations

import os

import click

from catchat.cli import ALLOW_UNVERIFIED_OPTION, PRECISION_OPTION, cli, console, with_precision


# ------------------------------------------------------------------------------ train / eval
@cli.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config key.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Where the run lives (default runs/<config name>).")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[CKPT]",
              help="Continue the run in --run-dir (or from the checkpoint given) with the config it recorded; "
                   "--set on the resume changes keys (each change is printed and logged).")
@click.option("--use-config-file", is_flag=True,
              help="On --resume: adopt the keys edited in CONFIG since the run last read it (without it an "
                   "edited CONFIG is refused).")
@click.option("--stop-after-steps", type=click.IntRange(min=1), help="Stop after N steps (the schedule is unchanged).")
@click.option("--time-budget", "time_budget", type=click.FloatRange(min=0.0, min_open=True), metavar="SECONDS",
              help="Train for this wall-clock time, start-up included: warmup, stable and cooldown run on elapsed "
                   "time, the last step uses schedule.lr_min, and a checkpoint and an eval end the run within the "
                   "budget. Sets train.time_budget_s and replaces the config's train.total_steps / train.cycles "
                   "(a --set of one of them keeps it as a step cap). A resumed run keeps its remaining budget.")
@PRECISION_OPTION
@ALLOW_UNVERIFIED_OPTION
@click.option("--device", "device", default=None, metavar="INDEX|NAME[,...]",
              help="Vulkan device by index or name substring (env CATCHAT_DEVICE). Under mpiexec: a comma list "
                   "gives rank r's device as entry (local rank mod its length); default: local rank modulo the GPUs.")
@click.option("--distributed", is_flag=True,
              help="Use MPI even when no launcher is seen in the environment (mpiexec is detected by itself).")
def train(config_path, overrides, run_dir, resume, use_config_file, stop_after_steps, time_budget, precision,
          allow_unverified, device, distributed):
    """Train a model from a TOML CONFIG on the Vulkan device (on N ranks: `mpiexec -n N catchat train CONFIG`)."""
    from contextlib import nullcontext
    from pathlib import Path

    from catchat import config as cfgmod
    from catchat import distributed as dist
    from catchat.run.budget import process_start
    from catchat.train import Trainer
    from catchat.training.plan import ConfigSource
    from catchat.training.progress import TrainReporter
    from catchat.vk.device import ENV_DEVICE, open_device

    overrides = cfgmod.budget_overrides(time_budget, overrides)
    source = ConfigSource.read(config_path, with_precision(overrides, precision), use_config_file)
    cfg = source.fresh() if resume is None else None  # a resume starts from the run's recorded config
    name = Path(config_path).stem
    run_dir = Path(run_dir or Path("runs") / name)
    comm = dist.init(force=distributed)  # None for a single process: MPI is not even imported
    if comm is None:
        dev = open_device(device)
        console.print(f"device: {dev.info.name}; run: {run_dir}", highlight=False)
    else:
        from catchat.vk.probe import probe_devices

        selector = device if device is not None else os.environ.get(ENV_DEVICE)
        dev = open_device(dist.device_selector(selector, comm.local_rank, probe_devices()))
        where = comm.allgather_obj(f"{comm.host}: {dev.info.name} (device {dev.info.index})", "listing the devices")
        if comm.is_root:
            console.print(f"{comm.size} ranks; run: {run_dir}", highlight=False)
            for r, line in enumerate(where):
                console.print(f"  rank {r}: {line}", highlight=False)
    reporting = TrainReporter(console) if comm is None or comm.is_root else nullcontext(None)
    with reporting as reporter, Trainer(cfg, run_dir, dev, config_name=name, resume=resume, reporter=reporter,
                                        allow_unverified=allow_unverified, clock_origin=process_start(),
                                        comm=comm, source=source) as trainer:
        reason = trainer.run(stop_after_steps)
    if comm is not None:
        comm.finish()
    if reason.startswith("interrupted"):
        raise SystemExit(130)
