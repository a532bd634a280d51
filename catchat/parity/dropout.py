"""Dropout masks (glsl/dropout_mask.comp): the GLSL RNG bit-identical to catchat.model.reference's.

The keep pattern is compared bit-for-bit. The scale of a kept element is float32 arithmetic on
float32(p) (1 / (1 - p): reference forms it in float64 then casts), so kept values are checked
to within Vulkan's 2.5 ulp division precision instead.
"""

from __future__ import annotations

import numpy as np

from catchat.model import reference as ref
from catchat.parity import ParityResult, compare, exact, make_hyper
from catchat.rng import step_seed
from catchat.vk.device import Device
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.dropout import DropoutMask


def dropout_scale_reference(keep: np.ndarray, p: float) -> np.ndarray:
    """reference's scale: float32(keep / (1 - p)) with the division in float64."""
    return (keep / (1.0 - p)).astype(np.float32)


ULP25 = 2.5 * 2.0**-23  # relative: Vulkan's precision of a float32 division


def parity_checks(dev: Device) -> list[ParityResult]:
    """Embedding and hidden masks: keep pattern bit-for-bit, kept values within 2.5 ulp."""
    out = []
    cases = [(0, 0.0), (12345, 0.1), (0xDEADBEEF, 0.5), (step_seed(7, 3, 1), 0.37)]
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
        out.append(exact("dropout_mask.embedding.keep", f"V={V} {tag}", (gv != 0).astype(np.float32),
                          keep_v.astype(np.float32)))
        out.append(compare("dropout_mask.embedding", f"V={V} {tag}", gv, dropout_scale_reference(keep_v, p),
                           0.0, ULP25))
        out.append(exact("dropout_mask.hidden.keep", f"B={B} H={H} l={layer} {tag}",
                          (gb != 0).astype(np.float32), keep_h.astype(np.float32)))
        out.append(compare("dropout_mask.hidden", f"B={B} H={H} l={layer} {tag}", gb,
                           dropout_scale_reference(keep_h, p), 0.0, ULP25))
    return out
