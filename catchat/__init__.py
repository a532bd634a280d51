"""catchat: character-level GRU language models trained on Vulkan compute through Kompute.

The package's first lines guard the `catchat` command's start-up against Ctrl-C: until the command's
own handlers take over (catchat.cli.main), a SIGINT ends the process with one line "interrupted" and
exit code 130, never a KeyboardInterrupt traceback from whichever import it cut short. Only the
command's process is guarded (the console script, `python -m catchat`, `python -m catchat.cli`); a
program that imports catchat as a library keeps its own Ctrl-C. docs/reliability.md says what
happens at every moment, the interpreter's own start included (the launcher of
tools/install-launcher.sh covers that).
"""

import os as _os
import signal as _signal
import sys as _sys

# The launcher (tools/install-launcher.sh) starts Python with SIGINT blocked ("blocked": a Ctrl-C during
# the interpreter's own start, before any catchat line, stays pending until hold_sigint takes it) or,
# where env cannot block, ignored ("ignored": such a Ctrl-C is lost). This says that it was the
# launcher's doing, not the user's (`nohup`, `cmd &` in a script: SIGINT ignored stays so).
LAUNCHER_HELD_SIGINT = "CATCHAT_LAUNCHER_HELD_SIGINT"

_sigint_before = None  # the handler start-up's replaced (None: start-up's is not installed)


def exit_interrupted() -> None:
    """End the process at once with the line and the code any interrupted command gives."""
    try:
        _os.write(2, b"interrupted\n")
    except OSError:  # stderr gone: the exit code says it
        pass
    _os._exit(130)


def _interrupted_while_starting(_signum, _frame) -> None:
    """Ctrl-C while the command starts: nothing has been done yet, so it ends at once."""
    exit_interrupted()


def hold_sigint() -> bool:
    """Install the start-up handler where a Ctrl-C would raise KeyboardInterrupt (or where the launcher
    held SIGINT for the interpreter's start, then let it through); True when this call installed it."""
    global _sigint_before
    held = _os.environ.pop(LAUNCHER_HELD_SIGINT, "")
    installed = False
    try:
        now = _signal.getsignal(_signal.SIGINT)
        if _sigint_before is None and (now is _signal.default_int_handler
                                       or (held == "ignored" and now == _signal.SIG_IGN)):
            _signal.signal(_signal.SIGINT, _interrupted_while_starting)
            _sigint_before = _signal.default_int_handler  # what Python itself would have installed
            installed = True
        if held == "blocked" and hasattr(_signal, "pthread_sigmask"):
            # a Ctrl-C that came while Python started is delivered now, to the handler above
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGINT})
    except ValueError:  # imported from a thread other than the main one: signals are not ours
        pass
    return installed


def release_sigint() -> None:
    """From here a Ctrl-C raises KeyboardInterrupt again (catchat.cli.main turns it into "interrupted",
    exit 130). Does nothing where start-up's handler is not installed."""
    global _sigint_before
    if _sigint_before is not None and _signal.getsignal(_signal.SIGINT) is _interrupted_while_starting:
        _signal.signal(_signal.SIGINT, _sigint_before)
    _sigint_before = None


def _command_process() -> bool:
    """Whether this process runs the `catchat` command: the console script (argv[0] named catchat)
    or `python [options] -m catchat[.cli]` (while `-m` imports the package, argv[0] is "-m")."""
    if _os.path.basename(_sys.argv[0] if _sys.argv else "") == "catchat":
        return True
    if not _sys.argv or _sys.argv[0] != "-m":
        return False
    argv = list(getattr(_sys, "orig_argv", ()))
    for i, arg in enumerate(argv[1:], 1):
        if arg.startswith("-m"):
            module = arg[2:] or (argv[i + 1] if i + 1 < len(argv) else "")
            return module in ("catchat", "catchat.cli")
    return False


# `CATCHAT_CRASH_AT=POINT[#K][:SIGNAL]` (catchat/run/faults.py): SIGKILL (or SIGNAL: INT, TERM) this
# process the K-th time it reaches crash_point(POINT). Defined here, without imports, so that start-up
# has points too: start.package (this module, the handler in place), start.imported (catchat.cli's
# imports done), start.main (main() before the command's own handlers).
CRASH_ENV = "CATCHAT_CRASH_AT"
_crash_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Kill this process here if $CATCHAT_CRASH_AT names this point (and this is the K-th hit)."""
    want = _os.environ.get(CRASH_ENV)
    if not want:
        return
    want, _, sig = want.partition(":")
    point, _, k = want.partition("#")
    if point != name:
        return
    _crash_hits[name] = _crash_hits.get(name, 0) + 1
    if _crash_hits[name] == int(k or 1):
        _os.kill(_os.getpid(), getattr(_signal, f"SIG{sig or 'KILL'}"))


if _command_process():
    hold_sigint()
    crash_point("start.package")

__version__ = "0.1.0"
