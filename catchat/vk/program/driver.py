"""The host-side driver of the GPU program: one model's parameter layout at window T and B lanes.

`Program` allocates the buffer plan (plan.py), binds the kernels to it (kernelsets.py), records the
sequences (sequences.py) and drives them: parameters, optimizer state and the carried state in and
out, a training step (micro-batches of consecutive windows of the same B lanes: the carried state
flows from one to the next, as in reference.reference_train_step), evaluation windows, and the
`hyper` words of each step. With teacher forcing below 1 (scheduled sampling) the forward pass
runs one timestep at a time, choosing each next input from the previous step's logits; it writes
the same activations as the batched forward, so the backward pass is the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from catchat.data.lanes import n_valid as count_valid
from catchat.errors import DeviceLost
from catchat.model import ParamLayout
from catchat.rng import step_seed
from catchat.vk import slots
from catchat.vk.device import Device, host_view
from catchat.vk.kernels.optim import optimizer_hyper_words
from catchat.vk.program import sequences as sq
from catchat.vk.program.grad_slices import ExchangeTimes, GradStages, StepExchange
from catchat.vk.program.host_io import ProgramIO
from catchat.vk.program.kernelsets import (
    BackwardKernels,
    ForwardKernels,
    StepwiseKernels,
    build_backward,
    build_forward,
    build_stepwise,
)
from catchat.vk.program.plan import Geometry, allocate, planned_bytes
from catchat.vk.program.wavefront import batched_ops


@dataclass(frozen=True)
class StepHyper:
    """Everything a training step needs besides data: optimizer, regularisers, RNG."""

    lr: float
    optimizer: str = "adamw"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip: float = 1.0  # 0 = no clipping
    label_smoothing: float = 0.0
    dropout_embedding: float = 0.0
    dropout_hidden: float = 0.0
    gradh_clamp: float = 0.0  # 0 = off
    spectral_bound: float = 0.0  # 0 = off
    run_seed: int = 0
    tf_top_k: int = 0  # scheduled sampling's fed-back token: 0 = argmax, k = a sample from the top k
    loss_scale: float = 1.0  # fp16's S (a power of two: catchat.precision.LossScaler); 1 at fp32


@dataclass
class StepStats:
    """What the GPU reports after a step (or an evaluation pass)."""

    loss: float  # sum of per-token losses / n_valid (smoothed in training, plain in eval)
    n_valid: int
    top1: int
    top5: int
    grad_norm: float = float("nan")  # before clipping
    clip_scale: float = 1.0
    skipped: bool = False
    clamp_hits: int = 0
    tf_model_fed: int = 0  # inputs that were the model's own choice (scheduled sampling)


class Program(ProgramIO):
    """All device state and recorded sequences for one model's parameter layout at window T and B lanes.

    buffers: the plan's buffers (plan.Buffers); fwd, bwd, stepwise: the kernel sets (bwd None
    without training, stepwise None until the per-timestep path is first used); seq_*: the
    recorded sequences (sequences.py)."""

    def __init__(self, dev: Device, layout: ParamLayout, T: int, B: int, optimizer: str = "adamw",
                 training: bool = True, *, lane_offset: int = 0, lanes_total: int | None = None,
                 precision: str = "fp32", grad_groups: bool = False):
        """layout: the caller's parameter layout (built once by the caller). training=False builds
        only the forward pass (evaluation, generation): no gradient, optimizer or backward buffers.
        lane_offset, lanes_total: this program's B lanes are lanes [lane_offset, lane_offset + B) of
        lanes_total (data parallelism, catchat/distributed.py): dropout masks and scheduled sampling's
        draws are those of the global lane (HP_LANE_OFFSET, HP_LANES). Default: all lanes, offset 0.
        precision: "fp32", or "fp16": every GEMM takes its operands rounded to float16 (kernelsets.py),
        and a training step's gradients carry StepHyper.loss_scale until they are unscaled.
        grad_groups: record the last micro-batch also as one sequence per backward group, each
        downloading the gradient range it finishes (grad_slices.py), so that train_step's
        reduce_grads adds up one range while the GPU runs the next group (needs kp patch 0004's
        eval_async; without it the step runs whole)."""
        self.layout, self.dev, self.spec, self.T, self.B = layout, dev, layout.spec, int(T), int(B)
        self.lane_offset = int(lane_offset)
        self.lanes_total = self.B if lanes_total is None else int(lanes_total)
        if self.lane_offset < 0 or self.lane_offset + self.B > self.lanes_total:
            raise ValueError(f"lanes [{self.lane_offset}, {self.lane_offset + self.B}) are not inside "
                             f"[0, {self.lanes_total})")
        self.optimizer_kind = optimizer
        self.precision = precision
        self.training = training
        grad_groups = training and grad_groups and dev.evals_async
        dev.check_device_memory(planned_bytes(layout, T, B, training, dev, precision, grad_groups),
                                f"the model (H={self.spec.hidden}, L={self.spec.layers}) at T={self.T}, B={self.B}"
                                + (" with training buffers" if training else ""))
        dev.check_loop_limit(self.T * self.B, f"the program at T={self.T}, B={self.B}")
        self.geometry = g = Geometry.of(layout, self.T, self.B, dev, training, precision)
        self.buffers = b = allocate(dev, layout, g, training)
        if b.initialised():
            self._sync(b.initialised(), True)  # device tensors hold garbage until synced
        self.fwd: ForwardKernels = build_forward(dev, layout, b, g, precision)
        self.bwd: BackwardKernels | None = build_backward(dev, layout, b, g, optimizer, precision,
                                                          g.products is not None, self.fwd.w16) if training else None
        self.stepwise: StepwiseKernels | None = None
        fwd, bwd = batched_ops(dev, layout, b, g, self.fwd, self.bwd, precision)  # layer by layer, or wavefronts
        self.seq_eval, self.seq_logits, self.seq_set_params = sq.record_forward(dev, b, self.fwd, fwd)
        self.seq_first = self.seq_next = self.seq_apply = None
        self.grad_stages = GradStages(dev, b.grads, layout) if grad_groups else None
        self.exchange = StepExchange(dev, b.grads, layout, self.grad_stages, self._sync)  # train_step's reduce_grads
        self.seq_groups = self.seq_groups_tf = None  # TrainSequences of per-group sequences (grad_groups)
        if training:
            self.seq_first, self.seq_next = sq.record_train(dev, b, self.fwd, self.bwd, fwd, bwd)
            self.seq_apply = sq.record_apply(dev, b, self.fwd, self.bwd)
        if grad_groups:
            self.seq_groups = sq.record_train_groups(dev, b, self.fwd, self.bwd, fwd, self.grad_stages)
        self.seq_eval_free = self.seq_first_tf = self.seq_next_tf = None  # per-timestep: recorded on first use

    planned_bytes = staticmethod(planned_bytes)

    @property
    def sweep_products(self) -> str:
        """How the sweeps' per-step products multiply (logs, the start event): "fp16 on tensor cores" and
        the design (`gru.program_products`: resident, mixed, stream or stream32) where it has one, else "fp32"
        (the forward's on tensor cores from float16 splits where `gru.split_forward` or
        `gru.resident_split_forward`)."""
        if self.geometry.products is not None:
            return f"fp16 on tensor cores ({self.geometry.products})"
        return "fp32 (the forward's from float16 splits on tensor cores)" if self.fwd.gru[0].split else "fp32"

    def _stepwise_sequences(self):
        """Scheduled-sampling training and free-running eval sequences (recorded on first use)."""
        if self.seq_eval_free is not None:
            return
        dev, b = self.dev, self.buffers
        self.stepwise = build_stepwise(dev, self.layout, b, self.geometry, self.precision)
        fwd = sq.stepwise_forward_ops(self.fwd, self.stepwise, self.T, self.B)
        self.seq_eval_free = sq.record_eval(dev, b, self.fwd, fwd)
        if self.training:
            self.seq_first_tf, self.seq_next_tf = sq.record_train(dev, b, self.fwd, self.bwd, fwd)
        if self.grad_stages is not None:
            self.seq_groups_tf = sq.record_train_groups(dev, b, self.fwd, self.bwd, fwd, self.grad_stages)

    def _load_data(self, tokens, targets, resets):
        shape = (self.T, self.B)
        b = self.buffers
        for t, a in ((b.tokens, tokens), (b.targets, targets), (b.resets, resets)):
            if np.shape(a) != shape:
                raise ValueError(f"data must be time-major {shape}, got {np.shape(a)}")
            self._put(t, a, np.uint32)

    def _load_hyper(self, words: dict[int, np.uint32]):
        h = host_view(self.buffers.hyper)
        h[:] = 0
        h[slots.HP_LANE_OFFSET] = self.lane_offset
        h[slots.HP_LANES] = self.lanes_total
        for slot, w in words.items():
            h[slot] = w

    def _zero_stats(self):
        host_view(self.buffers.stats)[:] = 0

    def _check_sweeps(self, words) -> None:
        """A persistent sweep whose grid barrier gave up computed garbage: say so instead."""
        if words[slots.ST_SYNC_TIMEOUTS]:
            raise DeviceLost(f"a one-dispatch recurrent sweep on {self.dev.info.name} lost its workgroups (they were "
                             "not all resident at once), so this step's results are wrong",
                             hint="run with CATCHAT_PERSISTENT=0 (one dispatch per timestep) and report the GPU")

    def _stats(self, n_valid: int) -> StepStats:
        w = host_view(self.buffers.stats).copy()
        self._check_sweeps(w)
        f32 = lambda slot: slots.word_f32(w, slot)  # noqa: E731
        norm_sq = f32(slots.ST_GRAD_NORM_SQ)
        return StepStats(loss=f32(slots.ST_LOSS_SUM) / n_valid if n_valid else 0.0, n_valid=int(w[slots.ST_N_VALID]),
                         top1=int(w[slots.ST_TOP1]), top5=int(w[slots.ST_TOP5]),
                         grad_norm=math.sqrt(max(norm_sq, 0.0)) if math.isfinite(norm_sq) else float("nan"),
                         clip_scale=f32(slots.ST_CLIP_SCALE), skipped=bool(w[slots.ST_SKIPPED]),
                         clamp_hits=int(w[slots.ST_CLAMP_HITS]), tf_model_fed=int(w[slots.ST_TF_MODEL_FED]))

    def hyper_words(self, hp: StepHyper, *, global_step: int, micro_batch: int, n_valid: int,
                    opt_t: int | None = None, tf: float = 1.0) -> dict[int, np.uint32]:
        """The hyper buffer for one micro-batch of optimizer step global_step + 1. The loss scale S
        multiplies the loss gradient, so the backward sweep's clamp binds at S * gradh_clamp (exact: S is
        a power of two); the gradients are unscaled by 1/S before anything else reads them."""
        f = slots.f32_bits
        if hp.loss_scale != 1.0 and self.precision == "fp32":
            raise ValueError("a loss scale is for precision fp16 (an fp32 program never unscales)")
        s = float(hp.loss_scale)
        if not (s >= 1.0 and math.frexp(s)[0] == 0.5):
            raise ValueError(f"the loss scale must be a power of two >= 1, got {s}")
        t = global_step + 1 if opt_t is None else opt_t
        words = optimizer_hyper_words(hp.optimizer, t, hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay,
                                      hp.clip, hp.spectral_bound)
        words.update({
            slots.HP_SEED: np.uint32(step_seed(hp.run_seed, global_step, micro_batch)),
            slots.HP_N_VALID: np.uint32(n_valid), slots.HP_INV_N_VALID: f(1.0 / n_valid if n_valid else 0.0),
            slots.HP_P_EMB: f(hp.dropout_embedding), slots.HP_P_HID: f(hp.dropout_hidden),
            slots.HP_SMOOTHING: f(hp.label_smoothing), slots.HP_GRADH_CLAMP: f(np.float32(hp.gradh_clamp) * s),
            slots.HP_TF: f(tf), slots.HP_TF_TOPK: np.uint32(hp.tf_top_k),
            slots.HP_LOSS_SCALE: f(s), slots.HP_GRAD_UNSCALE: f(1.0 / s),
        })
        return words

    def train_step(self, micro_batches, hp: StepHyper, *, global_step: int, opt_t: int | None = None,
                   tf: float = 1.0, stepwise: bool | None = None, n_valid: int | None = None,
                   reduce_grads=None, while_running=None) -> StepStats:
        """One optimizer step over micro-batches [(tokens, targets, resets) time-major [T,B]].

        The valid-target count is taken from the data on the host (lesson 10); a step with none,
        or with a non-finite gradient norm, is not applied (StepStats.skipped). tf < 1 runs the
        forward pass one timestep at a time with scheduled sampling (docs/model.md); `stepwise`
        forces that path (True) or the batched one (False) whatever tf is.

        Data parallelism (catchat/distributed.py): `n_valid` is the valid targets of the whole step on
        every rank (the loss's divisor); `reduce_grads(part, out=part)` writes the sum over ranks of
        `part` (a range of this program's gradient, float32 host memory) over it (Comm.sum_grads), for
        each range of `group_ranges(layout)` in turn (the backward's order), between the micro-batches
        and the optimizer, which then applies the same step on every rank. With `grad_groups` the last
        micro-batch runs group by group and a range is added up as soon as its group has finished,
        while the GPU runs the next; without, after the whole step, range by range all the same (the
        same additions: the same bits). The StepStats' loss, n_valid, top-1/5 and counters are then
        this program's share (the caller adds them up); the grad norm, clip scale and skip are the
        whole step's. `exchange.times` times it.

        while_running: host work (no argument, nothing returned) done while the last micro-batch's
        forward and backward run on the GPU, e.g. the next step's data; it must not touch this
        program's buffers. Its exceptions propagate once the GPU work has finished.
        """
        if not self.training:
            raise ValueError("this program was built with training=False")
        if hp.optimizer != self.optimizer_kind:
            raise ValueError(f"program was built for {self.optimizer_kind}, step asks for {hp.optimizer}")
        if n_valid is None:
            n_valid = sum(count_valid(tg) for _, tg, _ in micro_batches)
        if (tf < 1.0) if stepwise is None else stepwise:
            self._stepwise_sequences()
            first, nxt, groups = self.seq_first_tf, self.seq_next_tf, self.seq_groups_tf
        else:
            first, nxt, groups = self.seq_first, self.seq_next, self.seq_groups
        overlap = reduce_grads is not None and groups is not None
        self.exchange.times = ExchangeTimes()
        last = len(micro_batches) - 1
        for k, (tok, tg, rs) in enumerate(micro_batches):
            self._load_data(tok, tg, rs)
            self._load_hyper(self.hyper_words(hp, global_step=global_step, micro_batch=k, n_valid=n_valid,
                                              opt_t=opt_t, tf=tf))
            if k == 0:
                self._zero_stats()
            seq, what = (first, nxt)[k > 0], f"training step {global_step + 1} (micro-batch {k + 1})"
            if overlap and k == last:
                self.exchange.overlapped(groups[k > 0], what, while_running, reduce_grads)
            elif while_running is not None and k == last:
                self._eval_while(seq, what, while_running)
            else:
                self._eval(seq, what)
        if reduce_grads is not None:
            self.exchange.finish(reduce_grads, overlap)
        self._eval(self.seq_apply, f"training step {global_step + 1} (optimizer)")
        return self._stats(n_valid)

    def forward_logits(self, tokens, resets) -> np.ndarray:
        """Forward one window without dropout and return logits [T,B,V]; carries the state."""
        self._load_data(tokens, np.zeros((self.T, self.B), np.uint32), resets)
        self._load_hyper({})
        self._zero_stats()
        self._eval(self.seq_logits, "a forward pass")
        self._check_sweeps(host_view(self.buffers.stats))
        return host_view(self.buffers.logits).reshape(self.T, self.B, self.spec.vocab_size).copy()

    def eval_window(self, tokens, targets, resets, *, free_running: bool = False) -> StepStats:
        """Forward one window with plain cross-entropy (no smoothing, no dropout); carries the state.

        free_running: teacher forcing 0 — every input after the window's first token (and after each
        conversation start) is the model's own argmax from the step before (the per-timestep path).
        """
        n_valid = count_valid(targets)
        self._load_data(tokens, targets, resets)
        self._load_hyper({slots.HP_N_VALID: np.uint32(n_valid),
                          slots.HP_INV_N_VALID: slots.f32_bits(1.0 / n_valid if n_valid else 0.0),
                          slots.HP_TF: slots.f32_bits(0.0 if free_running else 1.0)})
        self._zero_stats()
        if free_running:
            self._stepwise_sequences()
            self._eval(self.seq_eval_free, "a free-running evaluation window")
        else:
            self._eval(self.seq_eval, "an evaluation window")
        return self._stats(n_valid)

    def evaluate_windows(self, windows, *, free_running: bool = False, reduce_sums=None) -> dict:
        """Plain cross-entropy over windows [(tokens, targets, resets) time-major [T,B]] in order,
        the state carried from one to the next, starting from zero: loss (nats/char), bpc, top-1 and
        top-5 rates, valid targets, windows. Leaves the carried state where the windows end.
        reduce_sums(sums) -> sums: applied to the float64 sums [loss * targets, valid targets,
        top-1, top-5] before the rates are taken (data parallelism: the sum over the ranks)."""
        self.set_carry(None)
        sums, count = np.zeros(4, np.float64), 0
        for tokens, targets, resets in windows:
            st = self.eval_window(tokens, targets, resets, free_running=free_running)
            sums += (st.loss * st.n_valid, st.n_valid, st.top1, st.top5)
            count += 1
        loss_sum, n_valid, top1, top5 = sums if reduce_sums is None else reduce_sums(sums)
        loss = float(loss_sum / n_valid) if n_valid else float("nan")
        return dict(loss=loss, bpc=loss / math.log(2.0), top1=float(top1 / max(n_valid, 1)),
                    top5=float(top5 / max(n_valid, 1)), n_valid=int(n_valid), windows=count)
