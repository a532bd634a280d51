"""The device commands: `devices`, `doctor`, `parity` (every kernel against numpy), `bench`."""

from __future__ import annotations

import click

from catchat.cli import DEVICE_OPTION, PRECISION_OPTION, cli, console, err_console, with_precision
from catchat.console import new_table


@cli.command()
def devices():
    """List Vulkan devices with type, driver and the limits catchat sizes kernels by."""
    from catchat.vk.probe import probe_devices

    table = new_table("index", "name", "type", "driver", "Vulkan", "max buffer", "shared mem", "subgroup", "SMs")
    for d in probe_devices():
        table.add_row(str(d.index), d.name, d.type, d.driver, d.api_version,
                      f"{d.max_storage_buffer_bytes / 2**20:.0f} MiB", f"{d.max_shared_memory_bytes // 1024} KiB",
                      str(d.subgroup_size), str(d.compute_units or "-"))
    console.print(table)

@cli.command()
def doctor():
    """Check numpy, the Vulkan loader, kp, glslc, and run a shader on every device against numpy."""
    from catchat.cli.doctor import checks

    failed = False
    for c in checks():
        mark = "[green]ok[/green]  " if c.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {c.what}: {c.detail}", soft_wrap=True)
        if not c.ok:
            failed = True
            if c.fix:
                console.print(f"       fix: {c.fix}")
    if failed:
        raise SystemExit(1)
    console.print("all checks passed")

@cli.command()
@click.option("--summary", is_flag=True, help="One row per kernel family (worst errors) instead of every check.")
@click.option("--only", multiple=True, metavar="GROUP",
              help="Run only this group's checks (repeatable), e.g. --only gemm after a GEMM shader change.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Also write every check and the totals here (a record for docs/results/).")
@DEVICE_OPTION
def parity(summary, only, json_path, device):
    """Run every kernel and the whole model against numpy on a device; exit 1 on any mismatch."""
    import json
    import sys
    from pathlib import Path

    from catchat.parity import GROUPS, report, summarise, timed_run
    from catchat.vk.device import open_device

    unknown = [g for g in only if g not in GROUPS]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)} is not a parity group; the groups: {', '.join(GROUPS)}",
                                 param_hint="--only")
    dev = open_device(device)
    console.print(f"device: {dev.info.name} ({dev.info.type}, {dev.info.driver})")
    groups = [g for g in GROUPS if not only or g in only]

    def group_done(group, results, seconds):  # on stderr, as each group ends: the table comes at the end
        failed = sum(not r.ok for r in results)
        err_console.print(f"  {group} ({groups.index(group) + 1}/{len(groups)}): {len(results)} checks, "
                          f"{failed} failed, {seconds:.1f} s", highlight=False)

    results, seconds = timed_run(dev, tuple(only), group_done)
    if summary:
        table = new_table("group", "checks", "worst max abs err", "worst max rel err", "result")
        for g in summarise(results):
            table.add_row(g["group"], str(g["checks"]), f"{g['max_abs']:.2e}", f"{g['max_rel']:.2e}",
                          "[green]pass[/green]" if g["failed"] == 0 else f"[red]{g['failed']} FAIL[/red]")
    else:
        table = new_table("group", "kernel", "shape", "max abs err", "max rel err", "tolerance", "result")
        for group, r in results:
            table.add_row(group, r.kernel, r.shape, f"{r.max_abs:.2e}", f"{r.max_rel:.2e}",
                          f"{r.atol:g} + {r.rtol:g}*|ref|", "[green]pass[/green]" if r.ok else "[red]FAIL[/red]")
    console.print(table)
    failed = sum(not r.ok for _, r in results)
    console.print(f"{len(results) - failed} passed, {failed} failed in {seconds:.1f} s")
    if json_path:
        record = report(dev, results, seconds, tuple(only), sys.argv[1:])
        Path(json_path).write_text(json.dumps(record, indent=1) + "\n")
    if failed:
        raise SystemExit(1)

# ------------------------------------------------------------------------------ bench
@cli.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config key.")
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1), help="Timed steps (median).")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0), help="Untimed steps first.")
@click.option("--tf", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Teacher forcing < 1 times the per-timestep (scheduled-sampling) path.")
@click.option("--compare-torch", is_flag=True,
              help="Also run the model in PyTorch here: FP32 (TF32 off), TF32, AMP fp16 and AMP bf16 (needs CUDA).")
@click.option("--profile", "want_profile", is_flag=True,
              help="Also time each group of the micro-batch's dispatches (sweeps, GEMMs, the rest).")
@click.option("--tune", "want_tune", is_flag=True,
              help="First measure the tile candidates at the config's shapes and cache the fastest for this device.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the results here.")
@PRECISION_OPTION
@DEVICE_OPTION
def bench(config_path, overrides, steps, warmup, tf, compare_torch, want_profile, want_tune, json_path, precision,
          device):
    """Training and evaluation throughput of CONFIG on this GPU (docs/benchmarks.md)."""
    from catchat.analysis.bench_command import run_command

    run_command(config_path, with_precision(overrides, precision), steps=steps, warmup=warmup, tf=tf,
                compare_torch=compare_torch, want_profile=want_profile, want_tune=want_tune, json_path=json_path,
                device=device, console=console, err_console=err_console)
