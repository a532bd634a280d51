"""The buffer plan: every device buffer of a Program, declared once.

`Buffers` is the plan. Each field is one buffer (one name per buffer, no aliases) and carries its
dtype, shape (in the dimensions of `Geometry`), whether it is one buffer or one per layer, and
which programs need it. `allocate` makes exactly these buffers; `planned_bytes` adds up exactly
these sizes (plus the scratch the kernels allocate for themselves, `kernel_scratch`), so the
memory estimate and the allocation cannot drift apart. Shapes are time-major (docs/model.md).

Programs: "eval" (teacher-forced eval and the logits pass of generation), "stepwise" (the
per-timestep forward: scheduled-sampling training and free-running eval; it reuses the batched
buffers one row block at a time and needs none of its own) and "train" (backward and optimizer).
A forward-only Program (training=False) allocates only what "eval" or "stepwise" need.

Buffers serve more than one role in turn (one name each; `doc` names every role). Three take a
gradient in the backward pass: `gi` holds the gate gradients dGi (nothing reads the forward's
input projections after the forward), `x[L]` holds do, the gradient on a GRU output (its last
reader, the head's weight gradient, runs before the first norm backward writes do), and each
layer's `save` takes that layer's recurrent gate gradients dGh over its r, z, n (rows stay 4H
apart; the dW_hh GEMM and the db_hh column sums read them there): in the backward sweep each
element's gate backward reads its r, z, n, ghn and then writes its dGh on those words, nothing
reads save[l] after that (z travels on in the sweep's own dhz scratch), and the next forward
rewrites it. With `save16` (the streamed fp16 sweeps: v5) the saves are float16, half the bytes of
the largest buffers a step keeps, and dGh goes elsewhere: its r and z thirds are dGi's (r and z
take gi + gh, so their gradients are one number), so the sweep writes only its n third, r * dan,
into `dgh_n` [T,B,H] (one buffer: the layers' sweeps run one after another), and W_hh's weight and
bias gradients take rows [0, 2H) from gi and [2H, 3H) from dgh_n.

One buffer holds two views at once: `o[l]` has T+1 row blocks, row 0 the state entering the
window (after its reset) and row t+1 the GRU output of step t, so rows [0, T) are the states
entering each step (hprev, which the backward sweep and the dW_hh GEMM read) and rows [1, T+1)
the outputs (which the norm reads, at o_off = B*H): the state entering step t >= 1 is o[t-1], so
it is not stored twice. The one difference, a reset (the state entering t is 0, not o[t-1]), is
applied by the backward sweep, which also zeroes such a row in place once the norm backward has
read it, before the dW_hh GEMM. Hidden dropout does not touch o (the norm applies it on the way
in), so o is the recurrent state itself. The carry stays in h0/hT ([L,B,H]), as checkpoints,
set_carry and the decoder expect. Nothing in o or save outlives a micro-batch: the forward writes
every row before anything reads it, so a resumed run computes what an unbroken one does.

x[L] and gi also lend their words to the split-K partials of the weight gradients: a layer's
(dW_ih, dW_hh, after its sweep) go to x[L], whose do the sweep has used up and the next norm
backward rewrites; the head's (dW_head, before the first norm backward) to gi, whose projections
the forward has used up and whose dGi the first sweep writes. `ws` holds only what does not fit
there (`Geometry.ws_words`), and the dW_hh partials of a layer whose GEMM runs beside the sweep
below it (`Geometry.overlap_dw_hh`: that sweep reads do from x[L] meanwhile).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from catchat.model import ParamLayout, spectral_u_init
from catchat.vk import slots
from catchat.vk.device import Device
from catchat.vk.kernels.embedding import EmbeddingBackward
from catchat.vk.kernels.gemm import colsum_splits, gemm_split_k, short_split_k
from catchat.vk.kernels.gru import (
    backward_scratch_words,
    program_products,
    split_forward,
    stream_f32_sweep,
    stream_tiles,
    streams_backward,
    streams_forward,
    sync_words,
    w_frag_order,
)
from catchat.vk.kernels.gru.stream import shadow_words
from catchat.vk.kernels.norm import ResidualRmsNormBackward
from catchat.vk.kernels.optim import GradNorm, SpectralProject, decay_word_count, decay_words
from catchat.vk.program.grad_slices import GradStages
from catchat.vk.switches import env_switch

Tensor = Any  # a kp tensor
F32, U32 = np.float32, np.uint32
EVAL, STEPWISE, TRAIN = "eval", "stepwise", "train"
EVERY = (EVAL, STEPWISE, TRAIN)  # the forward pass's buffers: every program reads or writes them
TRAINING = (TRAIN,)


def saves_half(products: str | None) -> bool:
    """Whether a program of this sweep design keeps float16 saves and dGh's n third apart in dgh_n: where
    the streamed fp16 sweeps run with float16 saves ("stream"; "stream32" keeps float32 ones)."""
    return products == "stream"


@dataclass(frozen=True)
class Geometry:
    """The sizes a Program's buffers are made of: window T, lanes B, model sizes, the flat
    parameter count P, and the GPU's split-K / column-sum splits of the backward pass (1 on a CPU
    device, with dev=None, or for a forward-only program)."""

    T: int
    B: int
    H: int
    L: int
    V: int
    P: int
    split_w: int = 1  # the [3H,H] weight gradients over K = T*B
    split_wn: int = 1  # dW_hh's n third [H,H] over K = T*B where dGh's n third is apart (`save16`): a third
    # of the output tiles, so its own split (v5 at fp16: 2, where unsplit it fell to the small tile)
    split_head: int = 1  # the head's [V,H] weight gradient over K = T*B
    colsum: int = 1  # row splits of the bias gradients' column sums
    split_proj: int = 1  # the forward's input projections [R,3H] over K = H: only where R is a few rows
    split_logits: int = 1  # the head's logits [R,V] over K = H, likewise (generation's batched step)
    products: str | None = None  # how the sweeps' products multiply (gru.program_products): "stream" keeps
    # float16 saves and dGh's n third in dgh_n (`save16`); "mixed" streams the backward alone; "stream32"
    # streams both with float32 saves
    overlap_dw_hh: bool = False  # layer l's dW_hh GEMM beside layer l-1's backward sweep (`overlaps_dw_hh`)

    @classmethod
    def of(cls, layout: ParamLayout, T: int, B: int, dev: Device | None, training: bool = True,
           precision: str = "fp32") -> Geometry:
        s, T, B = layout.spec, int(T), int(B)
        H, V, R = s.hidden, s.vocab_size, T * B
        gpu = dev is not None and training
        products = None if dev is None else program_products(dev, B, H, s.layers, precision, training)
        return cls(T, B, H, s.layers, V, layout.total,
                   split_w=gemm_split_k(dev, 3 * H, H, R) if gpu else 1,
                   split_wn=gemm_split_k(dev, H, H, R) if gpu and saves_half(products) else 1,
                   split_head=gemm_split_k(dev, V, H, R) if gpu else 1,
                   colsum=colsum_splits(dev, R, 3 * H) if gpu else 1,
                   split_proj=short_split_k(dev, R, 3 * H, H) if dev is not None else 1,
                   split_logits=short_split_k(dev, R, V, H) if dev is not None else 1,
                   products=products, overlap_dw_hh=gpu and overlaps_dw_hh(dev, products, s.layers))

    @property
    def save16(self) -> bool:
        """The saves as float16 and dGh's n third in dgh_n (`saves_half`)."""
        return saves_half(self.products)

    @property
    def R(self) -> int:
        """Rows of a window: T*B."""
        return self.T * self.B

    @property
    def split_in_x(self) -> bool:
        """The layers' split-K partials ([split_w, 3H, H], [split_wn, H, H]) fit in x[L] [T,B,H] (plan.py's
        docstring)."""
        return self.layer_split_words() <= self.R * self.H

    def layer_split_words(self) -> int:
        """Words of the largest of a layer's weight gradients' split-K partials (0 where none is split)."""
        return max(self.split_w * 3 * self.H * self.H if self.split_w > 1 else 0,
                   self.split_wn * self.H * self.H if self.split_wn > 1 else 0)

    @property
    def split_in_gi(self) -> bool:
        """The head's split-K partials [split_head, V, H] fit in gi [T,B,3H]."""
        return self.split_head * self.V * self.H <= self.R * 3 * self.H

    def ws_words(self) -> int:
        """Words of `ws`: the weight gradients' split-K partials that fit neither x[L] nor gi, and the
        forward's (1 word when all fit, or nothing is split)."""
        in_x = self.split_in_x and not self.overlap_dw_hh
        layers = 0 if in_x else self.layer_split_words()
        head = 0 if self.split_head == 1 or self.split_in_gi else self.split_head * self.V * self.H
        proj = 0 if self.split_proj == 1 else self.split_proj * self.R * 3 * self.H
        logits = 0 if self.split_logits == 1 else self.split_logits * self.R * self.V
        return max(layers, head, proj, logits, 1)

    def dim(self, name: str) -> int:
        """A dimension by name, with an optional multiplier: 'H', '3H', 'HP' (hyper words),
        'ST' (stats words), 'SV' (words of a save row: 4H floats, or 4H halves with save16),
        'WS' / 'WSCS' (the split-K and column-sum workspaces), 'DR' (the
        optimizer's decay runs), 'L+1', 'T+1', or a number."""
        if name in ("L+1", "T+1"):
            return getattr(self, name[0]) + 1
        if name.isdigit():
            return int(name)
        m = re.fullmatch(r"(\d*)([A-Z]+)", name)
        if m is None:
            raise ValueError(f"bad dimension {name!r}")
        named = {"HP": slots.HP_WORDS, "ST": slots.ST_WORDS, "SV": 2 * self.H if self.save16 else 4 * self.H,
                 "WS": self.ws_words(),
                 "WSCS": max(self.colsum * 3 * self.H, 1), "DR": decay_word_count(self.L)}
        base = named[m[2]] if m[2] in named else getattr(self, m[2])
        return int(m[1] or 1) * base

    def words(self, shape: str) -> int:
        return int(np.prod([self.dim(d) for d in shape.split()], dtype=np.int64))


