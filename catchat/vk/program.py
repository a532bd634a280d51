"""The GPU program: every buffer of a model at one (T, B) shape, and the recorded sequences.

A training step is recorded once and replayed for every batch:
    micro-batch (first)   upload hyper/stats/data, zero grads, forward, loss, backward, carry
    micro-batch (next)    upload hyper/data, forward, loss, backward, carry   (gradient accumulation)
    apply                 grad norm, skip guard + clip + AdamW/NAdam, spectral projection, download stats
Values that change every step (lr, step, seed, 1/N_valid) travel in the `hyper` buffer uploaded
with the data; nothing is re-recorded. With teacher forcing below 1 (scheduled sampling) the
forward pass runs one timestep at a time through every layer and the head, choosing each next
input from the previous step's logits (`stepwise_forward_ops`); it writes the same activations as
the batched forward, so the backward pass is the same. Micro-batches of one step are consecutive windows of the
same B lanes: the carried state flows from one to the next (as in reference.reference_train_step).

Buffers (time-major, docs/model.md):
    params, grads, m, v, decay   [P]          flat ParamLayout order
    tokens, targets, resets      [T*B] uint32
    h0, hT, dh0                  [L,B,H]       carried state in / out, gradient on h0 (checks)
    x[l]                         [T,B,H]       l = 0..L: embedding output, then each norm output
    o[l], hprev[l]               [T,B,H]       GRU outputs, state entering each step
    save[l]                      [T,B,4H]      r, z, n, W_hn h + b_hn
    rstd[l]                      [T*B]         RMSNorm 1/rms
    gi                           [T,B,3H]      input projections of the layer being run (shared)
    table0                       [V,3H]        layer 0's input projection per token: E @ W_ih0^T
    logits                       [T*B,V]       dlogits overwrite them in training
    dx, do                       [T,B,H]       gradient on a layer's input / GRU output (shared;
                                               do is x[L]'s memory: x[L] is last read by the head's
                                               weight gradient, before the first norm backward)
    dgi, dgh                     [T,B,3H]      gate gradients of the layer being run (shared; dgi
                                               is gi's memory: nothing reads gi after the forward)
    dtable0                      [V,3H]        dGi0 summed by token (times the embedding's row scale)

Layer 0's input is an embedding row, so its input projection is a row of table0 (rebuilt whenever
the parameters change: by set_params and at the end of the optimizer step, a [V,H]x[H,3H] GEMM)
scaled like the row and plus b_ih0: a gather
instead of a [T*B,H]x[H,3H] GEMM. Backward likewise: dtable0 = dGi0 summed by token, then
dW_ih0 += dtable0^T E and dE += dtable0 W_ih0 are [V]-sized GEMMs instead of two [T*B]-sized ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from catchat.errors import DeviceLost
from catchat.lanes import n_valid as count_valid
from catchat.model import ModelSpec, ParamLayout, spectral_u_init
from catchat.rng import step_seed
from catchat.vk import slots
from catchat.vk.device import Device, host_view
from catchat.vk.kernels import Axpby
from catchat.vk.kernels.embedding import EmbeddingBackward, EmbeddingForward
from catchat.vk.kernels.gemm import ColSum, Gemm, colsum_splits, gemm_split_k
from catchat.vk.kernels.gru import GruBackward, GruForward, backward_scratch_words, sync_words
from catchat.vk.kernels.loss import CrossEntropy, LossReduce
from catchat.vk.kernels.norm import ResidualRmsNormBackward, ResidualRmsNormForward
from catchat.vk.kernels.optim import GradNorm, Optimizer, SpectralProject, optimizer_hyper_words
from catchat.vk.kernels.sampling import TfSelect


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


def _layout(model: ParamLayout | ModelSpec) -> ParamLayout:
    """The caller's layout, or one made for a bare ModelSpec (forward-only callers)."""
    return model if isinstance(model, ParamLayout) else ParamLayout(model)


