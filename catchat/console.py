"""The consoles and tables every command prints through.

At a terminal, rich lays tables out at the terminal's width; a cell that does not fit folds onto a
second line of its row instead of being cut with "…". Anywhere else (a pipe, a file, CI) there is no
width to fit: lines are never wrapped and every table row is printed whole on one line, so a log
keeps each row and `grep`/`cut` see whole cells.
"""

from __future__ import annotations

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


def make_console(stderr: bool = False, **kwargs) -> CatchatConsole:
    """The console for stdout (or stderr): terminal width at a terminal, whole lines anywhere else."""
    return CatchatConsole(stderr=stderr, **kwargs)


def new_table(*headers: str, title: str | None = None) -> Table:
    """A table whose cells are never cut: at a narrow terminal a long cell folds within its row;
    through a pipe (see CatchatConsole) each row is one line."""
    return Table(*(Column(h, overflow="fold") for h in headers), title=title)