@dataclass(frozen=True)
class BufferSpec:
    """One buffer of the plan: shape (dimension names), element type, one per layer ('L', 'L+1')
    or a single buffer (''), kp kind ('storage': device-only), the programs that need it, and
    its contents at creation (None: zeros; else a function of the layout, uploaded once)."""

    shape: str
    dtype: type = F32
    per: str = ""
    kind: str = "device"
    programs: tuple[str, ...] = EVERY
    init: Callable[[ParamLayout], np.ndarray] | None = None
    doc: str = ""
    when: str = ""  # a Geometry flag the buffer is made for ('' = always)

    def needed(self, training: bool, g: Geometry) -> bool:
        return any(p != TRAIN or training for p in self.programs) and (not self.when or getattr(g, self.when))

    def count(self, g: Geometry) -> int:
        """Buffers of this entry: 1, or one per layer (plus one)."""
        return g.dim(self.per) if self.per else 1

    def nbytes(self, g: Geometry) -> int:
        return self.count(g) * g.words(self.shape) * np.dtype(self.dtype).itemsize


def buf(shape: str, dtype=F32, **kw) -> Any:
    """A field of `Buffers` carrying its BufferSpec (None until allocated, or when not needed)."""
    return field(default=None, metadata={"plan": BufferSpec(shape, dtype, **kw)})


