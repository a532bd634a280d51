"""Fused softmax cross-entropy and its deterministic reduction (glsl/cross_entropy.comp,
glsl/loss_reduce.comp); maths in docs/model.md "Loss", twin catchat.model.reference.cross_entropy_forward_backward.

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

from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div
from catchat.vk.slots import ST_WORDS

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
