"""The `catchat` command line. Every user-fixable failure prints one or two lines, never a traceback.

This module holds the command group, the options several commands share, the error handling of
`main`; the commands live by stage in device.py (devices, doctor, parity, bench), data.py (corpus),
training.py (train), generation.py (sample, talk, chat) and analysis.py (eval, plot, landscape,
inspect, scan, watch), imported at the bottom so that each registers itself on `cli`."""

from __future__ import annotations

import sys
import traceback

import click
from rich.markup import escape

from catchat import __version__, distributed
from catchat.console import make_console
from catchat.errors import CatchatError

# At a terminal: its width. Through a pipe or in CI: every line and table row whole (catchat/console.py).
console = make_console()
err_console = make_console(stderr=True)

ALLOW_UNVERIFIED_OPTION = click.option(
    "--allow-unverified", is_flag=True,
    help="Load a checkpoint whose state.json records no sha256 of its files (a warning says so).")
PRECISION_OPTION = click.option(
    "--precision", default=None, metavar="fp32|fp16",
    help="Set train.precision: fp16 rounds the GEMMs' operands to float16 (float32 sums, loss scaling), "
         "on tensor cores where the GPU has them, and there the recurrent sweeps' products too; an unknown "
         "value is an error.")
DEVICE_OPTION = click.option("--device", "device", default=None, metavar="INDEX|NAME",
                             help="Vulkan device by index or name substring (env CATCHAT_DEVICE).")


def with_precision(overrides, precision: str | None) -> tuple:
    """--set overrides, then --precision's (which wins); the config's checks judge its value."""
    return tuple(overrides) + (() if precision is None else (f"train.precision={precision}",))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="catchat")
def cli():
    """catchat: character-level GRU language models trained on Vulkan compute."""


def _warn(message: str) -> None:
    err_console.print(escape(message), highlight=False, soft_wrap=True)


def _fail(message: str, hint: str | None, exit_code: int, label: str = "error"):
    """One error line (and a fix line): never wrapped, brackets in it printed as they are. One of
    several ranks then tells the others and ends at once (distributed.end_ranks)."""
    err_console.print(f"[red]{label}:[/red] " + escape(message), highlight=False, soft_wrap=True)
    if hint:
        err_console.print("  fix: " + escape(hint), highlight=False, soft_wrap=True)
    distributed.end_ranks(exit_code, message)
    sys.exit(exit_code)


def main(argv=None):
    """Console-script entry point: run the CLI, turning CatchatError into a short message + exit code."""
    try:
        cli.main(args=argv, prog_name="catchat", standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.UsageError as e:  # an unknown flag or command, a bad option value: one line, exit 2
        _fail(e.format_message(), f"`{e.ctx.command_path if e.ctx else 'catchat'} --help` lists what it takes",
              e.exit_code)
    except click.ClickException as e:
        _fail(e.format_message(), None, e.exit_code)
    except CatchatError as e:
        _fail(e.message, e.hint, e.exit_code, e.label)
    except OSError as e:  # disk full, permissions, a file gone: the system's words, not a traceback
        _fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
              "check free disk space, the path and its permissions", 1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as e:  # a bug: its traceback; one of several ranks ends the others with it
        traceback.print_exc()
        distributed.end_ranks(1, f"a bug ({type(e).__name__}: {e})")
        sys.exit(1)



from catchat.cli import analysis, data, device, generation, training  # noqa: E402, F401 (they register the commands)
