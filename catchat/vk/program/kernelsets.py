"""The program's kernels, bound to its buffers: typed sets for the forward pass, the backward
pass + optimizer, and the per-timestep (row-block) forward.

Forward per layer: input projection for all timesteps (layer 0: a gather from table0, the
per-token projection E @ W_ih0^T, plus b_ih0), the recurrent sweep, residual + RMSNorm. Backward
per layer (top-down): norm backward, recurrent sweep backward, then the weight gradients as GEMMs
over all timesteps (split-K), bias gradients as column sums, the input gradient as one GEMM.
Layer 0's input side goes through table0: dtable0 = dGi0 summed by token, then dW_ih0 +=
dtable0^T E and dE += dtable0 W_ih0 ([V]-sized GEMMs instead of [T*B]-sized ones).

precision "fp16" (train.precision, docs/training.md "Mixed precision"): every GEMM here multiplies
its operands rounded to float16 (float32 sums; `Gemm(precision=...)`); sweeps, norms, loss and
optimizer stay float32. The loss gradient then carries the loss scale S (HP_LOSS_SCALE), and
`BackwardKernels.unscale` multiplies the weight gradients (and dh0) by 1/S before the grad norm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from catchat.model import ParamLayout, head_name
from catchat.vk import slots
from catchat.vk.device import Device
from catchat.vk.kernels import Axpby, FragOrder, ToHalf
from catchat.vk.kernels.embedding import EmbeddingBackward, EmbeddingForward
from catchat.vk.kernels.gemm import ColSum, Gemm
from catchat.vk.kernels.gru import (
    GruBackward,
    GruForward,
    resident_split_forward,
    split_forward,
    state_rows,
    stream_f32_sweep,
    streams_backward,
    streams_forward,
    sweep_bias_sums,
    w16_blocked,
)
from catchat.vk.kernels.loss import CrossEntropy, LossReduce
from catchat.vk.kernels.norm import ResidualRmsNormBackward, ResidualRmsNormForward
from catchat.vk.kernels.optim import GradNorm, Optimizer, SpectralProject
from catchat.vk.kernels.sampling import TfSelect
from catchat.vk.program.plan import Buffers, Geometry, forward_w_frag


@dataclass
class RowKernels:
    """The per-row forward kernels over `rows` rows (T*B for the batched pass, B for one timestep
    of the per-timestep pass, which moves them along with op_at)."""

    embedding: EmbeddingForward  # x[0] = scaled embedding rows
    proj: list[EmbeddingForward | Gemm]  # per layer: gi = x[l] W_ih^T + b_ih (layer 0: gather from table0)
    norm: list[ResidualRmsNormForward]  # per layer: x[l+1] = RMSNorm(x[l] + o[l])
    head: Gemm  # logits = x[L] W_head^T


@dataclass
class ForwardKernels:
    rows: RowKernels  # over T*B rows
    gru: list[GruForward]  # per layer: the recurrent sweep
    table0: Gemm  # table0 = E W_ih0^T (after every parameter change)
    cross_entropy: CrossEntropy  # plain (eval)
    loss_reduce: LossReduce
    carry: Axpby  # h0 = hT
    w16: object = None  # the streamed sweeps' float16 copy of every layer's W_hh [L,3H,H] (None: not streamed)
    w16_refresh: list = field(default_factory=list)  # per layer: W_hh -> w16 (after every parameter change)
    w16_split: object = None  # the split forward's hi and lo of each W_hh [L,2,3H,H] (gru.split_forward)

    def derived_ops(self) -> list:
        """What follows the parameters: table0 and, for streamed sweeps, W_hh's float16 copy (the split
        forward's: its hi and lo)."""
        return self.table0.ops() + [op for k in self.w16_refresh for op in k.ops()]


