"""The `catchat` command line. Every user-fixable failure prints one or two lines, never a traceback.

This module holds the command group, the options several commands share, the error handling of
`main`; the commands live by stage in device.py (devices, doctor, parity, bench), data.py (corpus),
training.py (train), generation.py (sample, talk, chat) and analysis.py (eval, plot, landscape,
inspect, scan, watch), imported at the bottom so that each registers itself on `cli`."""

from __future__ import annotations

import signal
import sys

import catchat

# Ctrl-C during the imports below (the first ~0.15 s of every command) ends the process with one line,
# "interrupted", exit 130 (catchat/__init__.py). The command's own process is guarded from the package's
# first line until main() takes over; any other importer (a test running main()) from here to the end of
# this module, which then puts its Ctrl-C back.
_HELD_HERE = catchat.hold_sigint()

import traceback  # noqa: E402

import click  # noqa: E402
from rich.markup import escape  # noqa: E402

from catchat import __version__, distributed  # noqa: E402
from catchat.console import flush_or_silence, make_console  # noqa: E402
from catchat.errors import CatchatError  # noqa: E402

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
GEN_PRECISION_OPTION = click.option(
    "--precision", "precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
    help="fp16: the prompt's forward and the decode step multiply float16 operands with float32 sums, the "
         "decode step's layers on tensor cores where the GPU has them (docs/generation.md); fp32: float32 "
         "throughout.")
DEVICE_OPTION = click.option("--device", "device", default=None, metavar="INDEX|NAME",
                             help="Vulkan device by index or name substring (env CATCHAT_DEVICE).")


def with_precision(overrides, precision: str | None) -> tuple:
    """--set overrides, then --precision's (which wins); the config's checks judge its value."""
    return tuple(overrides) + (() if precision is None else (f"train.precision={precision}",))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="catchat")
def cli():
    """catchat: character-level GRU language models trained on Vulkan compute."""
    from catchat.environment import unknown_lines

    if click.get_current_context().invoked_subcommand != "doctor":  # doctor has a check of its own
        for line in unknown_lines():  # a misspelt switch would otherwise change nothing, silently
            _warn(f"warning: {line}")


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
    """Console-script entry point: run the CLI, turning CatchatError into a short message + exit code.

    argv None: the process's own command line (the `catchat` script, `python -m catchat`), whose end
    is this function's: once the command is over (its final checkpoint written), a Ctrl-C is
    ignored, so that one pressed while the interpreter shuts down (joining threads in
    threading._shutdown) prints no traceback. A list: a caller's (tests), whose signals stay as they
    are."""
    own_process = argv is None
    if own_process:
        sys.unraisablehook = _interrupt_again
    try:
        catchat.crash_point("start.main")
        catchat.release_sigint()  # the command's process: start-up's handler gives way inside this try
        _run(argv)
    except KeyboardInterrupt:  # a Ctrl-C while an error was being reported: that report stands
        _ignore_sigint(own_process)  # before sys.exit, not only in finally: a third Ctrl-C cannot land between
        sys.exit(130)
    finally:
        _ignore_sigint(own_process)
        flush_or_silence()  # a reader that went away (`| head`): no "Exception ignored" at exit


def _interrupt_again(unraisable) -> None:
    """A Ctrl-C that lands in a finalizer or a weakref callback cannot be raised there: Python would
    print "Exception ignored in ..." with a traceback and go on, the Ctrl-C lost; a hook cannot raise
    either. So the process ends here as a Ctrl-C during start-up ends it: "interrupted", exit 130.
    What catchat writes is written aside and renamed, so an exit here loses no more than a kill would
    (in training only a second Ctrl-C raises: the run stops at once either way)."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    catchat.exit_interrupted()


def _interrupted(exc: BaseException) -> bool:
    """Whether a Ctrl-C is behind an exception: Python wraps a KeyboardInterrupt raised in some places
    (3.11: RuntimeError "Error calling __set_name__" when it lands while a class body is made)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _ignore_sigint(own_process: bool) -> None:
    if own_process:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread: its signals are not ours to change
            pass


def _run(argv) -> None:
    """The command, each way it can fail turned into its message and exit code."""
    try:
        cli.main(args=argv, prog_name="catchat", standalone_mode=False)
    except click.exceptions.Abort as e:  # click's word for a Ctrl-C inside a command (after an empty line)
        err_console.print("interrupted" if isinstance(e.__cause__, KeyboardInterrupt) else "aborted")
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
        if _interrupted(e):  # not a bug: a Ctrl-C that Python wrapped
            err_console.print("interrupted")
            sys.exit(130)
        traceback.print_exc()
        distributed.end_ranks(1, f"a bug ({type(e).__name__}: {e})")
        sys.exit(1)



from catchat.cli import analysis, data, device, generation, training  # noqa: E402, F401 (they register the commands)

# From here a Ctrl-C raises KeyboardInterrupt again, which main() turns into "interrupted", exit 130
# (the commands' own imports, numpy and the Vulkan bindings, run inside it).
catchat.crash_point("start.imported")
if _HELD_HERE:
    catchat.release_sigint()
