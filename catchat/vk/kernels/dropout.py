"""Dropout keep masks from the counter-based RNG (glsl/dropout_mask.comp, glsl/include/dropout.glsl).

The training kernels never read a mask buffer: the embedding and residual/RMSNorm shaders
recompute `dropout_scale(seed, stream, counter, p)` where they need it. This kernel writes the
masks out so parity checks (catchat/parity/dropout.py) can prove the GLSL RNG bit-identical to
catchat.model.reference.
"""

from __future__ import annotations

from catchat import rng
from catchat.vk import slots
from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div


class DropoutMask(Kernel):
    """mask[out_off + i] = keep(seed, stream, i) / (1 - p) or 0, for i < n (float32).

    hyper: uint32 [HP_WORDS] (seed = HP_SEED, p = the float in slot `p_slot`); mask: float32
    tensor holding at least out_off + n floats. Nothing accumulates.
    """

    shader = "dropout_mask"
    WORKGROUP = 64

    def __init__(self, dev: Device, hyper, mask, n: int, stream: int, p_slot: int, out_off: int = 0):
        self.n, self.stream, self.p_slot, self.out_off = int(n), int(stream), int(p_slot), int(out_off)
        if mask.size() < self.out_off + self.n:
            raise ValueError(f"mask buffer holds {mask.size()} floats, needs {self.out_off + self.n}")
        super().__init__(dev, [hyper, mask], [ceil_div(self.n, self.WORKGROUP)], spec=[self.WORKGROUP],
                         push=self._push())

    @classmethod
    def embedding(cls, dev: Device, hyper, mask, V: int, out_off: int = 0) -> DropoutMask:
        """Embedding-row scales [V] (stream 1, p = HP_P_EMB)."""
        return cls(dev, hyper, mask, V, rng.STREAM_EMBEDDING, slots.HP_P_EMB, out_off)

    @classmethod
    def hidden(cls, dev: Device, hyper, mask, B: int, H: int, layer: int, out_off: int = 0) -> DropoutMask:
        """Hidden-unit scales [B,H] of `layer` (stream 16 + layer, p = HP_P_HID)."""
        return cls(dev, hyper, mask, B * H, rng.STREAM_HIDDEN + layer, slots.HP_P_HID, out_off)

    def _push(self):
        return (self.n, self.stream, self.p_slot, self.out_off)

    def __call__(self):
        return self.op(*self._push())