@dataclass
class Buffers:
    """Every buffer of a Program, in allocation order (a per-layer entry is a list)."""

    params: Tensor = buf("P", doc="the parameters, flat ParamLayout order")
    hyper: Tensor = buf("HP", U32, doc="per-step scalars (slots.py): lr, Adam's t, seed, 1/N_valid, ...")
    stats: Tensor = buf("ST", U32, doc="what the GPU reports (slots.py): loss sum, top-1/5, grad norm, ...")
    tokens: Tensor = buf("T B", U32)
    targets: Tensor = buf("T B", U32)
    resets: Tensor = buf("T B", U32, doc="1 = the state entering this step is zero")
    h0: Tensor = buf("L B H", doc="carried state in")
    hT: Tensor = buf("L B H", doc="state after the window (copied into h0: the carry)")
    x: list[Tensor] = buf("T B H", per="L+1", doc="the embedding's output, then each norm's; x[L] holds do "
                                                   "(gradient on a GRU output) in the backward, and a "
                                                   "layer's split-K partials after its sweep")
    o: list[Tensor] = buf("T+1 B H", per="L", doc="the state sequence: row 0 the state entering the window, "
                                                 "row t+1 the GRU output of step t; rows [0, T) are hprev")
    save: list[Tensor] = buf("T B SV", per="L", doc="r, z, n, W_hn h + b_hn per step (float16 with save16); "
                                                    "dGh over r, z, n in the backward (rows 4H apart), "
                                                    "but for save16")
    dgh_n: Tensor = buf("T B H", programs=TRAINING, when="save16",
                        doc="dGh's n third of the layer being run (save16: its r and z thirds are dGi's)")
    rstd: list[Tensor] = buf("T B", per="L", doc="RMSNorm 1/rms")
    gi: Tensor = buf("T B 3H", doc="input projections of the layer being run; the head's split-K partials, "
                                   "then dGi of the layer being run in the backward")
    table0: Tensor = buf("V 3H", kind="storage", doc="layer 0's input projection per token: E @ W_ih0^T")
    logits: Tensor = buf("T B V", doc="dlogits overwrite them in training")
    row_loss: Tensor = buf("T B", doc="per-row loss, reduced into stats")
    row_flags: Tensor = buf("T B", U32, doc="per-row valid / top-1 / top-5 flags")
    grads: Tensor = buf("P", programs=TRAINING)
    m: Tensor = buf("P", programs=TRAINING, doc="Adam's first moments")
    v: Tensor = buf("P", programs=TRAINING, doc="Adam's second moments")
    decay: Tensor = buf("DR", U32, programs=TRAINING, init=decay_words,
                        doc="the runs of the flat buffer where weight decay applies (optim.decay_words)")
    u: Tensor = buf("L 2 3H", programs=TRAINING, init=lambda lay: spectral_u_init(lay.spec),
                    doc="spectral-norm power-iteration vectors [L,2,3,H]")
    dh0: Tensor = buf("L B H", programs=TRAINING, doc="gradient on h0 (for checks)")
    dx: Tensor = buf("T B H", programs=TRAINING, doc="gradient on a layer's input (shared by the layers)")
    dtable0: Tensor = buf("V 3H", kind="storage", programs=TRAINING, doc="dGi0 summed by token")
    ws: Tensor = buf("WS", kind="storage",
                     doc="split-K workspace of the GEMMs (they run one after another): the weight gradients' "
                         "where x[L] and gi are too small, the forward's of a few rows (one word when none)")
    ws_cs: Tensor = buf("WSCS", kind="storage", programs=TRAINING, doc="row-split workspace of the bias gradients")

    def initialised(self) -> list[Tensor]:
        """The allocated buffers with contents at creation (to upload once)."""
        return [getattr(self, f.name) for f in fields(self)
                if f.metadata["plan"].init is not None and getattr(self, f.name) is not None]


