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
import os
from dataclasses import dataclass

from catchat.data import vocab
from catchat.errors import UsageError
from catchat.model import ParamLayout, head_name
from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, Transpose, ceil_div, device_sms

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
    raw = os.environ.get(TILE_ENV, "").strip()
    if not raw:
        return DECODE_TILE
    if raw in ("1", "2", "4", "8", "16", "32"):
        return int(raw)
    raise UsageError(f"{TILE_ENV}={raw!r} is not a stream tile", hint="set 1, 2, 4, 8, 16 or 32, or unset it")


def stream_tile(B: int) -> int:
    """Streams per subgroup in the layer and head kernels: a register tile of a power of two partial
    sums per gate, up to `max_stream_tile()`."""
    return min(max_stream_tile(), 1 << max(0, math.ceil(math.log2(max(1, B)))))


SPLITS = ("subgroup", "lanes")
LANE_SPLIT_SUBGROUPS = 8  # split="lanes": at most this many subgroups per workgroup (KS x TS)
LANE_SPLIT_K = 4  # and at most this many over k
LANES_ENV = "CATCHAT_DECODE_LANES"  # "KS,TS": the lane split's workgroup forced (parity, measurements)


def forced_lane_split() -> tuple[int, int] | None:
    """CATCHAT_DECODE_LANES as (KS, TS): KS in 1..4 subgroups over k, TS in 1, 2, 4 or 8 stream tiles, at
    most LANE_SPLIT_SUBGROUPS subgroups in all; None where unset."""
    raw = os.environ.get(LANES_ENV, "").strip()
    if not raw:
        return None
    parts = raw.split(",")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
        ks, ts = (int(p) for p in parts)
        if 1 <= ks <= LANE_SPLIT_K and ts in (1, 2, 4, 8) and ks * ts <= LANE_SPLIT_SUBGROUPS:
            return ks, ts
    raise UsageError(f"{LANES_ENV}={raw!r} is not a lane split",
                     hint=f"set KS,TS: 1-{LANE_SPLIT_K} subgroups over k and 1, 2, 4 or 8 stream tiles, "
                          f"KS x TS <= {LANE_SPLIT_SUBGROUPS} (e.g. 2,4), or unset it")