@dataclass
class BackwardLayer:
    norm: ResidualRmsNormBackward
    gru: GruBackward
    dw_hh: Gemm
    db_ih: ColSum
    db_hh: ColSum
    dw_ih: Gemm | None = None  # layers > 0 (layer 0's goes through table0)
    dx: Gemm | None = None  # layers > 0
    dw_hh_n: Gemm | None = None  # save16: dW_hh's n rows from dgh_n (dw_hh then takes r, z from dGi)
    db_hh_n: ColSum | None = None  # save16: db_hh's n third from dgh_n

    def weight_grad_gemms(self) -> list[Gemm]:
        """The layer's weight-gradient GEMMs after its sweep, in recorded order."""
        return [k for k in (self.dw_ih, self.dw_hh, self.dw_hh_n) if k is not None]

    def bias_grad_ops(self) -> list:
        return self.db_ih.ops() + self.db_hh.ops() + (self.db_hh_n.ops() if self.db_hh_n else [])


@dataclass
class Table0Backward:
    zero: Axpby  # dtable0 = 0
    sum: EmbeddingBackward  # dtable0 += dGi0 by token
    dw_ih: Gemm  # dW_ih0 += dtable0^T E
    demb: Gemm  # dE += dtable0 W_ih0


@dataclass
class BackwardKernels:
    """The backward pass and the optimizer step."""

    cross_entropy: CrossEntropy  # with label smoothing; dlogits in place
    head_dx: Gemm
    head_dw: Gemm
    layers: list[BackwardLayer]  # in layer order (recorded top-down)
    embedding: EmbeddingBackward
    table0: Table0Backward
    zero_grads: Axpby
    grad_norm: GradNorm
    optimizer: Optimizer
    spectral: SpectralProject
    unscale: list[Axpby]  # fp16: grads and dh0 *= hyper[HP_GRAD_UNSCALE] before the grad norm; fp32: none
    overlap_dw_hh: bool = False  # Geometry.overlap_dw_hh (sequences.dw_hh_beside: where dW_hh is recorded)

    def token_sum_ops(self) -> list:
        """The embedding's and table0's token sums, in order (dtable0 zeroed before its sums)."""
        t0 = self.table0
        return [*self.embedding.ops(), t0.zero(0.0, 0.0), *t0.sum.ops()]


@dataclass
class StepwiseKernels:
    """The per-timestep forward: the input choice (scheduled sampling) and row-block kernels over
    B rows; the recurrent steps are the batched sweep's `step(t)`."""

    tf_select: TfSelect
    rows: RowKernels


def build_rows(dev: Device, layout: ParamLayout, b: Buffers, g: Geometry, rows: int,
               precision: str = "fp32", split: bool = True) -> RowKernels:
    """The forward's row kernels over `rows` rows; split: the GEMMs split over K as the geometry
    says (a forward of a few rows: `ws` holds the partials), not for the per-timestep path's row
    blocks (`op_at`)."""
    o, H, V = layout.offsets, g.H, g.V
    s_proj, s_logits = (g.split_proj, g.split_logits) if split else (1, 1)
    emb = EmbeddingForward(dev, (b.tokens, 0), (b.params, o["embedding.weight"]), (b.x[0], 0), b.hyper, rows, V, H)
    proj, norm = [], []
    for l in range(g.L):
        p = f"layers.{l}."
        if l == 0:  # a gather from table0
            proj.append(EmbeddingForward(dev, (b.tokens, 0), (b.table0, 0), (b.gi, 0), b.hyper, rows, V, 3 * H,
                                         scale_h=H, bias=(b.params, o[p + "gru.bias_ih"])))
        else:
            proj.append(Gemm(dev, (b.x[l], 0, H), (b.params, o[p + "gru.weight_ih"], H), (b.gi, 0, 3 * H),
                             rows, 3 * H, H, trans_b=True, bias=(b.params, o[p + "gru.bias_ih"]),
                             split_k=s_proj, workspace=b.ws, precision=precision))
        norm.append(ResidualRmsNormForward(dev, b.x[l], b.o[l], b.params, b.hyper, b.x[l + 1], b.rstd[l],
                                           T=rows // g.B, B=g.B, H=H, layer=l, g_off=o[p + "norm.weight"],
                                           eps=layout.spec.norm_eps, o_off=state_rows(g.B, H)))
    head = Gemm(dev, (b.x[g.L], 0, H), (b.params, o[head_name(layout.spec)], H), (b.logits, 0, V), rows, V, H,
                trans_b=True, split_k=s_logits, workspace=b.ws, precision=precision)
    return RowKernels(emb, proj, norm, head)


