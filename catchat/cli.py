"""The `catchat` command line. Every user-fixable failure prints one or two lines, never a traceback."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from catchat import __version__
from catchat.errors import CatchatError

console = Console()
err_console = Console(stderr=True)

DEVICE_OPTION = click.option("--device", "device", default=None, metavar="INDEX|NAME",
                             help="Vulkan device by index or name substring (env CATCHAT_DEVICE).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="catchat")
def cli():
    """catchat: character-level GRU language models trained on Vulkan compute."""


@cli.command()
def devices():
    """List Vulkan devices with type, driver and the limits catchat sizes kernels by."""
    from catchat.vk.probe import probe_devices

    table = Table("index", "name", "type", "driver", "Vulkan", "max buffer", "shared mem", "subgroup")
    for d in probe_devices():
        table.add_row(str(d.index), d.name, d.type, d.driver, d.api_version,
                      f"{d.max_storage_buffer_bytes / 2**20:.0f} MiB", f"{d.max_shared_memory_bytes // 1024} KiB",
                      str(d.subgroup_size))
    console.print(table)


@cli.command()
def doctor():
    """Check numpy, the Vulkan loader, kp, glslc, and run a shader on every device against numpy."""
    from catchat.doctor import checks

    failed = False
    for c in checks():
        mark = "[green]ok[/green]  " if c.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {c.what}: {c.detail}")
        if not c.ok:
            failed = True
            if c.fix:
                console.print(f"       fix: {c.fix}")
    if failed:
        raise SystemExit(1)
    console.print("all checks passed")


@cli.command()
@DEVICE_OPTION
def parity(device):
    """Run every kernel and the whole model against numpy on a device; exit 1 on any mismatch."""
    from catchat.parity import timed_run
    from catchat.vk.device import open_device

    dev = open_device(device)
    console.print(f"device: {dev.info.name} ({dev.info.type}, {dev.info.driver})")
    results, seconds = timed_run(dev)
    table = Table("group", "kernel", "shape", "max abs err", "max rel err", "tolerance", "result")
    for group, r in results:
        table.add_row(group, r.kernel, r.shape, f"{r.max_abs:.2e}", f"{r.max_rel:.2e}",
                      f"{r.atol:g} + {r.rtol:g}*|ref|", "[green]pass[/green]" if r.ok else "[red]FAIL[/red]")
    console.print(table)
    failed = sum(not r.ok for _, r in results)
    console.print(f"{len(results) - failed} passed, {failed} failed in {seconds:.1f} s")
    if failed:
        raise SystemExit(1)


def main(argv=None):
    """Console-script entry point: run the CLI, turning CatchatError into a short message + exit code."""
    try:
        cli.main(args=argv, prog_name="catchat", standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except CatchatError as e:
        err_console.print(f"[red]error:[/red] {e.message}", highlight=False)
        if e.hint:
            err_console.print(f"  fix: {e.hint}", highlight=False)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
