"""Scheduled sampling's choice of the next input token (glsl/tf_select.comp)."""

from __future__ import annotations

from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div

WORKGROUP = 64


class TfSelect(Kernel):
    """Overwrites tokens[t] (uint32 [T,B]) with each lane's input of step t: the data's token or the
    model's choice from logits [T,B,V] row t-1 (reference.tf_select). Reads resets [T,B] and hyper
    (HP_SEED, HP_TF, HP_TF_TOPK); adds the model-fed count to stats[ST_TF_MODEL_FED]. One dispatch
    per timestep, t as a push constant (t = 0 does nothing)."""

    shader = "tf_select"

    def __init__(self, dev: Device, tokens, logits, resets, hyper, stats, *, T: int, B: int, V: int):
        self.T, self.B, self.V = int(T), int(B), int(V)
        super().__init__(dev, [tokens, logits, resets, hyper, stats], [ceil_div(self.B, WORKGROUP)],
                         spec=[WORKGROUP], push=(0, self.B, self.V))

    def step(self, t: int):
        if not 0 <= t < self.T:
            raise ValueError(f"timestep {t} outside [0, {self.T})")
        return self.op(t, self.B, self.V)
