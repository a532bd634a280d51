"""The trainer's import path: `catchat.train.Trainer` (the CLI, the tests). The loop and its parts
live in catchat/training/ (loop.py: the loop; one module per part)."""

from __future__ import annotations

from catchat.run.rundir import RunFiles
from catchat.run.runlog import METRICS_COLUMNS
from catchat.training.loop import TooManySkips, Trainer
from catchat.training.step import step_hyper
from catchat.training.telemetry import memory_mb

__all__ = ["METRICS_COLUMNS", "RunFiles", "TooManySkips", "Trainer", "memory_mb", "step_hyper"]
