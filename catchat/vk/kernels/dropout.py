"""Dropout keep masks from the counter-based RNG (glsl/dropout_mask.comp, glsl/include/dropout.glsl).

The training kernels never read a mask buffer: the embedding and residual/RMSNorm shaders
recompute `dropout_scale(seed, stream, counter, p)` where they need it. This kernel writes the
masks out so parity checks can prove the GLSL RNG bit-identical to catchat.reference.

The keep pattern is compared bit-for-bit. The scale of a kept element is float32 arithmetic on
float32(p) (1 / (1 - p): reference forms it in float64 then casts), so kept values are checked
to within Vulkan's 2.5 ulp division precision instead.
"""

from __future__ import annotations

import numpy as np

from catchat import reference as ref
from catchat.vk import slots
from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ParityResult, ceil_div, compare, run_ops


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
        return cls(dev, hyper, mask, V, ref.STREAM_EMBEDDING, slots.HP_P_EMB, out_off)

    @classmethod
    def hidden(cls, dev: Device, hyper, mask, B: int, H: int, layer: int, out_off: int = 0) -> DropoutMask:
        """Hidden-unit scales [B,H] of `layer` (stream 16 + layer, p = HP_P_HID)."""
        return cls(dev, hyper, mask, B * H, ref.STREAM_HIDDEN + layer, slots.HP_P_HID, out_off)

    def _push(self):
        return (self.n, self.stream, self.p_slot, self.out_off)

    def __call__(self):
        return self.op(*self._push())


def make_hyper(seed: int = 0, **floats) -> np.ndarray:
    """A uint32 [HP_WORDS] hyper array: HP_SEED = seed, and e.g. p_hid=0.1 -> HP_P_HID = f32 bits."""
    h = np.zeros(slots.HP_WORDS, np.uint32)
    h[slots.HP_SEED] = np.uint32(int(seed) & 0xFFFFFFFF)
    for name, value in floats.items():
        h[getattr(slots, "HP_" + name.upper())] = slots.f32_bits(value)
    return h


def dropout_scale_reference(keep: np.ndarray, p: float) -> np.ndarray:
    """reference's scale: float32(keep / (1 - p)) with the division in float64."""
    return (keep / (1.0 - p)).astype(np.float32)


ULP25 = 2.5 * 2.0**-23  # relative: Vulkan's precision of a float32 division


def _exact(kernel: str, shape: str, got: np.ndarray, expected: np.ndarray) -> ParityResult:
    """Bitwise comparison reported as a ParityResult (tolerances 0)."""
    same = got.shape == expected.shape and np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    r = compare(kernel, shape, got, expected, 0.0, 0.0)
    r.ok = bool(same)
    return r


def parity_checks(dev: Device) -> list[ParityResult]:
    """Embedding and hidden masks: keep pattern bit-for-bit, kept values within 2.5 ulp."""
    out = []
    cases = [(0, 0.0), (12345, 0.1), (0xDEADBEEF, 0.5), (ref.step_seed(7, 3, 1), 0.37)]
    for seed, p in cases:
        V, B, H, layer = 101, 5, 33, 2
        tv, tb = dev.tensor(V), dev.tensor(16 + B * H)  # hidden mask at an offset
        th = dev.tensor(make_hyper(seed, p_emb=p, p_hid=p), np.uint32)
        emb = DropoutMask.embedding(dev, th, tv, V)
        hid = DropoutMask.hidden(dev, th, tb, B, H, layer, out_off=16)
        gv, gb = run_ops(dev, [th, tv, tb], [emb(), hid()], [tv, tb])
        gb = gb[16:].reshape(B, H)
        keep_v = ref.embedding_keep_mask(seed, V, p)  # [V]
        keep_h = ref.hidden_keep_mask(seed, layer, B, H, p)  # [B,H]
        tag = f"seed={seed:#x} p={p}"
        out.append(_exact("dropout_mask.embedding.keep", f"V={V} {tag}", (gv != 0).astype(np.float32),
                          keep_v.astype(np.float32)))
        out.append(compare("dropout_mask.embedding", f"V={V} {tag}", gv, dropout_scale_reference(keep_v, p),
                           0.0, ULP25))
        out.append(_exact("dropout_mask.hidden.keep", f"B={B} H={H} l={layer} {tag}",
                          (gb != 0).astype(np.float32), keep_h.astype(np.float32)))
        out.append(compare("dropout_mask.hidden", f"B={B} H={H} l={layer} {tag}", gb,
                           dropout_scale_reference(keep_h, p), 0.0, ULP25))
    return out
