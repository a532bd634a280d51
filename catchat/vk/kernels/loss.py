"""Fused softmax cross-entropy and its deterministic reduction (glsl/cross_entropy.comp,
glsl/loss_reduce.comp); maths in docs/model.md "Loss", twin catchat.reference.cross_entropy_forward_backward.

Per micro-batch, in order:
    CrossEntropy   logits[T*B,V], targets[T*B] -> row_loss[T*B] f32, row_flags[T*B] u32
                   (bit0 valid, bit1 top-1 hit, bit2 top-5 hit) and, when training,
                   dlogits = (softmax - (1-e) onehot - e/V) * hyper[HP_INV_N_VALID] (0 if masked),
                   in place over the logits or into a separate buffer
    LossReduce     stats[ST_LOSS_SUM] += sum of row_loss (valid rows, fixed order, float bits);
                   stats[ST_TOP1], [ST_TOP5], [ST_N_VALID] += counts
Smoothing e = hyper[HP_SMOOTHING] (0 for the reported eval loss). Stats accumulate over the
micro-batches of a step: the program zeroes them at the start of each optimizer step.
"""

from __future__ import annotations

import numpy as np

from catchat import reference
from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ParityResult, ceil_div, compare, run_ops
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

MAX_GROUPS = 65535
FLAG_VALID, FLAG_TOP1, FLAG_TOP5 = 1, 2, 4


def row_geometry(dev: Device) -> tuple[int, int]:
    """(lanes per row G, a power of two; rows per workgroup R) of CrossEntropy."""
    return (16, 4) if dev.info.type == "CPU" else (32, 8)


def _check(tensor, off: int, n: int, what: str) -> None:
    if off < 0 or off + n > tensor.size():
        raise ValueError(f"loss {what}: [{n}] at offset {off} exceeds its buffer of {tensor.size()}")


class CrossEntropy(Kernel):
    """Per-row smoothed cross-entropy, top-1/top-5 flags and (optionally) dlogits.

    logits: (tensor, offset) [n_rows, V]; targets: (uint32 tensor, offset) [n_rows] (0 = pad,
    masked; a target >= V is treated as masked too); row_loss: (float tensor, offset) [n_rows];
    row_flags: (uint32 tensor, offset) [n_rows]; hyper: [HP_WORDS] (reads HP_SMOOTHING,
    HP_INV_N_VALID). All outputs are overwritten (masked rows: loss 0, flags 0, dlogits 0).
    want_grad=False (eval, generation): logits are left untouched. want_grad=True: dlogits go
    over the logits (dlogits=None, saves [n_rows,V] in training) or to dlogits=(tensor, offset).
    One group of G lanes per row, R rows per workgroup; V arrives as a push constant.
    """

    shader = "cross_entropy"

    def __init__(self, dev: Device, logits, targets, row_loss, row_flags, hyper, n_rows: int,
                 V: int, want_grad: bool = True, dlogits=None):
        n_rows, V = int(n_rows), int(V)
        if V < 1:
            raise ValueError("cross-entropy needs V >= 1")
        _check(logits[0], logits[1], n_rows * V, "logits")
        _check(targets[0], targets[1], n_rows, "targets")
        _check(row_loss[0], row_loss[1], n_rows, "row_loss")
        _check(row_flags[0], row_flags[1], n_rows, "row_flags")
        tensors = [logits[0], targets[0], row_loss[0], row_flags[0], hyper]
        defines = {}
        dl_off = 0
        if want_grad:
            defines["WANT_GRAD"] = 1
            if dlogits is None:
                defines["IN_PLACE"] = 1
            else:
                _check(dlogits[0], dlogits[1], n_rows * V, "dlogits")
                tensors.append(dlogits[0])
                dl_off = dlogits[1]
        elif dlogits is not None:
            raise ValueError("dlogits given with want_grad=False")
        self.n_rows, self.V = n_rows, V
        G, R = row_geometry(dev)
        groups = min(max(1, ceil_div(n_rows, R)), MAX_GROUPS)
        self.push = (n_rows, V, logits[1], targets[1], row_loss[1], row_flags[1], dl_off)
        super().__init__(dev, tensors, [groups], spec=[G, R], push=self.push, defines=defines)

    def op(self):
        return super().op(*self.push)


class LossReduce(Kernel):
    """Adds a micro-batch's rows into stats: ST_LOSS_SUM (f32 bits) += sum of valid row_loss,
    ST_TOP1 / ST_TOP5 / ST_N_VALID += flag counts. One workgroup, fixed order: bitwise
    reproducible. row_loss: (float tensor, offset) [n_rows]; row_flags: (uint32 tensor, offset)
    [n_rows]; stats: uint32 [ST_WORDS]."""

    shader = "loss_reduce"

    def __init__(self, dev: Device, row_loss, row_flags, stats, n_rows: int):
        n_rows = int(n_rows)
        _check(row_loss[0], row_loss[1], n_rows, "row_loss")
        _check(row_flags[0], row_flags[1], n_rows, "row_flags")
        _check(stats, 0, ST_WORDS, "stats")
        wg = 256 if dev.info.type == "CPU" else min(1024, dev.info.max_workgroup_invocations)
        self.push = (n_rows, row_loss[1], row_flags[1])
        super().__init__(dev, [row_loss[0], row_flags[0], stats], [1], spec=[wg], push=self.push)

    def op(self):
        return super().op(*self.push)


# ---------------------------------------------------------------------------------------------
# Parity against catchat.reference
# ---------------------------------------------------------------------------------------------


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