def build_forward(dev: Device, layout: ParamLayout, b: Buffers, g: Geometry, precision: str = "fp32"
                  ) -> ForwardKernels:
    o, T, B, H, V = layout.offsets, g.T, g.B, g.H, g.V
    rows = build_rows(dev, layout, b, g, g.R, precision)
    table0 = Gemm(dev, (b.params, o["embedding.weight"], H), (b.params, o["layers.0.gru.weight_ih"], H),
                  (b.table0, 0, 3 * H), V, 3 * H, H, trans_b=True, precision=precision)
    # o[l]'s row 0 is hprev[0], rows 1.. the outputs (plan.py)
    products = g.products  # fp16 on tensor cores: the sweeps' products too (gru.program_products)
    coop, w16, refresh = products is not None, None, []
    frag = forward_w_frag(products)  # the forward's own copy in fragment order, beside the blocked one
    if streams_backward(products):  # W_hh streamed from a float16 copy ("mixed": the backward's alone)
        w16, refresh = whh_halves(dev, layout, b, g, split=False, frag=frag)
    # fp32 where W_hh fits no chip: streamed on the FMAs, or the forward on tensor cores from float16 splits
    split = split_forward(dev, B, H, precision)
    f32 = stream_f32_sweep(dev, B, H, False, precision) and not split
    w_fwd = w16 if streams_forward(products) else None  # "mixed": the forward keeps W_hh on chip
    w_split = None
    if split:
        w_split, split_refresh = whh_halves(dev, layout, b, g, split=True)
        w_fwd, refresh = w_split, refresh + split_refresh
    # fp32 where W_hh fits on chip: the resident forward on tensor cores from float16 splits, where asked
    rsplit = not split and resident_split_forward(dev, B, H, precision)
    gru = [GruForward(dev, b.gi, b.params, b.h0, b.resets, b.o[l], b.o[l], b.save[l], b.hT, T=T, B=B, H=H,
                      w_off=whh_offset(layout, l, w_fwd, split, frag), b_off=o[f"layers.{l}.gru.bias_hh"],
                      h0_off=l * B * H, o_off=state_rows(B, H), hprev_off=0, hT_off=l * B * H, stats=b.stats,
                      coop=coop or rsplit, w_half=w_fwd, stream_f32=f32, save_half=g.save16,
                      split=split or rsplit, w_frag=frag)
           for l in range(g.L)]
    ce = CrossEntropy(dev, (b.logits, 0), (b.targets, 0), (b.row_loss, 0), (b.row_flags, 0), b.hyper, g.R, V,
                      want_grad=False)
    reduce = LossReduce(dev, (b.row_loss, 0), (b.row_flags, 0), b.stats, g.R)
    return ForwardKernels(rows, gru, table0, ce, reduce, Axpby(dev, b.hT, b.h0, g.L * B * H), w16, refresh, w_split)


