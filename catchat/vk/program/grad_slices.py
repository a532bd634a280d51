"""The gradient in layer groups, for the exchange that overlaps the backward pass (data parallelism,
docs/distributed.md "Overlap").

The backward runs top-down: the head with the top layer, then each layer below, then layer 0 in two
groups: its sweep with the embedding and table0, then its own weight and bias gradients. Each group
finishes one contiguous range of the flat ParamLayout (its order is embedding, layers 0..L-1, head;
a layer's is W_ih, W_hh, b_ih, b_hh, norm): the top layer's parameters and the head (the layout's
tail), one layer's, the embedding with W_ih0 (the layout's head), and W_hh0 up to layer 1. No later
group writes into an earlier group's range: a layer's backward writes only its own parameters'
gradients, the head writes head.weight (or, tied, embedding.weight, which is in a later group),
table0 and the embedding backward write W_ih0 and the embedding, layer 0's norm (run in its first
group) writes into the last group's range. So a group's range is final when its ops have run.
Layer 0 is cut in two because the last range is exchanged after the GPU has finished, with nothing
to hide behind: half a layer instead of a layer and the embedding (the overlap's bound goes from
(L-1)/L of the exchange to about 1 - 1/(2L)).

With several ranks each group's range is copied on the device into a staging tensor of its own and
downloaded at the end of the group's sequence, so the host adds up group g's range while the GPU
runs group g + 1. kp 0.9 downloads only whole tensors; the copy is the embedding gather
(glsl/embedding.comp) of one row of the range's width with a scale of exactly 1 (sqrt(1) and no
dropout: its own hyper words, all zero), x * 1.0: the same bits, zeros' signs included (a device that
flushes float32 subnormals would flush them here as in every kernel).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from catchat.model import ParamLayout
from catchat.vk import slots
from catchat.vk.device import Device, host_view
from catchat.vk.kernels.embedding import EmbeddingForward


def group_ranges(layout: ParamLayout) -> list[tuple[int, int]]:
    """[lo, hi) of the flat gradient that each backward group finishes, in backward order
    (sequences.backward_groups): the top layer with the head, each layer below, then layer 0 in two:
    the embedding and W_ih0 (the layout's head), then W_hh0 to layer 1 (W_hh0, layer 0's biases and
    norm; with one layer, the head too). Contiguous, covering [0, layout.total)."""
    L = layout.spec.layers
    starts = [0] + [layout.offsets[f"layers.{l}.gru.weight_ih"] for l in range(1, L)] + [layout.total]
    w_hh0 = layout.offsets["layers.0.gru.weight_hh"]
    return [(starts[l], starts[l + 1]) for l in reversed(range(1, L))] + [(0, w_hh0), (w_hh0, starts[1])]


class GradStages:
    """Per backward group: a staging tensor of its range, the dispatch that fills it from `grads`
    (`copies`), and a sequence that uploads it and copies it back into its range of `grads` (`returns`:
    the range's sum over the ranks goes back while the GPU still runs the groups below)."""

    def __init__(self, dev: Device, grads, layout: ParamLayout):
        self.ranges = group_ranges(layout)
        self.stages = [dev.tensor(hi - lo) for lo, hi in self.ranges]
        row0 = dev.tensor(np.zeros(1, np.uint32), np.uint32)  # the one "token": row 0 of the range
        unscaled = dev.tensor(np.zeros(slots.HP_WORDS, np.uint32), np.uint32)  # p_emb = 0: no dropout
        dev.upload([row0, unscaled])  # device tensors hold garbage until synced

        def copy(src, dst, width: int):
            return EmbeddingForward(dev, (row0, 0), src, dst, unscaled, 1, 1, width, scale_h=1)

        self.copies = [copy((grads, lo), (stage, 0), hi - lo) for (lo, hi), stage in zip(self.ranges, self.stages)]
        self.returns = [dev.recorded([copy((stage, 0), (grads, lo), hi - lo).op()], [stage])
                        for (lo, hi), stage in zip(self.ranges, self.stages)]

    @staticmethod
    def scratch_words(P: int) -> int:
        """Words this allocates for a gradient of P floats (the memory plan): the staging tensors (one
        gradient's worth), the copy's one-row index and its hyper words."""
        return P + 1 + slots.HP_WORDS


@dataclass
class ExchangeTimes:
    """A training step's gradient exchange on the host clock (time.perf_counter): `host_s` seconds
    spent on it (reduce_grads, and the downloads and uploads outside the GPU's sequences); `gpu_done`
    when the host saw the micro-batches' GPU work finished, `done` when the summed gradient was back
    on the device. Between the two the exchange held the step up."""

    host_s: float = 0.0
    gpu_done: float = 0.0
    done: float = 0.0


class StepExchange:
    """A training step's gradient summed over the ranks range by range (Program.train_step's
    reduce_grads), overlapped with the last micro-batch's backward or after it; `times` times the
    last step's. sync(tensors, to_device): the Program's whole-tensor upload or download."""

    def __init__(self, dev: Device, grads, layout: ParamLayout, stages: GradStages | None, sync):
        self.dev, self.grads, self.stages, self.sync = dev, grads, stages, sync
        self.ranges = group_ranges(layout)
        self.times = ExchangeTimes()
        self.returning: list = []  # the overlapped ranges' returns submitted, not yet waited for

    def overlapped(self, seqs, what: str, while_running, reduce_grads) -> None:
        """The last micro-batch as per-group sequences (sequences.record_train_groups), all submitted
        at once (the queue runs them in order; every dispatch's barrier, kp patch 0002, orders it after
        the group before): while the GPU runs group g + 1 the host adds up group g's range over the
        ranks in its staging tensor and submits its return (the upload, then the copy into `grads`:
        the transfer needs no GPU work before it, so it can run beside the groups still running).
        while_running first: it overlaps the forward. finish() waits for the returns; on an error
        the GPU finishes everything submitted first."""
        times, pending = self.times, []
        try:
            for seq in seqs:
                self.dev.run(seq.eval_async, what)
                pending.append(seq)
            if while_running is not None:
                while_running()
            for stage, back in zip(self.stages.stages, self.stages.returns):
                self.dev.run(pending.pop(0).eval_await, what)
                times.gpu_done = started = time.perf_counter()
                part = host_view(stage)
                reduce_grads(part, out=part)  # read, then written over
                self.dev.run(back.eval_async, what)
                self.returning.append(back)
                times.host_s += time.perf_counter() - started
        except BaseException:
            for seq in pending + self.returning:
                self.dev.run(seq.eval_await, what)
            self.returning = []
            raise

    def finish(self, reduce_grads, overlapped: bool) -> None:
        """The gradient summed over the ranks on the device: overlapped, once the ranges' returns are
        done; else downloaded, added up range by range (the ranges and order of the overlapped path:
        the same bits) and uploaded."""
        times = self.times
        started = time.perf_counter()
        if overlapped:
            while self.returning:
                self.dev.run(self.returning.pop(0).eval_await, "returning the summed gradient")
        else:
            times.gpu_done = started
            self.sync([self.grads], False)
            host = host_view(self.grads)
            for lo, hi in self.ranges:
                reduce_grads(host[lo:hi], out=host[lo:hi])  # read, then written over
            self.sync([self.grads], True)
        times.done = time.perf_counter()
        times.host_s += times.done - started
