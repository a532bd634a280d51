"""Generation's decode step for B streams at once: one dispatch per layer (glsl/decode_layer.comp),
one for the head (glsl/decode_head.comp) and one for the choice of the next token
(glsl/decode_sample.comp); or, the batched step (catchat/vk/program/decoder.py), the batched
forward's kernels at T = 1, then DecodeCarry (glsl/decode_carry.comp) and the choice.

The decode step reads the same flat parameter buffer and layer-0 table (E W_ih0^T) as the batched
forward, keeps its state on the device between steps (a ping-pong [2, L, B, H] state, each
layer's x + h [L, B, H], the next input token and a few words per stream), and never returns to
the host inside a chunk of steps (catchat/vk/program/decoder.py records those).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from catchat.data import vocab
from catchat.errors import UsageError
from catchat.model import ParamLayout, head_name
from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div
from catchat.vk.kernels.gru.stream import w_frag_order
from catchat.vk.switches import env_choice

MAX_VOCAB = 256  # the stop-token mask has 256 bits (slots.DC_STOP)


# The largest stream tile: each weight row a subgroup loads feeds this many streams' dot products
# (6 partial sums per stream in each lane's registers). CATCHAT_DECODE_TILE=16 or 32 asks for more
# (to measure on a GPU: at batch 64 a tile of 8 reads every weight 8 times a step; v3 on the H200
# spent 60 us a layer there, 2026-12-05). The results do not depend on it (each stream's sums are
# the same operations in the same order).
DECODE_TILE = 8
TILE_ENV = "CATCHAT_DECODE_TILE"


def max_stream_tile() -> int:
    """CATCHAT_DECODE_TILE (1, 2, 4, 8, 16 or 32), else DECODE_TILE."""
    return env_choice(TILE_ENV, (1, 2, 4, 8, 16, 32), DECODE_TILE)


def stream_tile(B: int) -> int:
    """Streams per subgroup in the layer and head kernels: a register tile of a power of two partial
    sums per gate, up to `max_stream_tile()`."""
    return min(max_stream_tile(), 1 << max(0, math.ceil(math.log2(max(1, B)))))


@dataclass(frozen=True)
class DecodeShape:
    """How a decode kernel (a layer, or the head) covers its rows (units, or vocabulary rows) for B
    streams: a subgroup a row and stream tile, `tile` streams a subgroup, `workgroup` threads,
    `row_wgs` workgroups along the rows."""

    tile: int
    workgroup: int
    row_wgs: int

    def workgroups(self, B: int) -> int:
        return self.row_wgs * ceil_div(B, self.tile)

    def spec(self, H: int, B: int) -> list[int]:
        return [self.workgroup, self.tile, H, B]

    @staticmethod
    def defines(H: int) -> dict | None:
        """VEC4 where the rows are whole vec4s (the kernels' k loops read four at a time)."""
        return {"VEC4": 1} if H % 4 == 0 else None


def decode_shape(dev: Device, rows: int, B: int, subgroups: int) -> DecodeShape:
    """The shape of a decode kernel over `rows` rows: `subgroups` rows a workgroup, a subgroup each,
    `stream_tile(B)` streams a subgroup."""
    sub = max(1, dev.info.subgroup_size)
    return DecodeShape(stream_tile(B), subgroups * sub, ceil_div(rows, subgroups))


def layer_input_offset(layout: ParamLayout, layer: int) -> int:
    """Where a decode layer kernel's input weights start in params: layer 0's embedding (its rows are
    the input), else the norm weight g of the layer below (its input is that layer's x + h, normed)."""
    o = layout.offsets
    return o["embedding.weight"] if layer == 0 else o[f"layers.{layer - 1}.norm.weight"]


def half_weight_offset(L: int, H: int, layer: int, input_side: bool) -> int:
    """Where a layer's W_hh (or, input_side, W_ih: layers above the first) starts in the decode steps'
    float16 weight copy, in halves: every layer's W_hh, then W_ih of layers 1 .. L-1, 3H x H each."""
    return (L + layer - 1 if input_side else layer) * 3 * H * H


def half_weights(dev: Device, layout: ParamLayout, params, block_cols: int = 0, frag: bool = False):
    """The float16 copy of every decode layer's W_hh and W_ih (`half_weight_offset`'s layout; 16 x 16
    blocks where block_cols, and with frag those blocks then in place in the fragment order of a
    column-major B operand, `FragOrder`): (its uint32 tensor, the kernels that refresh it from params)."""
    from catchat.vk.kernels import FragOrder, ToHalf

    s, o = layout.spec, layout.offsets
    L, H, hh = s.layers, s.hidden, 3 * s.hidden * s.hidden
    w16 = dev.tensor(ceil_div((2 * L - 1) * hh, 2), np.uint32)
    copies = [(f"layers.{l}.gru.weight_hh", l, False) for l in range(L)]
    copies += [(f"layers.{l}.gru.weight_ih", l, True) for l in range(1, L)]
    if frag and not block_cols:
        raise ValueError("half_weights: fragment order rewrites 16 x 16 blocks (give block_cols)")
    at = [(o[name], half_weight_offset(L, H, l, ih)) for name, l, ih in copies]  # (params, copy)
    kernels = [ToHalf(dev, params, w16, hh, src, dst, block_cols=block_cols) for src, dst in at]
    return w16, kernels + ([FragOrder(dev, w16, hh // 256, dst, dst, col=True) for _, dst in at] if frag else [])


def layer_args(layout: ParamLayout, layer: int, half: bool = False) -> tuple[int, ...]:
    """A decode layer's offsets (glsl/include/decode_layer_body.glsl's DecodeLayerArgs after layer and
    parity): W_ih (unread for layer 0) and W_hh, in params or (half) in the float16 copy's halves, b_ih,
    b_hh, its input's (`layer_input_offset`) and its own norm weight, in params."""
    o, s, p = layout.offsets, layout.spec, f"layers.{layer}."
    if half:
        w_ih, w_hh = (half_weight_offset(s.layers, s.hidden, layer, ih) for ih in (True, False))
    else:
        w_ih, w_hh = o[p + "gru.weight_ih"], o[p + "gru.weight_hh"]
    return (w_ih, w_hh, o[p + "gru.bias_ih"], o[p + "gru.bias_hh"], layer_input_offset(layout, layer),
            o[p + "norm.weight"])


def half_state(dev: Device, layout: ParamLayout, params, state, B: int):
    """The float16 step's (decode_layer_body.glsl's HALF) buffers: the weights' float16 copy (`half_weights`),
    the activations' shadows a16 (h16 of both parities, then y16: [3][L][B][H] halves), and the kernels a
    call's start runs after taking the carry into state half 0 (the copy, then the state's shadow of
    parity 0): (w16, a16, kernels)."""
    from catchat.vk.kernels import ToHalf

    w16, kernels = half_weights(dev, layout, params)
    n = layout.spec.layers * int(B) * layout.spec.hidden
    a16 = dev.tensor(ceil_div(3 * n, 2), np.uint32)
    return w16, a16, kernels + [ToHalf(dev, state, a16, n)]


class DecodeLayer(Kernel):
    """One layer's decode step for every stream: its input (the embedding, or RMSNorm of the layer
    below's x + h), both projections, the GRU cell, the state ping-pong, and this layer's x + h.
    `step(layer, parity)` for each layer: one pipeline serves them all (the shader reads which
    layer, the first one's input included, from the push constants). A subgroup per unit and stream
    tile, its lanes over k (`decode_shape`). half (the "fused16" step): the weights from a float16
    copy (`w16`, made by `start_ops`: half the bytes a step reads) and the products' other operands
    from float16 shadows of the state and of each layer's normed x + h (`a16`, rounded once where
    written; the state's of parity 0 made by `start_ops`), the tensor-core step's numerics
    (decode_layer.comp's HALF)."""

    shader = "decode_layer"

    def __init__(self, dev: Device, layout: ParamLayout, params, table0, state, ysum, token, ctl, *, B: int,
                 half: bool = False):
        s = layout.spec
        self.layout, self.B, self.H, self.L, self.half = layout, int(B), s.hidden, s.layers, bool(half)
        # batch 1: two subgroups (units) per workgroup, so the step spreads over every SM; more
        # streams: eight, which share their stream tile's inputs through L1
        self.shape = sh = decode_shape(dev, self.H, self.B, subgroups=2 if self.B == 1 else 8)
        tensors, defines, self._start_kernels = [params, table0, state, ysum, token, ctl], sh.defines(self.H), []
        if self.half:
            self.w16, self.a16, self._start_kernels = half_state(dev, layout, params, state, self.B)
            tensors, defines = tensors + [self.w16, self.a16], {**(defines or {}), "HALF": 1}
        super().__init__(dev, tensors, [sh.workgroups(self.B)], spec=sh.spec(self.H, self.B), push=self._push(0, 0),
                         defines=defines)

    def _push(self, layer: int, parity: int) -> tuple:
        w_ih, w_hh, b_ih, b_hh, g_prev, g_self = layer_args(self.layout, layer, self.half)
        return (layer, parity, self.L, self.layout.spec.vocab_size, w_ih, w_hh, b_ih, b_hh, g_prev,
                self.shape.row_wgs, vocab.BOS, float(math.sqrt(self.H)), float(self.layout.spec.norm_eps), g_self)

    def start_ops(self) -> list:
        """What a call's start records after taking the carry into state half 0: half, the float16
        copies of W_hh and W_ih from the parameters and the state's float16 shadow of parity 0; else
        nothing (the kernel reads params and the state as they are)."""
        return [op for k in self._start_kernels for op in k.ops()]

    def step(self, layer: int, parity: int):
        """The dispatch of `layer` reading state half `parity` and writing the other."""
        return self.op(*self._push(layer, parity))


# The tensor-core step's streams per workgroup: 64 (four 16-stream fragments, two k parts: its shared
# memory holds no more) or 32 (two fragments, four k parts, each weight read by two workgroups at 64
# streams). Its layers take ~1.5 us per k fragment a subgroup walks, so 32 halves that walk, and wins
# where the second read comes from L2; where a layer's float16 weights do not fit L2 the second read
# costs more. H100, 64 streams, one call (docs/results/2026-12-05-h100-catchat-v{3,5}-gen-coop{32,64}.json):
# v3 (H = 512) 14.2 us a layer with 32 against 29.7 with 64; v5 (H = 2048) 106 against 100.
COOP_STREAMS_L2_HIDDEN = 1024  # up to this H, 32 streams a workgroup; above, 64
COOP_STREAMS_ENV = "CATCHAT_DECODE_COOP_STREAMS"


def coop_streams(H: int) -> int:
    """CATCHAT_DECODE_COOP_STREAMS (16, 32 or 64), else 32 up to COOP_STREAMS_L2_HIDDEN and 64 above."""
    return env_choice(COOP_STREAMS_ENV, (16, 32, 64), 32 if H <= COOP_STREAMS_L2_HIDDEN else 64)


# Subgroups a workgroup of the tensor-core step at most: 16 (512 threads) where a workgroup takes 64
# streams (H above COOP_STREAMS_L2_HIDDEN), so twice the k parts walk a layer's fragments at once (v5: 4
# parts instead of 2; past 8 the parts meet through one shared slot in turn, the shader's SEQ, the same
# sums, with a ring of 2 stages); 8 below, where the 32-stream workgroups' 4 parts would become 8. H100,
# --precision fp16, one call each (docs/results/2026-12-05-h100-catchat-v{3,5}-gen-{fp16,coop-sg16}*.json):
# v5 at 8 / 32 / 64 streams 51,732 / 177,234 / 219,046 chars/s with 8 against 69,411 / 203,863 / 269,216
# with 16; v3 at 32 / 64 streams 576,433 / 1,151,833 with 8 against 530,144 / 1,059,781 with 16.
# CATCHAT_DECODE_COOP_SUBGROUPS=8 or 16 sets it (to compare).
COOP_SUBGROUPS_ENV = "CATCHAT_DECODE_COOP_SUBGROUPS"


def coop_subgroups(H: int) -> int:
    """CATCHAT_DECODE_COOP_SUBGROUPS (8 or 16), else 16 above COOP_STREAMS_L2_HIDDEN and 8 up to it."""
    return env_choice(COOP_SUBGROUPS_ENV, (8, 16), 16 if H > COOP_STREAMS_L2_HIDDEN else 8)


# CATCHAT_DECODE_COOP_PROBE=1 or 2: timing probes of the tensor-core step that skip its W loads (1) or its
# h16 / y16 loads (2), on real fragments (decode_layer_coop.comp's PROBE): wrong results,
# for tools/gpu-check.sh to tell which bytes bound a step. 0 or unset: none.
PROBE_ENV = "CATCHAT_DECODE_COOP_PROBE"


def coop_probe(real_fragments: bool) -> int:
    """CATCHAT_DECODE_COOP_PROBE (0, 1 or 2), refused where the fragments are emulated."""
    probe = env_choice(PROBE_ENV, (0, 1, 2), 0)
    if probe and not real_fragments:
        raise UsageError(f"{PROBE_ENV}={probe} probes the tensor-core decode step on real fragments, which "
                         f"this device does not have", hint=f"unset {PROBE_ENV}")
    return probe


def coop_decode_ok(H: int) -> bool:
    """Whether glsl/decode_layer_coop.comp takes hidden size H (whole 16 x 16 fragments)."""
    return H % 16 == 0


@dataclass(frozen=True)
class CoopShape:
    """How decode_layer_coop.comp covers B streams: `sf` 16-stream fragments a workgroup (up to 64
    streams), `ks` k parts a fragment (8, 4, 2 or 1: as many as `subgroups` hold, at most 4 with 8 of
    them, and H / 16 divides; each walks its part with its loads in flight, what bounds a step),
    `tiles` workgroups of streams for each of the `row_wgs` slices of 16 units; `seq`: past the
    8-subgroup shapes (more subgroups, or 8 parts), so the parts meet through one slot in turn (the
    shader's SEQ)."""

    sf: int
    ks: int
    tiles: int
    row_wgs: int
    seq: bool = False

    @property
    def workgroup(self) -> int:
        """Threads: a subgroup per (stream fragment, k part)."""
        return 32 * self.sf * self.ks

    @staticmethod
    def of(H: int, B: int, streams: int = 64, subgroups: int = 8) -> CoopShape:
        """The shape for B streams at hidden size H, at most `streams` (16, 32 or 64) and `subgroups`
        (8 or 16) a workgroup."""
        frags = ceil_div(B, 16)
        sf = min(streams // 16, frags)
        ks = next(k for k in (8, 4, 2, 1) if k * sf <= subgroups and (k <= 4 or subgroups > 8)
                  and (H // 16) % k == 0)
        return CoopShape(sf, ks, ceil_div(frags, sf), H // 16, sf * ks > 8 or ks > 4)

    def defines(self) -> dict:
        """The shader's defines for this shape (SEQ's ring of 2 stages: 512 threads' registers)."""
        return {"SF": self.sf, "KS": self.ks, **({"SEQ": 1, "PD": 2} if self.seq else {})}

    def workgroups(self, B: int) -> int:
        return self.row_wgs * self.tiles


class DecodeLayerCoop(Kernel):
    """One layer's decode step for every stream with its products on tensor cores
    (glsl/decode_layer_coop.comp; emulated fragments where the device has none): W_hh and W_ih as
    float16 blocks (`w16`, made by `start_ops`), the state's and the layer inputs' float16 shadows
    (`act16`), and each slice's sums of y^2 (`ssq`) beside the float32 state and x + h that
    DecodeLayer keeps. A workgroup per slice of 16 units and tile of up to 64 streams. With
    `stream.w_frag_order()` the weights' blocks are in fragment order (`FragOrder`; the shader's FRAG_W)."""

    shader = "decode_layer_coop"

    def __init__(self, dev: Device, layout: ParamLayout, params, table0, state, ysum, token, ctl, *, B: int):
        from catchat.vk.kernels import ToHalf
        from catchat.vk.kernels.gemm_tiles import coopmat_runs, frag_defines

        s = layout.spec
        self.layout, self.B, self.H, self.L = layout, int(B), s.hidden, s.layers
        H, L = self.H, self.L
        if not coop_decode_ok(H):
            raise ValueError(f"the tensor-core decode step needs H a multiple of 16, got {H}")
        self.shape = sh = CoopShape.of(H, self.B, coop_streams(H), coop_subgroups(H))
        sp = ceil_div(self.B, 16) * 16
        frag = w_frag_order()  # the weights' blocks in fragment order (FRAG_W)
        self.w16, self._weights = half_weights(dev, layout, params, block_cols=H, frag=frag)
        self.act16 = dev.tensor(3 * L * sp * H // 2, np.uint32)  # zeros: the rows past B stay zero
        self.ssq = dev.tensor(L * (H // 16) * self.B)
        dev.upload([self.act16])
        emulate = not coopmat_runs(dev)
        probe = coop_probe(not emulate)
        defines = {**sh.defines(), **({"EMU": 1} if emulate else {}), **({"PROBE": probe} if probe else {}),
                   **({"FRAG_W": 1} if frag else {}), **frag_defines(dev, emulate)}
        super().__init__(dev, [params, table0, state, ysum, token, ctl, self.w16, self.act16, self.ssq],
                         [sh.workgroups(self.B)], spec=[sh.workgroup, H, self.B], push=self._push(0, 0),
                         defines=defines)
        # the state's shadow of parity 0 from the float32 state (a call's start: the carry taken)
        self._h16 = [ToHalf(dev, state, self.act16, self.B * H, l * self.B * H, l * sp * H, block_cols=H)
                     for l in range(L)]

    def _push(self, layer: int, parity: int) -> tuple:
        o, s, p = self.layout.offsets, self.layout.spec, f"layers.{layer}."
        g_prev = layer_input_offset(self.layout, layer)
        return (layer, parity, self.L, s.vocab_size, o[p + "gru.bias_ih"], o[p + "gru.bias_hh"], g_prev,
                o[p + "norm.weight"], vocab.BOS, float(math.sqrt(self.H)), float(s.norm_eps))

    def start_ops(self) -> list:
        """What a call's start records after taking the carry into state half 0: the float16 copies of
        W_hh and W_ih from the parameters, and the state's float16 shadow of parity 0."""
        return [op for k in self._weights + self._h16 for op in k.ops()]

    def step(self, layer: int, parity: int):
        """The dispatch of `layer` reading state half `parity` and writing the other."""
        return self.op(*self._push(layer, parity))


# The head's k parts (glsl/decode_head.comp): KP x ceil(B / HEAD_STREAMS) workgroups, each staging its
# streams' y over its part of k, each thread holding its row's part of W_head g in registers (at most
# HEAD_PART_STEPS vec4). 32 parts put v5's 64 streams on 128 workgroups, a thread's 16 vec4 loads in
# flight; the choice then adds 32 numbers per logit. H100, decode device us a step, head + choice, before
# (a vocabulary row per subgroup) and after (`2026-12-06-h100-catchat-v{3,5}-gen-head-parts.json`): v5 at
# 64 streams 35.5 + 6.1 -> 11.5 + 6.5, v3 14.3 + 5.6 -> 6.4 + 6.5 (docs/generation.md).
HEAD_PARTS = 32
HEAD_PART_STEPS = 16
HEAD_STREAMS = 16  # streams a workgroup (each thread's partial sums in registers)


def head_parts(H: int, B: int) -> tuple[int, int, int]:
    """How the decode head covers k (glsl/include/decode_head_body.glsl): (k steps a part: vec4 where the
    rows are whole vec4s, else floats; parts; streams a workgroup)."""
    k_steps = H // 4 if H % 4 == 0 else H
    # spread over HEAD_PARTS at any batch: at one stream 8 parts of 16 vec4 (fewer for the choice to add)
    # made v3's head 7.3 us a step against 5.4 with 32, the choice 5.6 against 6.4 (H100,
    # 2026-12-06-h100-catchat-v3-gen-head-parts8-experiment.json)
    k_per_part = min(HEAD_PART_STEPS, ceil_div(k_steps, min(HEAD_PARTS, k_steps)))
    return k_per_part, ceil_div(k_steps, k_per_part), min(int(B), HEAD_STREAMS)


class DecodeHead(Kernel):
    """The head for every stream in k parts (glsl/decode_head.comp): `parts` [kp, B, V] partial sums of
    W_head (g * y) and [kp, B] partial sums of y^2, y the last layer's x + h; the choice
    (DecodeSample with `head=` this) adds them into the logits, in part order."""

    shader = "decode_head"

    def __init__(self, dev: Device, layout: ParamLayout, params, ysum, *, B: int):
        s, o = layout.spec, layout.offsets
        self.B, self.V, self.H = int(B), s.vocab_size, s.hidden
        self.k_per_part, self.kp, self.streams = head_parts(self.H, self.B)
        self.parts = dev.tensor(self.kp * self.B * (self.V + 1))
        sub = max(1, dev.info.subgroup_size)
        threads = ceil_div(self.V, sub) * sub
        self.push = (s.layers, self.V, o[head_name(s)], o[f"layers.{s.layers - 1}.norm.weight"], self.kp)
        super().__init__(dev, [params, ysum, self.parts], [self.kp * ceil_div(self.B, self.streams)],
                         spec=[threads, self.streams, self.H, self.B, self.k_per_part], push=self.push,
                         defines=DecodeShape.defines(self.H))

    def step(self):
        return self.op(*self.push)


class DecodeSample(Kernel):
    """The choice of the next token from the logits, one workgroup per stream (a thread per
    token). `choose(k)` writes its choices to row k of `out`. resets (uint32 [B], the batched decode
    step's): beside each token written, 1 where it is <bos> (the next step starts from a zero state).
    head (a DecodeHead): the logits of the live streams are first made from its parts (HEAD_PARTS)."""

    shader = "decode_sample"

    def __init__(self, dev: Device, layout: ParamLayout, logits, token, ctl, cfg, forced, history, out, *, B: int,
                 history_cap: int, resets=None, head: DecodeHead | None = None):
        s = layout.spec
        if s.vocab_size > MAX_VOCAB:
            raise ValueError(f"device sampling handles vocabularies up to {MAX_VOCAB} tokens, not {s.vocab_size}")
        self.B, self.V, self.cap = int(B), s.vocab_size, int(history_cap)
        sub = max(1, dev.info.subgroup_size)
        self.workgroup = ceil_div(max(self.V, 2 * sub), sub) * sub
        # push constants after k (H and eps are read only with HEAD_PARTS, the parts' count a spec constant)
        self._fixed = (self.B, self.V, self.cap, vocab.PAD, vocab.BOS, vocab.EOS, s.hidden, float(s.norm_eps))
        # the optional bindings follow in this order (decode_sample.comp's RESETS, then HEAD_PARTS)
        tensors = [logits, token, ctl, cfg, forced, history, out] + ([resets] if resets is not None else []) \
            + ([head.parts] if head else [])
        defines = {**({"RESETS": 1} if resets is not None else {}), **({"HEAD_PARTS": 1} if head else {})}
        super().__init__(dev, tensors, [self.B], spec=[self.workgroup, head.kp if head else 1], push=(0, *self._fixed),
                         defines=defines or None)

    def choose(self, k: int):
        return self.op(k, *self._fixed)


class DecodeCarry(Kernel):
    """The batched decode step's end before the choice (glsl/decode_carry.comp): for the streams still
    live, h0 = hT (the carried state, [L,B,H]) and kept = logits ([B,V], what the choice reads); a
    stream that stopped keeps both."""

    shader = "decode_carry"
    WORKGROUP = 64

    def __init__(self, dev: Device, hT, h0, logits, kept, ctl, *, L: int, B: int, H: int, V: int):
        self.push = (int(L), int(B), int(H), int(V))
        super().__init__(dev, [hT, h0, logits, kept, ctl], [ceil_div(L * B * H + B * V, self.WORKGROUP)],
                         spec=[self.WORKGROUP], push=self.push)

    def step(self):
        return self.op(*self.push)