class Program:
    """All device state and recorded sequences for one model's parameter layout at window T and B lanes."""

    def __init__(self, dev: Device, model: ParamLayout | ModelSpec, T: int, B: int, optimizer: str = "adamw",
                 training: bool = True):
        """model: the parameter layout the caller already has (the trainer's), or a ModelSpec to lay
        out here. training=False builds only the forward pass (evaluation, generation): no gradient,
        optimizer or backward buffers."""
        self.layout = _layout(model)
        self.dev, self.spec, self.T, self.B = dev, self.layout.spec, int(T), int(B)
        self.optimizer_kind = optimizer
        self.training = training
        dev.check_device_memory(self.planned_bytes(self.layout, T, B, training, dev),
                                f"the model (H={self.spec.hidden}, L={self.spec.layers}) at T={self.T}, B={self.B}"
                                + (" with training buffers" if training else ""))
        self._alloc()
        self._build_kernels()
        self._record()

    @staticmethod
    def planned_bytes(model: ParamLayout | ModelSpec, T: int, B: int, training: bool = True,
                      dev: Device | None = None) -> int:
        """Bytes of device buffers the constructor will allocate (every buffer in the module doc,
        plus the kernels' scratch), computed without allocating. `dev` sets the GPU split-K
        workspaces; without it they are sized as on a CPU device (no split)."""
        from catchat.vk.kernels import ceil_div
        from catchat.vk.kernels.optim import MAX_GROUPS_X

        layout = _layout(model)
        spec = layout.spec
        H, L, V, R, P = spec.hidden, spec.layers, spec.vocab_size, int(T) * int(B), layout.total
        B = int(B)
        words = (P + slots.HP_WORDS + slots.ST_WORDS + 3 * R + 2 * L * B * H  # params, hyper, stats, data, h0/hT
                 + (L + 1) * R * H + 2 * L * R * H + L * R * 4 * H + L * R  # x, o, hprev, save, rstd
                 + R * 3 * H + V * 3 * H + R * V + 2 * R  # gi, table0, logits, row_loss/flags
                 + sync_words(B) * L)  # the forward sweeps' grid-barrier words
        if training:
            sk_w = gemm_split_k(dev, 3 * H, H, R) if dev is not None else 1
            sk_h = gemm_split_k(dev, V, H, R) if dev is not None else 1
            cs = colsum_splits(dev, R, 3 * H) if dev is not None else 1
            items = max(GradNorm.ITEMS, ceil_div(P, GradNorm.WORKGROUP * MAX_GROUPS_X))
            norm_parts = ceil_div(R, max(8, ceil_div(R, 1024)))
            words += (4 * P + 6 * L * H + L * B * H  # grads, m, v, decay, spectral u, dh0
                      + R * H + R * 3 * H + V * 3 * H  # dx, dgh, dtable0 (do and dgi alias x[L] and gi)
                      + max(sk_w * 3 * H * H, sk_h * V * H, 1) + max(cs * 3 * H, 1)  # split-K workspaces
                      + ceil_div(P, GradNorm.WORKGROUP * items)  # grad-norm partials
                      + 12 * L * H + 6 * L  # spectral projection work
                      # per layer: RMSNorm dg partials, GRU sweep scratch
                      + L * (norm_parts * H + backward_scratch_words(dev, B, H)))
        return 4 * words

    # ----------------------------------------------------------------------------- buffers
    def _alloc(self):
        d, s, lay = self.dev, self.spec, self.layout
        T, B, H, L, V = self.T, self.B, s.hidden, s.layers, s.vocab_size
        R = T * B
        P = lay.total
        self.params = d.tensor(P)
        self.hyper = d.tensor(slots.HP_WORDS, np.uint32)
        self.stats = d.tensor(slots.ST_WORDS, np.uint32)
        self.tokens, self.targets, self.resets = (d.tensor(R, np.uint32) for _ in range(3))
        self.h0, self.hT = d.tensor(L * B * H), d.tensor(L * B * H)
        self.x = [d.tensor(R * H) for _ in range(L + 1)]
        self.o = [d.tensor(R * H) for _ in range(L)]
        self.hprev = [d.tensor(R * H) for _ in range(L)]
        self.save = [d.tensor(R * 4 * H) for _ in range(L)]
        self.rstd = [d.tensor(R) for _ in range(L)]
        self.gi = d.tensor(R * 3 * H)
        self.table0 = d.tensor(V * 3 * H, kind="storage")
        self.logits = d.tensor(R * V)
        self.row_loss, self.row_flags = d.tensor(R), d.tensor(R, np.uint32)
        if not self.training:
            return
        self.grads, self.m, self.v = (d.tensor(P) for _ in range(3))
        self.decay = d.tensor(lay.decay_mask())
        self.u = d.tensor(spectral_u_init(s))  # [L,2,3,H] spectral-norm vectors
        self._sync([self.decay, self.u], True)  # device tensors hold garbage until synced
        self.dh0 = d.tensor(L * B * H)
        self.dx, self.do = d.tensor(R * H), self.x[L]  # aliases: see the module doc
        self.dgi, self.dgh = self.gi, d.tensor(R * 3 * H)
        self.dtable0 = d.tensor(V * 3 * H, kind="storage")

    def _off(self, name: str) -> int:
        return self.layout.offsets[name]

    def _head_name(self) -> str:
        return "embedding.weight" if self.spec.tie_embeddings else "head.weight"

    # ----------------------------------------------------------------------------- kernels
    def _build_kernels(self):
        self._build_forward()
        if self.training:
            self._build_backward()

    def _row_kernels(self, rows: int) -> tuple:
        """The per-row forward kernels over `rows` rows (T*B for the batched path, B for one
        timestep of the per-timestep path, which moves them along with op_at): embedding, each
        layer's input projection and residual+norm, the head."""
        d, s, o = self.dev, self.spec, self._off
        H, V = s.hidden, s.vocab_size
        emb = EmbeddingForward(d, (self.tokens, 0), (self.params, o("embedding.weight")), (self.x[0], 0),
                               self.hyper, rows, V, H)
        layers = []
        for l in range(s.layers):
            p = f"layers.{l}."
            if l == 0:  # a gather from table0 (see the module doc)
                proj = EmbeddingForward(d, (self.tokens, 0), (self.table0, 0), (self.gi, 0), self.hyper, rows, V,
                                        3 * H, scale_h=H, bias=(self.params, o(p + "gru.bias_ih")))
            else:
                proj = Gemm(d, (self.x[l], 0, H), (self.params, o(p + "gru.weight_ih"), H), (self.gi, 0, 3 * H),
                            rows, 3 * H, H, trans_b=True, bias=(self.params, o(p + "gru.bias_ih")))
            layers.append(dict(
                proj=proj,
                norm=ResidualRmsNormForward(d, self.x[l], self.o[l], self.params, self.hyper, self.x[l + 1],
                                            self.rstd[l], T=rows // self.B, B=self.B, H=H, layer=l,
                                            g_off=o(p + "norm.weight"), eps=s.norm_eps)))
        head = Gemm(d, (self.x[s.layers], 0, H), (self.params, o(self._head_name()), H), (self.logits, 0, V),
                    rows, V, H, trans_b=True)
        return emb, layers, head

    def _build_forward(self):
        d, s, o = self.dev, self.spec, self._off
        T, B, H, L, V = self.T, self.B, s.hidden, s.layers, s.vocab_size
        R = T * B
        self.emb_f, self.fwd_layers, self.head_f = self._row_kernels(R)
        self.table0_f = Gemm(d, (self.params, o("embedding.weight"), H), (self.params, o("layers.0.gru.weight_ih"), H),
                             (self.table0, 0, 3 * H), V, 3 * H, H, trans_b=True)
        for l, k in enumerate(self.fwd_layers):
            p = f"layers.{l}."
            k["gru"] = GruForward(d, self.gi, self.params, self.h0, self.resets, self.o[l], self.hprev[l],
                                  self.save[l], self.hT, T=T, B=B, H=H, w_off=o(p + "gru.weight_hh"),
                                  b_off=o(p + "gru.bias_hh"), h0_off=l * B * H, hT_off=l * B * H,
                                  stats=self.stats)
        self.ce_eval = CrossEntropy(d, (self.logits, 0), (self.targets, 0), (self.row_loss, 0),
                                    (self.row_flags, 0), self.hyper, R, V, want_grad=False)
        self.loss_reduce = LossReduce(d, (self.row_loss, 0), (self.row_flags, 0), self.stats, R)
        self.carry = Axpby(d, self.hT, self.h0, L * B * H)

    def _build_backward(self):
        d, s, o = self.dev, self.spec, self._off
        T, B, H, L, V = self.T, self.B, s.hidden, s.layers, s.vocab_size
        R, P = T * B, self.layout.total
        head = o(self._head_name())
        # split-K weight gradients (K = T*B) share one workspace: they run one after another
        sk_w, sk_h = gemm_split_k(d, 3 * H, H, R), gemm_split_k(d, V, H, R)
        self.ws = d.tensor(max(sk_w * 3 * H * H, sk_h * V * H, 1), kind="storage")
        cs = colsum_splits(d, R, 3 * H)
        self.ws_cs = d.tensor(max(cs * 3 * H, 1), kind="storage")
        self.ce_train = CrossEntropy(d, (self.logits, 0), (self.targets, 0), (self.row_loss, 0),
                                     (self.row_flags, 0), self.hyper, R, V, want_grad=True)  # dlogits in place
        self.head_dx = Gemm(d, (self.logits, 0, V), (self.params, head, H), (self.dx, 0, H), R, H, V)
        self.head_dw = Gemm(d, (self.logits, 0, V), (self.x[L], 0, H), (self.grads, head, H), V, H, R,
                            trans_a=True, beta=1.0, split_k=sk_h, workspace=self.ws)
        self.bwd_layers = []
        for l in range(L):
            p = f"layers.{l}."
            gemm_w = lambda dg, x, name, p=p: Gemm(d, (dg, 0, 3 * H), (x, 0, H), (self.grads, o(p + name), H),  # noqa: E731
                                              3 * H, H, R, trans_a=True, beta=1.0, split_k=sk_w, workspace=self.ws)
            k = dict(
                # dout and dx share `dx` (allowed: each row is read before it is written)
                norm=ResidualRmsNormBackward(d, self.x[l], self.o[l], self.params, self.hyper, self.rstd[l],
                                             self.dx, self.dx, self.do, self.grads, T=T, B=B, H=H, layer=l,
                                             g_off=o(p + "norm.weight")),
                gru=GruBackward(d, self.do, self.save[l], self.hprev[l], self.resets, self.params, self.hyper,
                                self.dgi, self.dgh, self.dh0, self.stats, T=T, B=B, H=H,
                                w_off=o(p + "gru.weight_hh"), dh0_off=l * B * H),
                dw_hh=gemm_w(self.dgh, self.hprev[l], "gru.weight_hh"),
                db_ih=ColSum(d, (self.dgi, 0, 3 * H), (self.grads, o(p + "gru.bias_ih")), R, 3 * H, cs, self.ws_cs),
                db_hh=ColSum(d, (self.dgh, 0, 3 * H), (self.grads, o(p + "gru.bias_hh")), R, 3 * H, cs, self.ws_cs))
            if l > 0:  # layer 0's input side goes through table0 (below)
                k.update(dw_ih=gemm_w(self.dgi, self.x[l], "gru.weight_ih"),
                         dx=Gemm(d, (self.dgi, 0, 3 * H), (self.params, o(p + "gru.weight_ih"), H), (self.dx, 0, H),
                                 R, H, 3 * H, beta=1.0))
            self.bwd_layers.append(k)
        self.emb_b = EmbeddingBackward(d, (self.tokens, 0), (self.dx, 0), (self.grads, o("embedding.weight")),
                                       self.hyper, R, V, H)
        # layer 0's input side through table0 (module doc): replaces its dw_ih and dx GEMMs
        w_ih0, emb = o("layers.0.gru.weight_ih"), o("embedding.weight")
        self.table0_b = dict(
            zero=Axpby(d, self.dtable0, self.dtable0, V * 3 * H),
            sum=EmbeddingBackward(d, (self.tokens, 0), (self.dgi, 0), (self.dtable0, 0), self.hyper, R, V, 3 * H,
                                  scale_h=H),
            dw_ih=Gemm(d, (self.dtable0, 0, 3 * H), (self.params, emb, H), (self.grads, w_ih0, H), 3 * H, H, V,
                       trans_a=True, beta=1.0),
            demb=Gemm(d, (self.dtable0, 0, 3 * H), (self.params, w_ih0, H), (self.grads, emb, H), V, H, 3 * H,
                      beta=1.0))
        self.zero_grads = Axpby(d, self.grads, self.grads, P)
        self.grad_norm = GradNorm(d, self.grads, self.stats, P)
        self.opt = Optimizer(d, self.params, self.grads, self.m, self.v, self.decay, self.hyper, self.stats, P,
                             kind=self.optimizer_kind)
        self.spectral = SpectralProject(d, self.params, self.layout, self.u, self.hyper, self.stats)

    def _build_stepwise(self):
        """Row-block kernels for the per-timestep path (built on first use)."""
        self.tf_select = TfSelect(self.dev, self.tokens, self.logits, self.resets, self.hyper, self.stats,
                                  T=self.T, B=self.B, V=self.spec.vocab_size)
        self.emb_row, self.step_layers, self.head_row = self._row_kernels(self.B)

    def stepwise_forward_ops(self) -> list:
        """The forward pass one timestep at a time: choose the input (scheduled sampling), embed it,
        run every layer's projection, recurrent step and norm on that row block, then the head."""
        if not hasattr(self, "tf_select"):
            self._build_stepwise()
        B, ops = self.B, []
        for t in range(self.T):
            row = t * B  # every row-block kernel moves to this timestep's rows
            ops += [self.tf_select.step(t), self.emb_row.op_at(row)]
            for k, f in zip(self.step_layers, self.fwd_layers):
                ops += [k["proj"].op_at(row), f["gru"].step(t), k["norm"].op_at(row)]
            ops.append(self.head_row.op_at(row))
        return ops

    def _stepwise_sequences(self):
        """Scheduled-sampling training and free-running eval sequences (recorded on first use)."""
        if not hasattr(self, "seq_eval_free"):
            data = [self.tokens, self.targets, self.resets]
            fwd = self.stepwise_forward_ops()
            self.seq_eval_free = self._sequence(
                [self.hyper, self.stats] + data,
                fwd + [self.ce_eval.op(), self.loss_reduce.op(), self.carry(1.0, 0.0)], [self.stats])
            if self.training:
                micro = fwd + [self.ce_train.op(), self.loss_reduce.op()] + self.backward_ops() \
                    + [self.carry(1.0, 0.0)]
                self.seq_first_tf = self._sequence([self.hyper, self.stats] + data,
                                                   [self.zero_grads(0.0, 0.0)] + micro)
                self.seq_next_tf = self._sequence([self.hyper] + data, micro)

    # ----------------------------------------------------------------------------- op lists
    def forward_ops(self) -> list:
        """Embedding, every layer (input projection, recurrent sweep, residual+norm), head."""
        ops = [self.emb_f.op()]
        for k in self.fwd_layers:
            ops += k["proj"].ops() + k["gru"].sweep_ops() + k["norm"].ops()
        return ops + self.head_f.ops()

    def backward_ops(self) -> list:
        """Head, then layers top-down (norm, recurrent sweep, batched weight gradients), embedding."""
        ops = self.head_dx.ops() + self.head_dw.ops()
        for k in reversed(self.bwd_layers):
            ops += k["norm"].ops() + k["gru"].sweep_ops()
            for name in ("dw_ih", "dw_hh", "db_ih", "db_hh", "dx"):
                ops += k[name].ops() if name in k else []
        t0 = self.table0_b
        return ops + [self.emb_b.op(), t0["zero"](0.0, 0.0), t0["sum"].op()] + t0["dw_ih"].ops() + t0["demb"].ops()

    def _sequence(self, upload, ops, download=()):
        return self.dev.recorded(ops, upload, download)

    def _record(self):
        data = [self.tokens, self.targets, self.resets]
        fwd = self.forward_ops()
        self.seq_eval = self._sequence([self.hyper, self.stats] + data,
                                       fwd + [self.ce_eval.op(), self.loss_reduce.op(), self.carry(1.0, 0.0)],
                                       [self.stats])
        self.seq_logits = self._sequence([self.hyper, self.stats] + data, fwd + [self.carry(1.0, 0.0)],
                                         [self.logits, self.stats])
        self.seq_set_params = self._sequence([self.params], self.table0_f.ops())  # table0 follows the params
        if not self.training:
            return
        micro = fwd + [self.ce_train.op(), self.loss_reduce.op()] + self.backward_ops() + [self.carry(1.0, 0.0)]
        self.seq_first = self._sequence([self.hyper, self.stats] + data, [self.zero_grads(0.0, 0.0)] + micro)
        self.seq_next = self._sequence([self.hyper] + data, micro)
        self.seq_apply = self._sequence([], self.grad_norm() + [self.opt()] + self.spectral() + self.table0_f.ops(),
                                        [self.stats])

    # ----------------------------------------------------------------------------- host side
    def _sync(self, tensors, to_device: bool):
        kp = self.dev.kp
        op = kp.OpTensorSyncDevice(tensors) if to_device else kp.OpTensorSyncLocal(tensors)
        self._eval(self.dev.sequence(), "an upload" if to_device else "a download", op)

    def _eval(self, seq, what: str, *op) -> None:
        """seq.eval(), with kp's RuntimeError (a failed submit or wait: VK_ERROR_DEVICE_LOST...)
        turned into DeviceLost naming what was running."""
        try:
            seq.eval(*op)
        except RuntimeError as exc:
            raise DeviceLost(f"the Vulkan device ({self.dev.info.name}) failed while running {what}: {exc}",
                             hint="check the driver and the GPU (`catchat doctor`), then start again") from None

    def _put(self, tensor, array, dtype=np.float32):
        host_view(tensor)[:] = np.asarray(array, dtype=dtype).ravel()

    def set_params(self, flat: np.ndarray) -> None:
        """Upload parameters (flat ParamLayout order) and rebuild what derives from them (table0)."""
        self._put(self.params, flat)
        self._eval(self.seq_set_params, "a parameter upload")

    def set_optimizer_state(self, m: np.ndarray, v: np.ndarray, u: np.ndarray | None = None) -> None:
        """Upload Adam moments and (optionally) the spectral-norm vectors."""
        self._put(self.m, m)
        self._put(self.v, v)
        self._put(self.u, spectral_u_init(self.spec) if u is None else u)
        self._sync([self.m, self.v, self.u], True)

    def set_carry(self, h0: np.ndarray | None) -> None:
        """Upload the carried hidden state [L,B,H] (None: zeros)."""
        self._put(self.h0, np.zeros(self.h0.size(), np.float32) if h0 is None else h0)
        self._sync([self.h0], True)

    def read(self, *names: str) -> list[np.ndarray]:
        """Download buffers by attribute name ('params', 'grads', 'h0', 'logits', ...) as host copies."""
        tensors = [getattr(self, n) for n in names]
        self._sync(tensors, False)
        return [host_view(t).copy() for t in tensors]

    def get_params(self) -> np.ndarray:
        return self.read("params")[0]

    def get_optimizer_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return tuple(self.read("m", "v", "u"))

    def get_carry(self) -> np.ndarray:
        L, H = self.spec.layers, self.spec.hidden
        return self.read("h0")[0].reshape(L, self.B, H)

    def _load_data(self, tokens, targets, resets):
        shape = (self.T, self.B)
        for t, a in ((self.tokens, tokens), (self.targets, targets), (self.resets, resets)):
            if np.shape(a) != shape:
                raise ValueError(f"data must be time-major {shape}, got {np.shape(a)}")
            self._put(t, a, np.uint32)

    def _load_hyper(self, words: dict[int, np.uint32]):
        h = host_view(self.hyper)
        h[:] = 0
        for slot, w in words.items():
            h[slot] = w

    def _zero_stats(self):
        host_view(self.stats)[:] = 0

    def _check_sweeps(self, words) -> None:
        """A persistent sweep whose grid barrier gave up computed garbage: say so instead."""
        if words[slots.ST_SYNC_TIMEOUTS]:
            raise DeviceLost(f"a one-dispatch recurrent sweep on {self.dev.info.name} lost its workgroups (they were "
                             "not all resident at once), so this step's results are wrong",
                             hint="run with CATCHAT_PERSISTENT=0 (one dispatch per timestep) and report the GPU")

    def _stats(self, n_valid: int) -> StepStats:
        w = host_view(self.stats).copy()
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
        """The hyper buffer for one micro-batch of optimizer step global_step + 1."""
        f = slots.f32_bits
        t = global_step + 1 if opt_t is None else opt_t
        words = optimizer_hyper_words(hp.optimizer, t, hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay,
                                      hp.clip, hp.spectral_bound)
        words.update({
            slots.HP_SEED: np.uint32(step_seed(hp.run_seed, global_step, micro_batch)),
            slots.HP_N_VALID: np.uint32(n_valid), slots.HP_INV_N_VALID: f(1.0 / n_valid if n_valid else 0.0),
            slots.HP_P_EMB: f(hp.dropout_embedding), slots.HP_P_HID: f(hp.dropout_hidden),
            slots.HP_SMOOTHING: f(hp.label_smoothing), slots.HP_GRADH_CLAMP: f(hp.gradh_clamp),
            slots.HP_TF: f(tf), slots.HP_TF_TOPK: np.uint32(hp.tf_top_k),
        })
        return words

    def train_step(self, micro_batches, hp: StepHyper, *, global_step: int, opt_t: int | None = None,
                   tf: float = 1.0, stepwise: bool | None = None) -> StepStats:
        """One optimizer step over micro-batches [(tokens, targets, resets) time-major [T,B]].

        The valid-target count is taken from the data on the host (lesson 10); a step with none,
        or with a non-finite gradient norm, is not applied (StepStats.skipped). tf < 1 runs the
        forward pass one timestep at a time with scheduled sampling (docs/model.md); `stepwise`
        forces that path (True) or the batched one (False) whatever tf is.
        """
        if not self.training:
            raise ValueError("this program was built with training=False")
        if hp.optimizer != self.optimizer_kind:
            raise ValueError(f"program was built for {self.optimizer_kind}, step asks for {hp.optimizer}")
        n_valid = sum(count_valid(tg) for _, tg, _ in micro_batches)
        if (tf < 1.0) if stepwise is None else stepwise:
            self._stepwise_sequences()
            first, nxt = self.seq_first_tf, self.seq_next_tf
        else:
            first, nxt = self.seq_first, self.seq_next
        for k, (tok, tg, rs) in enumerate(micro_batches):
            self._load_data(tok, tg, rs)
            self._load_hyper(self.hyper_words(hp, global_step=global_step, micro_batch=k, n_valid=n_valid,
                                              opt_t=opt_t, tf=tf))
            if k == 0:
                self._zero_stats()
                self._eval(first, f"training step {global_step + 1} (micro-batch 1)")
            else:
                self._eval(nxt, f"training step {global_step + 1} (micro-batch {k + 1})")
        self._eval(self.seq_apply, f"training step {global_step + 1} (optimizer)")
        return self._stats(n_valid)

    def forward_logits(self, tokens, resets) -> np.ndarray:
        """Forward one window without dropout and return logits [T,B,V]; carries the state."""
        self._load_data(tokens, np.zeros((self.T, self.B), np.uint32), resets)
        self._load_hyper({})
        self._zero_stats()
        self._eval(self.seq_logits, "a forward pass")
        self._check_sweeps(host_view(self.stats))
        return host_view(self.logits).reshape(self.T, self.B, self.spec.vocab_size).copy()

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

    def evaluate_windows(self, windows, *, free_running: bool = False) -> dict:
        """Plain cross-entropy over windows [(tokens, targets, resets) time-major [T,B]] in order,
        the state carried from one to the next, starting from zero: loss (nats/char), bpc, top-1 and
        top-5 rates, valid targets, windows. Leaves the carried state where the windows end."""
        self.set_carry(None)
        loss_sum, n_valid, top1, top5, count = 0.0, 0, 0, 0, 0
        for tokens, targets, resets in windows:
            st = self.eval_window(tokens, targets, resets, free_running=free_running)
            loss_sum += st.loss * st.n_valid
            n_valid += st.n_valid
            top1 += st.top1
            top5 += st.top5
            count += 1
        loss = loss_sum / n_valid if n_valid else float("nan")
        return dict(loss=loss, bpc=loss / math.log(2.0), top1=top1 / max(n_valid, 1), top5=top5 / max(n_valid, 1),
                    n_valid=n_valid, windows=count)