def plan() -> list[tuple[str, BufferSpec]]:
    """(name, spec) of every buffer, in allocation order."""
    return [(f.name, f.metadata["plan"]) for f in fields(Buffers)]


def allocate(dev: Device, layout: ParamLayout, g: Geometry, training: bool) -> Buffers:
    """The plan's buffers that a program with/without training needs, made on dev."""
    made = {}
    for name, spec in plan():
        if not spec.needed(training, g):
            continue
        words = g.words(spec.shape)

        def make(spec=spec, words=words):
            if spec.init is None:
                return dev.tensor(words, spec.dtype, kind=spec.kind)
            data = spec.init(layout)
            if data.size != words:
                raise ValueError(f"initial contents of {spec.shape} hold {data.size} words, not {words}")
            return dev.tensor(data, spec.dtype, kind=spec.kind)

        made[name] = [make() for _ in range(spec.count(g))] if spec.per else make()
    return Buffers(**made)


def kernel_scratch(g: Geometry, training: bool, dev: Device | None, precision: str = "fp32",
                   grad_groups: bool = False) -> list[tuple[str, int]]:
    """(what, words) of the scratch buffers the program's kernels allocate for themselves (at
    `precision`: fp16 may stream the sweeps, with a float16 copy of W_hh and float16 shadows; fp32
    may stream them on the threads' FMAs, with float32 shadows; grad_groups: the gradient's staging
    copies of an exchange that overlaps the backward, grad_slices.GradStages)."""
    out = [("forward sweeps' grid-barrier words", g.L * sync_words(g.B))]
    if training and grad_groups:
        out.append(("gradient staging per backward group", GradStages.scratch_words(g.P)))
    out += stream_scratch(g, training, dev, precision)
    if training:
        out += [("grad-norm partials", GradNorm.scratch_words(g.P)),
                ("spectral projection work", SpectralProject.scratch_words(g.H, g.L)),
                ("RMSNorm backward dg partials", g.L * ResidualRmsNormBackward.scratch_words(g.R, g.H)),
                ("token sums' partials (embedding, table0)",
                 sum(EmbeddingBackward.scratch_words(dev, g.R, g.V, w) for w in (g.H, 3 * g.H))),
                ("GRU backward sweep scratch", g.L * backward_scratch_words(dev, g.B, g.H, streamed_backward(g, dev,
                                                                                                          precision)))]
    return out


