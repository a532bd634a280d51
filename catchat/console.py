"""The consoles and tables every command prints through.

At a terminal, rich lays tables out at the terminal's width; a cell that does not fit folds onto a
second line of its row instead of being cut with "…". Anywhere else (a pipe, a file, CI) there is no
width to fit: lines are never wrapped and every table row is printed whole on one line, so a log
keeps each row and `grep`/`cut` see whole cells.

Output is never a reason to stop: when the reader of stdout or stderr goes away (`| head`, a pager
quit, a log shipper gone: EPIPE; a closed SSH terminal: EIO), the console goes silent and the
command goes on (docs/reliability.md). rich's own answer, SystemExit(1), would end a training run
past its handlers, without its final checkpoint.
"""

from __future__ import annotations

import errno
import os
import sys

from rich.console import Console, ConsoleDimensions
from rich.table import Column, Table

# The width a console pretends to have when it does not write to a terminal: wider than any row
# catchat prints, and nothing catchat prints pads itself to the console's width.
LOG_WIDTH = 100_000


def writes_to_terminal(console: Console) -> bool:
    """Whether the console's file is a real terminal (not rich's is_terminal, which FORCE_COLOR and
    TTY_COMPATIBLE can turn on in CI, where there is still no screen width to fit)."""
    isatty = getattr(console.file, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed file
        return False


class CatchatConsole(Console):
    """A rich Console whose width, when it does not write to a terminal, is LOG_WIDTH (unless a width
    is given): COLUMNS, which rich would take, says nothing about a pipe or a log file.

    Decided at each print from the file written then (sys.stdout can be replaced after start-up)."""

    def __init__(self, *args, width: int | None = None, **kwargs):
        super().__init__(*args, width=width, **kwargs)
        if width is None:
            self._width = None  # rich set it from COLUMNS; at a terminal `size` still reads COLUMNS

    @property
    def size(self) -> ConsoleDimensions:
        dims = Console.size.fget(self)
        if self._width is None and not writes_to_terminal(self):
            return ConsoleDimensions(LOG_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except OSError as exc:  # rich passes on all but BrokenPipeError: a hung-up terminal says EIO
            if exc.errno not in GONE_ERRNOS:
                raise
            self.on_broken_pipe()

    def on_broken_pipe(self) -> None:
        """The reader is gone: print nothing more (quiet), and point the stream's descriptor at
        /dev/null so that what Python still holds for it, and its flush at exit, go nowhere
        instead of printing "Exception ignored ... BrokenPipeError" (rich's own would exit 1)."""
        self.quiet = True
        del self._buffer[:]
        silence(self.file)


# A write to a pipe whose reader closed (EPIPE: Python ignores SIGPIPE) or to a terminal that hung up.
GONE_ERRNOS = (errno.EPIPE, errno.EIO, errno.ENXIO)


def silence(stream) -> bool:
    """Point `stream`'s file descriptor at /dev/null (a dead pipe or terminal): later writes and the
    flush at exit succeed and go nowhere. False for a stream with no descriptor (nothing to do)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
    return True


def flush_or_silence() -> None:
    """At exit: flush stdout and stderr; one whose reader went away is silenced instead, so that
    Python's own flush at exit finds nothing to complain about (and does not turn the exit code
    into 120)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except OSError as exc:
            if exc.errno not in GONE_ERRNOS:
                raise
            if silence(stream):
                try:
                    stream.flush()  # what it held goes to /dev/null now
                except (OSError, ValueError):
                    pass
        except ValueError:  # a closed file object
            pass


def make_console(stderr: bool = False, **kwargs) -> CatchatConsole:
    """The console for stdout (or stderr): terminal width at a terminal, whole lines anywhere else."""
    return CatchatConsole(stderr=stderr, **kwargs)


def new_table(*headers: str, title: str | None = None) -> Table:
    """A table whose cells are never cut: at a narrow terminal a long cell folds within its row;
    through a pipe (see CatchatConsole) each row is one line."""
    return Table(*(Column(h, overflow="fold") for h in headers), title=title)
