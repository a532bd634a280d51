"""train.precision and fp16's dynamic loss scaling (docs/training.md "Mixed precision").

At "fp16" every GEMM of the program multiplies its operands rounded to float16 (float32 sums); all
buffers stay float32. Small gradients would round to zero in a float16 operand, so the loss gradient
is multiplied by a loss scale S and the weight gradients by 1/S before the grad norm (both exact: S
is a power of two). Too large an S overflows a float16 operand (> 65504 is inf): the step's gradient
is not finite, the optimizer skips it, and S halves. This is PyTorch's GradScaler algorithm:
    start S = 2**16; an overflow step: S /= 2 (not below 1); GROWTH_INTERVAL applied steps in a
    row: S *= 2.
S and the count of applied steps since the last change are training state (checkpointed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRECISIONS = ("fp32", "fp16")
REFUSED = {"bf16": "Debian 12's glslang has no bfloat16 cooperative matrices, so bf16 would run nowhere on "
                   "tensor cores; use fp16 (with loss scaling)"}
INIT_SCALE = 2.0**16
MIN_SCALE = 1.0
GROWTH_INTERVAL = 2000


@dataclass
class LossScaler:
    """fp16's loss scale S and the applied steps since it last changed (GradScaler's growth tracker)."""

    scale: float = INIT_SCALE
    good_steps: int = 0

    def applied(self) -> float | None:
        """After an applied step: the new S when it doubles now, else None."""
        self.good_steps += 1
        if self.good_steps < GROWTH_INTERVAL:
            return None
        self.scale *= 2.0
        self.good_steps = 0
        return self.scale

    def overflow(self) -> bool:
        """After a step skipped for a non-finite gradient: halve S; False when S is already at the
        floor (the overflow is then not the scale's doing: the model itself gives inf or NaN)."""
        self.good_steps = 0
        if self.scale <= MIN_SCALE:
            return False
        self.scale = max(self.scale / 2.0, MIN_SCALE)
        return True

    def state(self) -> dict:
        """The checkpoint's "loss_scale" entry."""
        return {"scale": self.scale, "good_steps": self.good_steps}

    @classmethod
    def from_state(cls, state: dict | None) -> LossScaler:
        """From a checkpoint's entry (validated by `valid_state`); None (an fp32 or older checkpoint):
        a fresh scaler."""
        if state is None:
            return cls()
        return cls(float(state["scale"]), int(state["good_steps"]))


def valid_state(state) -> str | None:
    """Why a checkpoint's "loss_scale" entry is unusable, or None."""
    if not isinstance(state, dict):
        return "must be a table"
    s, n = state.get("scale"), state.get("good_steps")
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not (MIN_SCALE <= s < 2.0**127):
        return f"scale must be a number in [1, 2**127), got {s!r}"
    if math.frexp(float(s))[0] != 0.5:
        return f"scale must be a power of two, got {s!r}"
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < GROWTH_INTERVAL:
        return f"good_steps must be a whole number in [0, {GROWTH_INTERVAL}), got {n!r}"
    return None
