"""Ctrl-C and SIGTERM while a run trains: the first stops the run after the step in flight (with a
final checkpoint), a second stops it at once (KeyboardInterrupt: no final checkpoint). SIGHUP (a closed
terminal or SSH session) is routed to the same handler by catchat/training/loop.py while the run
trains, unless the run was started with it ignored (nohup)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class StopSignals:
    """The signal that asked this process to stop (`caught`, None until one came)."""

    def __init__(self, report):
        self.report = report
        self.caught: str | None = None

    def handle(self, signum, _frame) -> None:
        if self.caught is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.caught = signal.Signals(signum).name
        # Said from a thread of its own, not here: the handler runs on the main thread wherever it was,
        # perhaps inside the progress bar's lock while the bar's refresh thread holds the console's and
        # waits for that one; printing here would then wait forever (a hung-up terminal's SIGHUP did).
        threading.Thread(target=self.report, args=("stopping",), kwargs={"signal": self.caught},
                         name="catchat-stopping", daemon=True).start()

    @contextmanager
    def installed(self):
        """SIGINT and SIGTERM come here while the block runs; the old handlers are back after it."""
        old = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, h in old.items():
                signal.signal(s, h)
