"""Lanes in order -> each optimizer step's micro-batches (the first part of the loop).

Stateful truncated BPTT needs contiguous data (lessons 5 and 6): the lanes serve their windows in
order, cycle after cycle, and a step's data is a function of the cursor and the step alone (prefix
dropout is seeded by the step), so a resumed run is fed exactly what a straight one was.
"""

from __future__ import annotations

from catchat import config as cfgmod
from catchat.data.lanes import DataCursor, Lanes, prefix_dropout
from catchat.rng import step_seed
from catchat.run.schedule import tf_at


class Feed:
    """The train lanes' windows, a step's micro-batches at a time, the next step's made ahead."""

    def __init__(self, lanes: Lanes, cfg: cfgmod.Config):
        self.lanes, self.cfg = lanes, cfg
        self._next = None  # (cursor, global_step, the step's data): made during the step before

    def step_data(self, cursor: DataCursor, global_step: int) -> tuple[list, DataCursor]:
        """The micro-batches [(tokens, targets, resets)] of optimizer step global_step + 1 from the
        lanes at `cursor` (prefix dropout applied), and the cursor after them: a function of its
        arguments alone."""
        cfg = self.cfg
        windows, next_cursor = self.lanes.take(cursor, cfg.data.micro_batches)
        batches = [(w.tokens, *prefix_dropout(w.targets, w.resets, cfg.data.prefix_dropout,
                                               cfg.data.prefix_max_fraction, step_seed(cfg.train.seed, global_step, k)))
                   for k, w in enumerate(windows)]
        return batches, next_cursor

    def prepare_next(self, cursor: DataCursor, global_step: int) -> None:
        """The next step's data, made while this step runs on the GPU (~1-3 ms of host time per step
        otherwise spent between steps). Keyed by (cursor, step): `take` uses it only if they match,
        so it cannot change what is trained; should making it fail, `take` makes it again and fails
        there, where the error belongs."""
        try:
            self._next = (cursor, global_step, self.step_data(cursor, global_step))
        except Exception:  # noqa: BLE001 - speculative work: the next step repeats it and reports
            self._next = None

    def take(self, cursor: DataCursor, global_step: int) -> tuple[list, DataCursor]:
        """Step global_step + 1's data (as `step_data`): the one made ahead if it is that step's."""
        ready, self._next = self._next, None
        if ready is not None and ready[:2] == (cursor, global_step):
            return ready[2]  # prepared while the previous step ran on the GPU
        return self.step_data(cursor, global_step)

    def tf_at(self, cursor: DataCursor) -> float:
        """Teacher forcing for the step at `cursor`: a pure function of the cycles completed (lesson 2)."""
        return tf_at(cursor.seqs / max(self.lanes.seqs_per_cycle, 1), self.cfg)
