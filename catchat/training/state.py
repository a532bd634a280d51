"""Where a run stands between two steps: the data position, the step counters, fp16's loss scale.

Units (lesson 4): `global_step` counts optimizer steps taken (applied or skipped: the data and the
schedule move on either way; `applied_steps` is Adam's t), the cursor's `seqs` counts lane-windows
consumed, its `cycle` the passes over the train split. A checkpoint named N holds the model after
N steps (lesson 3). Every part of the trainer reads this one object; the loop and the parts it
runs (the step, evals, checkpoints) move it on.
"""

from __future__ import annotations

from dataclasses import dataclass

from catchat.data.lanes import DataCursor
from catchat.precision import LossScaler


@dataclass
class RunState:
    cursor: DataCursor  # the next window of every lane (lanes.py); seqs and cycle
    global_step: int = 0  # optimizer steps taken, applied or skipped (lesson 3)
    applied_steps: int = 0  # steps whose update was applied: Adam's t
    scaler: LossScaler | None = None  # fp16's loss scale (train.precision); None at fp32
    last_checkpoint_step: int = -1  # the step of the last checkpoint this process wrote (or resumed from)
    last_eval_step: int = -1
    consecutive_skips: int = 0  # skipped steps in a row (train.max_consecutive_skips stops the run)