def forward_w_frag(products: str | None) -> bool:
    """Whether a program's streamed forward reads a W_hh copy of its own in fragment order (`w_frag_order`;
    kernelsets.whh_halves' frag): both directions streamed on tensor cores, the backward reading the blocked
    copy beside it."""
    return streams_forward(products) and streams_backward(products) and w_frag_order()


def stream_scratch(g: Geometry, training: bool, dev: Device | None, precision: str) -> list[tuple[str, int]]:
    """The streamed sweeps' own buffers: at fp16 the float16 copy of W_hh, and each direction's shadow
    (h_prev forward, dGh backward) in the sweep's type: float16 on tensor cores, float32 on the FMAs."""
    if dev is None:
        return []
    f16 = (streams_forward(g.products), streams_backward(g.products))  # per direction, on tensor cores
    out = [("streamed sweeps' float16 W_hh", g.L * 3 * g.H * g.H // 2)] if f16[True] else []
    if forward_w_frag(g.products):
        out.append(("forward sweeps' float16 W_hh in fragment order", g.L * 3 * g.H * g.H // 2))
    split = split_forward(dev, g.B, g.H, precision)  # the float32 forward from float16 splits (hi and lo)
    if split:
        out.append(("forward sweeps' float16 split W_hh", g.L * 3 * g.H * g.H))
    for backward in (False, True) if training else (False,):
        sp = split and not backward
        f32 = stream_f32_sweep(dev, g.B, g.H, backward, precision) and not sp
        if f16[backward] or f32 or sp:
            kind = "float16 split" if sp else "float32" if f32 else "float16"
            what = f"backward sweeps' {kind} dGh" if backward else f"forward sweeps' {kind} h_prev"
            tiles = stream_tiles(g.B, g.H, backward, f32, split=sp)
            out.append((what, g.L * shadow_words(tiles, g.H, backward)))
    return out


OVERLAP_ENV = "CATCHAT_OVERLAP_DW"  # 0: dW_hh in its layer's place; 1 or unset: beside the sweep below where it can
# On where it can: on an H100, v3 at fp16 (64 lanes) went from 1,524,027 to 1,570,640 tok/s and, in a
# later call, from 1,546,411 to 1,577,977 (docs/results/2026-12-05-h100-catchat-v3-fp16-{nooverlap,overlap}*.json),
# its model parity 162 of 162 on the GPU (-h100-parity-overlap-dw.json).
OVERLAP_DEFAULT = True


def overlaps_dw_hh(dev: Device, products: str | None, layers: int) -> bool:
    """Whether a training program records layer l's dW_hh GEMM beside layer l-1's backward sweep
    (issue 35): the GEMM reads save[l] and o[l], which that sweep neither reads nor writes, and
    its split-K partials go to `ws`. Not with float16 saves (`save16`): there dW_hh reads dGi's
    r and z thirds from gi, which the sweep below overwrites. Needs kp patch 0007 and two layers.
    OVERLAP_DEFAULT where CATCHAT_OVERLAP_DW is unset; the same results either way (the same dispatches)."""
    on = env_switch(OVERLAP_ENV, "set 1 (dW_hh beside the sweep below, the default) or 0 (layer by layer)",
                    OVERLAP_DEFAULT)
    return on and layers > 1 and products != "stream" and dev.dispatches_concurrent


def streamed_backward(g: Geometry, dev: Device | None, precision: str) -> bool:
    """Whether the program's backward sweeps run streamed: on tensor cores ("stream", "mixed") or on
    the threads' FMAs (gru.stream_f32_sweep)."""
    return dev is not None and (streams_backward(g.products) or stream_f32_sweep(dev, g.B, g.H, True, precision))


def planned_bytes(layout: ParamLayout, T: int, B: int, training: bool = True, dev: Device | None = None,
                  precision: str = "fp32", grad_groups: bool = False) -> int:
    """Bytes of device buffers a Program allocates (the plan's buffers plus the kernels' scratch),
    computed without allocating. `dev` sets the GPU split-K workspaces and sweep tiles; without it
    they are sized as on a CPU device (no split)."""
    g = Geometry.of(layout, T, B, dev, training, precision)
    own = sum(spec.nbytes(g) for _, spec in plan() if spec.needed(training, g))
    return own + 4 * sum(words for _, words in kernel_scratch(g, training, dev, precision, grad_groups))
