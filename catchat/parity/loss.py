"""Fused softmax cross-entropy and its reduction (glsl/cross_entropy.comp, glsl/loss_reduce.comp)
against catchat.model.reference.cross_entropy_forward_backward."""

from __future__ import annotations

import numpy as np

from catchat.model import reference
from catchat.parity import ParityResult, compare
from catchat.vk.device import Device
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.loss import CrossEntropy, LossReduce
from catchat.vk.slots import (
    HP_INV_N_VALID,
    HP_SMOOTHING,
    HP_WORDS,
    ST_LOSS_SUM,
    ST_N_VALID,
    ST_TOP1,
    ST_TOP5,
    ST_WORDS,
    f32_bits,
    word_f32,
)


def hyper_words(smoothing: float, inv_n_valid: float) -> np.ndarray:
    """A hyper buffer [HP_WORDS] with the loss's slots set."""
    hyper = np.zeros(HP_WORDS, np.uint32)
    hyper[HP_SMOOTHING] = f32_bits(smoothing)
    hyper[HP_INV_N_VALID] = f32_bits(inv_n_valid)
    return hyper


def loss_case(rng, n_rows: int, V: int, pad_frac: float = 0.2, ties: bool = False):
    """Random logits [n_rows,V] (rounded to a coarse grid when ties), targets [n_rows] with some
    pads, and a few rows whose target ties with other logits."""
    logits = (3.0 * rng.standard_normal((n_rows, V))).astype(np.float32)
    if ties:
        logits = np.round(logits).astype(np.float32)
    targets = rng.integers(1, V, size=n_rows).astype(np.uint32) if V > 1 else np.zeros(n_rows, np.uint32)
    targets[rng.random(n_rows) < pad_frac] = 0
    for i in range(0, n_rows, 3):  # the target's logit equals another one below and above it
        t = int(targets[i])
        if 0 < t < V - 1:
            logits[i, 0] = logits[i, t + 1] = logits[i, t]
    return logits, targets


def run_loss(dev: Device, logits, targets, smoothing, inv_n, stats0, mode: str, offs=(7, 3, 5)):
    """Run CrossEntropy + LossReduce once. mode: 'inplace', 'separate' or 'eval'.
    Returns (dlogits or the logits after the run [n,V], row_loss [n], row_flags [n], stats)."""
    n, V = logits.shape
    ol, ot, orow = offs
    t_log = dev.tensor(np.concatenate([np.zeros(ol, np.float32), logits.ravel(), np.zeros(3, np.float32)]))
    t_tgt = dev.tensor(np.concatenate([np.ones(ot, np.uint32), targets]), np.uint32)
    t_loss = dev.tensor(np.full(orow + n, 9.0, np.float32))
    t_flags = dev.tensor(np.full(orow + n, 99, np.uint32), np.uint32)
    t_hyper = dev.tensor(hyper_words(smoothing, inv_n), np.uint32)
    t_stats = dev.tensor(stats0, np.uint32)
    t_dl = dev.tensor(np.zeros(2 + n * V, np.float32))
    ce = CrossEntropy(dev, (t_log, ol), (t_tgt, ot), (t_loss, orow), (t_flags, orow), t_hyper, n, V,
                      want_grad=mode != "eval", dlogits=(t_dl, 2) if mode == "separate" else None)
    red = LossReduce(dev, (t_loss, orow), (t_flags, orow), t_stats, n)
    out_t = t_dl if mode == "separate" else t_log
    got, loss, flags, stats = run_ops(dev, [t_log, t_tgt, t_loss, t_flags, t_hyper, t_stats, t_dl],
                                      [ce.op(), red.op()], [out_t, t_loss, t_flags, t_stats])
    o = 2 if mode == "separate" else ol
    return got[o:o + n * V].reshape(n, V), loss[orow:], flags[orow:], stats


def stats_words(loss_sum=0.0, top1=0, top5=0, n_valid=0) -> np.ndarray:
    s = np.zeros(ST_WORDS, np.uint32)
    s[ST_LOSS_SUM] = f32_bits(loss_sum)
    s[ST_TOP1], s[ST_TOP5], s[ST_N_VALID] = top1, top5, n_valid
    return s


def parity_checks(dev: Device) -> list[ParityResult]:
    """Loss sum, top-1/top-5/valid counts and dlogits against the reference: smoothing 0 and
    0.1, masked rows, ties, V = 101 and 11, rows not divisible by the rows per workgroup, the
    three output modes, stats accumulated onto nonzero values."""
    rng = np.random.default_rng(0)
    out = []
    cases = ((1, 11, 0.0, "separate", False), (15, 11, 0.1, "inplace", True),
             (63, 101, 0.0, "inplace", False), (130, 101, 0.1, "separate", True),
             (37, 101, 0.1, "eval", False), (9, 1, 0.0, "inplace", False))
    for n, V, e, mode, ties in cases:
        logits, targets = loss_case(rng, n, V, ties=ties)
        n_step = int(np.count_nonzero(targets)) + 5  # the whole step has more valid targets
        inv = 1.0 / n_step
        stats0 = stats_words(1.25, 3, 4, 5)
        got, _, _, stats = run_loss(dev, logits, targets, e, inv, stats0, mode)
        loss, dl, top1, top5, nv = reference.cross_entropy_forward_backward(
            logits[:, None, :], targets[:, None], n_step, e)
        shape = f"n{n} V{V} e{e:g} {mode}{' ties' if ties else ''}"
        exp_sum = 1.25 + loss * n_step
        out.append(compare("cross_entropy loss_sum", shape, word_f32(stats, ST_LOSS_SUM), exp_sum,
                           1e-5 * max(1.0, abs(exp_sum)), 1e-5))
        counts = stats[[ST_TOP1, ST_TOP5, ST_N_VALID]].astype(np.int64)
        out.append(compare("cross_entropy top1/top5/valid", shape, counts,
                           [3 + top1, 4 + top5, 5 + nv], 0.0, 0.0))
        exp_out = logits if mode == "eval" else dl.reshape(n, V)
        tol = 0.0 if mode == "eval" else 2e-6 * inv
        out.append(compare(f"cross_entropy {'logits kept' if mode == 'eval' else 'dlogits'}",
                           shape, got, exp_out, tol, 1e-5))
    return out