def whh_halves(dev: Device, layout: ParamLayout, b: Buffers, g: Geometry, split: bool, frag: bool = False):
    """Every layer's W_hh as float16 for the streamed sweeps, in 16 x 16 blocks where blocked (a fragment
    is one run of memory), and the kernels that refresh it after every parameter change: layer l at
    l * 3H*H halves, or with split its hi and then its lo (`ToHalf(lo=True)`) at 2l * 3H*H. frag (not
    split; blocked): then every layer's blocks again in the forward's fragment order (`FragOrder`, col),
    layer l's at (L + l) * 3H*H (`whh_offset`)."""
    H, parts, n = g.H, (False, True) if split else (False,), 3 * g.H * g.H
    w = dev.tensor((g.L * len(parts) + (g.L if frag else 0)) * n // 2, np.uint32)
    cols = H if w16_blocked() else 0
    refresh = [ToHalf(dev, b.params, w, n, x_off=layout.offsets[f"layers.{l}.gru.weight_hh"],
                      y_off=(len(parts) * l + lo) * n, block_cols=cols, lo=lo)
               for l in range(g.L) for lo in parts]
    if frag:
        refresh += [FragOrder(dev, w, n // 256, l * n, (g.L + l) * n, col=True) for l in range(g.L)]
    return w, refresh


def whh_offset(layout: ParamLayout, layer: int, w16, split: bool = False, frag: bool = False) -> int:
    """Where a sweep reads layer `layer`'s W_hh: in params (words), or in the float16 copy w16 (halves;
    with split, the hi and lo copy; with frag, the forward's copy in fragment order: `whh_halves`)."""
    if w16 is None:
        return layout.offsets[f"layers.{layer}.gru.weight_hh"]
    first = layout.spec.layers if frag else 0
    return ((2 if split else 1) * layer + first) * 3 * layout.spec.hidden ** 2


def build_backward(dev: Device, layout: ParamLayout, b: Buffers, g: Geometry, optimizer: str,
                   precision: str = "fp32", coop: bool = False, w16=None) -> BackwardKernels:
    """coop: the sweeps' products on tensor cores, as the forward's (`build_forward`: the twin rounds
    both directions' products or neither); w16: the forward's float16 W_hh (streamed sweeps)."""
    o, T, B, H, L, V, R = layout.offsets, g.T, g.B, g.H, g.L, g.V, g.R
    pr = precision
    head = o[head_name(layout.spec)]
    f32 = stream_f32_sweep(dev, B, H, True, pr)  # as the forward's
    dgi, do = b.gi, b.x[L]  # the second roles of gi and x[L] (plan.py); dGh over save[l], or its n third in dgh_n
    ce = CrossEntropy(dev, (b.logits, 0), (b.targets, 0), (b.row_loss, 0), (b.row_flags, 0), b.hyper, R, V,
                      want_grad=True)  # dlogits in place
    head_dx = Gemm(dev, (b.logits, 0, V), (b.params, head, H), (b.dx, 0, H), R, H, V, precision=pr)
    # split-K partials in dead buffers where they fit (plan.py): the head's in gi, the layers' in x[L]
    ws_head, ws_layers = b.gi if g.split_in_gi else b.ws, b.x[L] if g.split_in_x else b.ws
    head_dw = Gemm(dev, (b.logits, 0, V), (b.x[L], 0, H), (b.grads, head, H), V, H, R, trans_a=True, beta=1.0,
                   split_k=g.split_head, workspace=ws_head, precision=pr)
    layers = []
    for l in range(L):
        p = f"layers.{l}."

        def gemm_w(dg, x, name, rows=3 * H, first=0, p=p, ws=ws_layers, split=g.split_w):
            """Rows [first, first + rows) of a weight gradient over all timesteps, split over K; dg
            (tensor, off, ld)."""
            return Gemm(dev, dg, (x, 0, H), (b.grads, o[p + name] + first * H, H), rows, H, R, trans_a=True,
                        beta=1.0, split_k=split, workspace=ws, precision=pr)

        def colsum(dg, name, cols=3 * H, first=0, p=p):  # entries [first, first + cols) of a bias gradient
            return ColSum(dev, dg, (b.grads, o[p + name] + first), R, cols, g.colsum, b.ws_cs)

        # hprev = rows [0, T) of o[l], reset rows zeroed by the sweep; dGh written over save[l], or
        # with save16 its n third into dgh_n and its r, z thirds read from dGi (plan.py)
        sweep = GruBackward(dev, do, b.save[l], b.o[l], b.resets, b.params, b.hyper, dgi, b.dgh_n, b.dh0,
                            b.stats, T=T, B=B, H=H, w_off=whh_offset(layout, l, w16), dh0_off=l * B * H, coop=coop,
                            w_half=w16, stream_f32=f32, save_half=g.save16, bias_sums=sweep_bias_sums())
        # dout and dx share `dx` (allowed: each row is read before it is written)
        norm = ResidualRmsNormBackward(dev, b.x[l], b.o[l], b.params, b.hyper, b.rstd[l], b.dx, b.dx, do, b.grads,
                                       T=T, B=B, H=H, layer=l, g_off=o[p + "norm.weight"], o_off=state_rows(B, H))
        # dGh's rows over save (r, z, n), or with save16 dGi's r and z, then dgh_n's n third apart
        dgh, rows = ((dgi, 0, 3 * H), 2 * H) if g.save16 else ((b.save[l], 0, 4 * H), 3 * H)
        # beside the sweep below (overlap_dw_hh), dW_hh's partials cannot go to x[L]: that sweep reads do there
        ws_hh = b.ws if g.overlap_dw_hh else ws_layers
        if sweep.bias_sums is not None:  # the sweep summed them over the steps: column sums over its B rows
            bs = sweep.bias_sums
            db = [ColSum(dev, (bs, q * 3 * H, 6 * H), (b.grads, o[p + name]), B, 3 * H)
                  for q, name in enumerate(("gru.bias_ih", "gru.bias_hh"))]
        else:
            db = [colsum((dgi, 0, 3 * H), "gru.bias_ih"), colsum(dgh, "gru.bias_hh", rows)]
        k = BackwardLayer(norm, sweep, gemm_w(dgh, b.o[l], "gru.weight_hh", rows, ws=ws_hh), *db)
        if g.save16:
            k.dw_hh_n = gemm_w((b.dgh_n, 0, H), b.o[l], "gru.weight_hh", H, 2 * H, ws=ws_hh, split=g.split_wn)
            if sweep.bias_sums is None:
                k.db_hh_n = colsum((b.dgh_n, 0, H), "gru.bias_hh", H, 2 * H)
        if l > 0:  # layer 0's input side goes through table0 (below)
            k.dw_ih = gemm_w((dgi, 0, 3 * H), b.x[l], "gru.weight_ih")
            k.dx = Gemm(dev, (dgi, 0, 3 * H), (b.params, o[p + "gru.weight_ih"], H), (b.dx, 0, H), R, H, 3 * H,
                        beta=1.0, precision=pr)
        layers.append(k)
    emb_b = EmbeddingBackward(dev, (b.tokens, 0), (b.dx, 0), (b.grads, o["embedding.weight"]), b.hyper, R, V, H)
    w_ih0, emb = o["layers.0.gru.weight_ih"], o["embedding.weight"]
    table0 = Table0Backward(
        zero=Axpby(dev, b.dtable0, b.dtable0, V * 3 * H),
        sum=EmbeddingBackward(dev, (b.tokens, 0), (dgi, 0), (b.dtable0, 0), b.hyper, R, V, 3 * H, scale_h=H),
        dw_ih=Gemm(dev, (b.dtable0, 0, 3 * H), (b.params, emb, H), (b.grads, w_ih0, H), 3 * H, H, V, trans_a=True,
                   beta=1.0, precision=pr),
        demb=Gemm(dev, (b.dtable0, 0, 3 * H), (b.params, w_ih0, H), (b.grads, emb, H), V, H, 3 * H, beta=1.0,
                  precision=pr))
    P = g.P
    unscale = [] if pr == "fp32" else [Axpby(dev, t, t, n, hyper_a=(b.hyper, slots.HP_GRAD_UNSCALE))
                                       for t, n in ((b.grads, P), (b.dh0, L * B * H))]
    return BackwardKernels(
        cross_entropy=ce, head_dx=head_dx, head_dw=head_dw, layers=layers, embedding=emb_b, table0=table0,
        zero_grads=Axpby(dev, b.grads, b.grads, P), grad_norm=GradNorm(dev, b.grads, b.stats, P),
        optimizer=Optimizer(dev, b.params, b.grads, b.m, b.v, b.decay, b.hyper, b.stats, P, kind=optimizer),
        spectral=SpectralProject(dev, b.params, layout, b.u, b.hyper, b.stats), unscale=unscale,
        overlap_dw_hh=g.overlap_dw_hh)


def build_stepwise(dev: Device, layout: ParamLayout, b: Buffers, g: Geometry, precision: str = "fp32"
                   ) -> StepwiseKernels:
    tf = TfSelect(dev, b.tokens, b.logits, b.resets, b.hyper, b.stats, T=g.T, B=g.B, V=g.V)
    return StepwiseKernels(tf, build_rows(dev, layout, b, g, g.B, precision, split=False))
