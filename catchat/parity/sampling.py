"""Scheduled sampling's choice of the next input token (glsl/tf_select.comp) against
catchat.model.reference.tf_select: argmax and top-k choices, exact."""

from __future__ import annotations

import numpy as np

from catchat.model import reference as ref
from catchat.parity import ParityResult, compare
from catchat.vk import slots
from catchat.vk.device import Device
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.sampling import TfSelect


def _case(dev: Device, T: int, B: int, V: int, tf: float, top_k: int, seed: int):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2, V, (T, B)).astype(np.uint32)
    logits = rng.standard_normal((T, B, V)).astype(np.float32)
    logits[:, :, 7 % V] = logits.max() if V > 7 else logits[:, :, 7 % V]  # a tie at the top
    resets = (rng.random((T, B)) < 0.2).astype(np.uint32)
    hyper = np.zeros(slots.HP_WORDS, np.uint32)
    hyper[slots.HP_SEED] = seed
    hyper[slots.HP_TF] = slots.f32_bits(tf)
    hyper[slots.HP_TF_TOPK] = top_k
    tt, tl, tr = dev.tensor(tokens, np.uint32), dev.tensor(logits), dev.tensor(resets, np.uint32)
    th, ts = dev.tensor(hyper, np.uint32), dev.tensor(slots.ST_WORDS, np.uint32)
    k = TfSelect(dev, tt, tl, tr, th, ts, T=T, B=B, V=V)
    got_tok, got_stats = run_ops(dev, [tt, tl, tr, th, ts], [k.step(t) for t in range(T)], [tt, ts])
    exp = tokens.copy()
    fed = 0
    for t in range(T):  # the logits are given, so every step's choice is independent of the others
        exp[t], n = ref.tf_select(tokens[t], logits[t - 1] if t else None, resets[t], seed, t, tf, top_k)
        fed += n
    shape = f"T={T} B={B} V={V} tf={tf} k={top_k}"
    return [compare("tf_select inputs", shape, got_tok, exp, 0, 0),
            compare("tf_select model-fed count", shape, [got_stats[slots.ST_TF_MODEL_FED]], [fed], 0, 0)]


def parity_checks(dev: Device) -> list[ParityResult]:
    """Argmax and top-k choices, exact, at lane counts around the workgroup size."""
    out = []
    for T, B, V, tf, k, seed in ((4, 3, 11, 0.5, 0, 1), (5, 65, 101, 0.3, 0, 2), (3, 7, 101, 0.0, 0, 3),
                                 (4, 5, 101, 0.5, 5, 4), (3, 64, 101, 1.0, 0, 5), (4, 9, 11, 0.2, 3, 6)):
        out += _case(dev, T, B, V, tf, k, seed)
    return out
