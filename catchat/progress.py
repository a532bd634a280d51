"""Progress of the long commands that are not training (eval, landscape, corpus build): how far,
how long so far and how long to go, on stderr, so that stdout keeps only the results (`--json`
stays one clean JSON object).

At a terminal a rich bar (done/total, elapsed, eta) that disappears when the work ends. Anywhere
else (a pipe, a log, CI) plain lines, once the work has taken PLAIN_AFTER_S (work done sooner, and
its error messages, stay free of them): one then, one each time another 1/PLAIN_SHARE of the
work is done, one at least every PLAIN_EVERY_S seconds while it goes on, and one at the end:
    eval: 3/12 windows (25%), 0:45 elapsed, eta 2:15
Lines are printed as units of work finish (a unit is a window, an evaluation, a MiB read), so a
slow unit delays the next line. (Training has its own reporter, catchat/training/progress.py.)

    with Progress(err_console, "eval", "windows") as bar:
        bar.start(total)          # when the total is known
        bar.advance()             # after each unit of work
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.text import Text

from catchat.console import writes_to_terminal

PLAIN_AFTER_S = 5.0  # plain lines only for work that has lasted this long (a quick command prints none)
PLAIN_SHARE = 10  # then a plain line each time another tenth of the work is done
PLAIN_EVERY_S = 30.0  # and one at least this often (checked as work is done) while units are slow

T = TypeVar("T")


def plain_line_due(done: int, total: int, last_done: int, last_s: float, now: float, share: int) -> bool:
    """Whether a piped progress line is due (one policy for every command's plain lines): at the end
    (once), each time the work crosses another 1/share of `total` since the line that showed
    `last_done`, or PLAIN_EVERY_S after that line (`last_s`) while units are slow."""
    if done >= total:
        return done != last_done
    step = max(1, total // share)
    return done // step > last_done // step or now - last_s >= PLAIN_EVERY_S


def done_of(done: float, total: float | None, unit: str) -> str:
    """'3/12 windows', or '12.0/190.7 MiB' when the unit is bytes."""
    if unit == "bytes":
        return f"{done / 2**20:,.1f}/" + (f"{total / 2**20:,.1f} MiB" if total is not None else "? MiB")
    return f"{int(done):,}/" + (f"{int(total):,}" if total is not None else "?") + f" {unit}"


def clock(seconds: float, hours: bool = False) -> str:
    """'0:45', '12:03', '1:02:03' (hours: always H:MM:SS, '0:00:45', as training's lines print it)."""
    s = int(max(0.0, seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h or hours else f"{m}:{s % 60:02d}"


class _DoneOf(ProgressColumn):
    """'3/12 windows' or '12.0/190.7 MiB' in the rich bar."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task) -> Text:
        return Text(done_of(task.completed, task.total, self.unit))


class Progress:
    """A bar at a terminal, plain lines elsewhere; `start(total)`, then `advance(n)` as work is done.
    A context manager: leaving it ends the bar (the final plain line is printed by the last advance)."""

    def __init__(self, console: Console, label: str, unit: str, *, live: bool | None = None,
                 now: Callable[[], float] = time.monotonic):
        self.console, self.label, self.unit, self.now = console, label, unit, now
        self.live = writes_to_terminal(console) if live is None else live
        self.total = 0
        self.done = 0
        self.t0 = 0.0
        self._line_done = 0  # the amount done that the last plain line showed
        self._last_line_s = 0.0
        self._bar: RichProgress | None = None
        self._task = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self, total: int) -> None:
        """The work begins: `total` units (0: nothing to show)."""
        self.total, self.done, self._line_done, self.t0 = int(total), 0, 0, self.now()
        self._last_line_s = self.t0
        if self.total <= 0:
            return
        if self.live:
            self._bar = RichProgress(TextColumn(f"[bold]{self.label}"), BarColumn(), _DoneOf(self.unit),
                                     TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                     console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)

    def advance(self, n: int = 1) -> None:
        """`n` more units done."""
        if self.total <= 0:
            return
        self.done = min(self.total, self.done + n)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
            return
        t = self.now()
        if t - self.t0 < PLAIN_AFTER_S or self.done == self._line_done:
            return
        if not self._line_done or plain_line_due(self.done, self.total, self._line_done, self._last_line_s, t,
                                                 PLAIN_SHARE):
            self._line_done = self.done
            self._line(self.status(t))

    def track(self, items: Iterable[T]) -> Iterator[T]:
        """`items`, one unit advanced as each is finished with (when the next is asked for, so an
        item counts once the work done with it is over)."""
        for item in items:
            yield item
            self.advance()

    def status(self, t: float | None = None) -> str:
        """'eval: 3/12 windows (25%), 0:45 elapsed, eta 2:15' (the eta from the rate so far)."""
        elapsed = (self.now() if t is None else t) - self.t0
        line = (f"{self.label}: {done_of(self.done, self.total, self.unit)} ({self.done / self.total:.0%}), "
                f"{clock(elapsed)} elapsed")
        if self.done < self.total:
            line += f", eta {clock(elapsed / self.done * (self.total - self.done))}" if self.done else ", eta ?"
        return line

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _line(self, text: str) -> None:
        self._last_line_s = self.now()
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