def lane_split(units: int, B: int, tile: int, sub: int, sms: int) -> tuple[int, int]:
    """(KS, TS) of the lane split over `units` rows (a lane each: H units, or the head's V rows):
    CATCHAT_DECODE_LANES where set; else TS stream tiles per workgroup,
    the most (a power of two, at most the batch's tiles) that keeps the grid at half the SMs or more
    (each weight row then serves TS tiles from L1: v5's rows do not stay in L2 across tiles), and KS
    subgroups over k for each, to LANE_SPLIT_SUBGROUPS subgroups. sms 0 (a CPU, or not reported): the
    most stream tiles."""
    forced = forced_lane_split()
    if forced:
        return forced
    tiles, units_wgs = ceil_div(B, tile), ceil_div(units, sub)
    ts = 1
    while 2 * ts <= min(tiles, LANE_SPLIT_SUBGROUPS) and units_wgs * ceil_div(tiles, 2 * ts) >= sms / 2:
        ts *= 2
    return max(1, min(LANE_SPLIT_K, LANE_SPLIT_SUBGROUPS // ts)), ts


@dataclass(frozen=True)
class DecodeShape:
    """How a decode kernel (a layer, or the head) covers its rows (units, or vocabulary rows) for B
    streams: `tile` streams a subgroup, `workgroup` threads, `row_wgs` workgroups along the rows, and
    for the lane split (`k_splits` set) its KS subgroups over k and TS stream tiles a workgroup."""

    split: str
    tile: int
    workgroup: int
    row_wgs: int
    tiles_per_wg: int = 1
    k_splits: int | None = None
    sub: int = 32

    def workgroups(self, B: int) -> int:
        return self.row_wgs * ceil_div(ceil_div(B, self.tile), self.tiles_per_wg)

    def spec(self, H: int, B: int) -> list[int]:
        lanes = [self.k_splits, self.tiles_per_wg, self.sub] if self.split == "lanes" else []
        return [self.workgroup, self.tile, H, B] + lanes

    def defines(self, H: int) -> dict | None:
        d = ({"VEC4": 1} if H % 4 == 0 else {}) | ({"UNIT_PER_LANE": 1} if self.split == "lanes" else {})
        return d or None


def decode_shape(dev: Device, split: str, rows: int, B: int, *, subgroups: int, sums_per_stream: int,
                 k_major: bool) -> DecodeShape:
    """The shape of a decode kernel over `rows` rows. "subgroup": `subgroups` rows a workgroup, a
    subgroup each. "lanes": a lane a row, `lane_split`'s workgroup, the stream tile capped where the
    partial sums of the k splits past the first (`sums_per_stream` floats a lane per stream) would not
    fit the device's shared memory; its weights k-major (`k_major`: the lane split needs them, the
    other refuses them)."""
    if split not in SPLITS:
        raise ValueError(f"decode split {split!r}: expected one of {', '.join(SPLITS)}")
    if (split == "lanes") != k_major:
        raise ValueError("the lane split reads its weights k-major (wt: `weights_k_major`), the other not")
    sub, tile = max(1, dev.info.subgroup_size), stream_tile(B)
    if split == "subgroup":
        return DecodeShape(split, tile, subgroups * sub, ceil_div(rows, subgroups), sub=sub)
    ks, ts = lane_split(rows, B, tile, sub, device_sms(dev))
    while tile > 1 and 4 * sums_per_stream * tile * max(1, ks - 1) * ts * sub > dev.info.max_shared_memory_bytes:
        tile //= 2
    return DecodeShape(split, tile, ks * ts * sub, ceil_div(rows, sub), ts, ks, sub)


class DecodeLayer(Kernel):
    """One layer's decode step for every stream: its input (the embedding, or RMSNorm of the layer
    below's x + h), both projections, the GRU cell, the state ping-pong, and this layer's x + h.
    `step(layer, parity)` for each layer: one pipeline serves them all (the shader reads which
    layer, the first one's input included, from the push constants). split "subgroup": a subgroup
    per unit and stream tile, its lanes over k; "lanes": a lane per unit, a workgroup of `lane_split`'s
    TS stream tiles, each over k in KS subgroups summed in shared memory (glsl/decode_layer.comp's
    UNIT_PER_LANE, glsl/include/lane_split.glsl); `decode_shape` says which."""

    shader = "decode_layer"

    def __init__(self, dev: Device, layout: ParamLayout, params, table0, state, ysum, token, ctl, *, B: int,
                 split: str = "subgroup", wt=None):
        s = layout.spec
        self.layout, self.B, self.H, self.L = layout, int(B), s.hidden, s.layers
        # subgroup split, batch 1: two subgroups (units) per workgroup, so the step spreads over every
        # SM; more streams: eight, which share their stream tile's inputs through L1. Lane split: 7
        # partial sums a stream (3 gates x {ih, hh} and the norm's sum of squares).
        self.shape = sh = decode_shape(dev, split, self.H, self.B, subgroups=2 if self.B == 1 else 8,
                                       sums_per_stream=7, k_major=wt is not None)
        super().__init__(dev, [params, table0, state, ysum, token, ctl] + ([wt] if wt is not None else []),
                         [sh.workgroups(self.B)], spec=sh.spec(self.H, self.B), push=self._push(0, 0),
                         defines=sh.defines(self.H))

    def _push(self, layer: int, parity: int) -> tuple:
        o, s, p = self.layout.offsets, self.layout.spec, f"layers.{layer}."
        g_prev = o["embedding.weight"] if layer == 0 else o[f"layers.{layer - 1}.norm.weight"]
        w_ih = o[p + "gru.weight_ih"]
        return (layer, parity, self.L, s.vocab_size, w_ih, o[p + "gru.weight_hh"],
                o[p + "gru.bias_ih"], o[p + "gru.bias_hh"], g_prev, self.shape.row_wgs, vocab.BOS,
                float(math.sqrt(self.H)), float(s.norm_eps))

    def step(self, layer: int, parity: int):
        """The dispatch of `layer` reading state half `parity` and writing the other."""
        return self.op(*self._push(layer, parity))


def k_major_words(layout: ParamLayout) -> int:
    """Floats of the lane split's k-major weights: [L][W_ih, W_hh][H][3H], then the head's [H][V]
    (at `k_major_head`)."""
    s = layout.spec
    return k_major_head(layout) + s.hidden * s.vocab_size


def k_major_head(layout: ParamLayout) -> int:
    s = layout.spec
    return s.layers * 2 * s.hidden * 3 * s.hidden


def weights_k_major(dev: Device, layout: ParamLayout, params, wt) -> list:
    """The dispatches that write every layer's W_hh and (past layer 0, whose input is table0) W_ih,
    and the head's weight, into `wt` transposed (`k_major_words` floats): the lane split's weights,
    rewritten at each call's start because the parameters may have changed between calls."""
    s, o = layout.spec, layout.offsets
    H = s.hidden
    t = Transpose(dev, params, wt, 3 * H, H)
    ops = []
    for l in range(s.layers):
        for m, name in enumerate(("weight_ih", "weight_hh")):
            if (l, m) != (0, 0):
                ops.append(t.op_for(o[f"layers.{l}.gru.{name}"], (2 * l + m) * H * 3 * H))
    head = Transpose(dev, params, wt, s.vocab_size, H)
    return ops + [head.op_for(o[head_name(s)], k_major_head(layout))]


class DecodeHead(Kernel):
    """The head for every stream: logits = W_head (RMSNorm of the last layer's x + h), a subgroup per
    vocabulary row and stream tile, spread over the GPU (streams that stopped keep their logits);
    split "lanes": a lane per row, shaped as DecodeLayer's lane split, W_head read k-major from wt."""

    shader = "decode_head"

    def __init__(self, dev: Device, layout: ParamLayout, params, ysum, logits, ctl, *, B: int,
                 split: str = "subgroup", wt=None):
        s, o = layout.spec, layout.offsets
        self.B, self.V = int(B), s.vocab_size
        # subgroup split: two rows per workgroup, so the 101 rows spread over the GPU; lane split: 2
        # partial sums a stream (the logit and the norm's sum of squares), W_head's copy in wt
        self.shape = sh = decode_shape(dev, split, self.V, self.B, subgroups=2, sums_per_stream=2,
                                       k_major=wt is not None)
        w_head = k_major_head(layout) if split == "lanes" else o[head_name(s)]
        self.push = (s.layers, self.V, w_head, o[f"layers.{s.layers - 1}.norm.weight"], sh.row_wgs,
                     float(s.norm_eps))
        super().__init__(dev, [params, ysum, logits, ctl] + ([wt] if wt is not None else []),
                         [sh.workgroups(self.B)], spec=sh.spec(s.hidden, self.B), push=self.push,
                         defines=sh.defines(s.hidden))

    def step(self):
        return self.op(*self.push)


class DecodeSample(Kernel):
    """The choice of the next token from the logits, one workgroup per stream (a thread per
    token). `choose(k)` writes its choices to row k of `out`. resets (uint32 [B], the batched decode
    step's): beside each token written, 1 where it is <bos> (the next step starts from a zero state)."""

    shader = "decode_sample"

    def __init__(self, dev: Device, layout: ParamLayout, logits, token, ctl, cfg, forced, history, out, *, B: int,
                 history_cap: int, resets=None):
        s = layout.spec
        if s.vocab_size > MAX_VOCAB:
            raise ValueError(f"device sampling handles vocabularies up to {MAX_VOCAB} tokens, not {s.vocab_size}")
        self.B, self.V, self.cap = int(B), s.vocab_size, int(history_cap)
        sub = max(1, dev.info.subgroup_size)
        self.workgroup = ceil_div(max(self.V, 2 * sub), sub) * sub
        self._fixed = (self.B, self.V, self.cap, vocab.PAD, vocab.BOS, vocab.EOS)  # push constants after k
        tensors = [logits, token, ctl, cfg, forced, history, out] + ([] if resets is None else [resets])
        super().__init__(dev, tensors, [self.B], spec=[self.workgroup], push=(0, *self._fixed),
                         defines=None if resets is None else {"RESETS": 1})

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
