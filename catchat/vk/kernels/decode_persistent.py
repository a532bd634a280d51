"""A chunk of decode steps in one dispatch (glsl/decode_persistent.comp): the fused step's L layers, head
and choice (glsl/decode_layer.comp, decode_head.comp, decode_sample.comp; the same bodies, so the same
bits) in L grid crossings a step where the fused step has L + 2 dispatch boundaries. At one stream
each stage does little, so a step is the latency of its dependent stages; a crossing costs less than
a dispatch (H100, docs/generation.md: a dependent dispatch 2.5-3.6 us). Each layer's W_hh sums are
taken a step ahead in the waits (`ghp`), and the head's last workgroup makes the choices and layer 0,
so a step has one crossing a layer above the first and one for the head: v3 at one stream 16.9 us a
step (19.1 with a crossing after every stage) against the fused step's 32.9 over five dispatches. Where
the layers are bound by the weights' bytes (v5) a workgroup has 16 subgroups to keep loads in flight:
73.9 us a step on float16 weights against fused16's 91.5.

The grid is one workgroup per SM where every workgroup is shown co-resident (catchat/vk/occupancy.py),
else one (a single workgroup needs no other to make progress: slow, never wrong); each runs its share of
every stage's workgroups. A barrier that gives up counts stats[ST_SYNC_TIMEOUTS]; `check` turns that
into an error after the chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from catchat.data import vocab
from catchat.errors import DeviceLost, UsageError
from catchat.model import ParamLayout, head_name
from catchat.vk import slots
from catchat.vk.device import Device, host_view
from catchat.vk.kernels import Kernel, ceil_div, device_sms
from catchat.vk.kernels.decode import DecodeShape, half_state, head_parts, layer_args, stream_tile
from catchat.vk.occupancy import co_residency

LAYER_ARGS = 8  # words per layer in the shader's lay table (DecodeLayerArgs: layer, parity, then six offsets)
# grid_sync.glsl's abort flag and finished count, then groups: the grid's, the head's arrivals and release
SYNC_WORDS = 5


def persistent_threads(dev: Device, V: int, H: int = 0) -> int:
    """Threads a workgroup, a whole number of subgroups: a token each in the head and the choice (>= V, at
    least two subgroups for the choice's reductions), and where the SM count is known enough subgroups
    (a power of two, at most the device's workgroup size) for a unit each over one workgroup per SM, so a
    layer's weight loads are all in flight at once as in the fused step (v3 on an H200: 4; v5: 16)."""
    sub = max(1, dev.info.subgroup_size)
    threads = ceil_div(max(int(V), 2 * sub), sub) * sub
    sms = device_sms(dev)
    if sms and H:
        per_sm = 1 << max(0, (ceil_div(int(H), sms) - 1).bit_length())
        threads = max(threads, min(per_sm, dev.info.max_workgroup_invocations // sub) * sub)
    return threads


def persistent_grid(dev: Device, threads: int, shared_bytes: int, stage_workgroups: int) -> int:
    """Workgroups of the chunk's dispatch: at most one per SM, the fewest that give the largest stage as
    many workgroups each (v3: 128 for 128 layer workgroups; v5: 128 for 512), where they are shown
    co-resident; else 1."""
    sms = device_sms(dev)
    n = ceil_div(stage_workgroups, ceil_div(stage_workgroups, sms)) if sms else 1  # balanced: as many each
    return n if n > 1 and co_residency(dev.info, n, threads, shared_bytes).ok else 1


def steps_within_loop_limit(K: int, per_step: int, limit: int) -> int:
    """The steps a chunk may take where a dispatch's loops end after `limit` iterations in all
    (Device.loop_limit: lavapipe, where one workgroup runs the whole chunk and past the limit its last
    steps silently make nothing): at most K, even, their `per_step` loop iterations (an upper bound,
    PersistentPlan.loop_iterations) within half the limit. Refused where two steps would pass the limit
    itself (v5's width on lavapipe); the fused step has no such limit."""
    if 2 * per_step > limit:
        raise UsageError(f"a one-dispatch decode chunk runs about {per_step:,} loop iterations a step, and this "
                         f"device (lavapipe) ends a dispatch's loops after {limit:,}",
                         "set CATCHAT_DECODE=fused (or auto) on this device")
    steps = max(2, min(int(K), limit // 2 // per_step))
    return steps - steps % 2


@dataclass(frozen=True)
class PersistentPlan:
    """How the chunk's dispatch covers B streams at hidden size H and vocabulary V (`lanes` a subgroup):
    `threads` a workgroup, the layers' `shape` (a unit a subgroup), the head's `k_per_part`, `kp` parts
    and `head_streams` a workgroup, and the `grid` of workgroups that runs every stage."""

    threads: int
    shape: DecodeShape
    k_per_part: int
    kp: int
    head_streams: int
    grid: int
    H: int
    B: int
    V: int
    lanes: int

    def loop_iterations(self, L: int, history_cap: int) -> int:
        """An upper bound on one invocation's loop iterations a step where one workgroup runs every stage
        (a CPU device): each layer's unit workgroups walked twice (its W_hh sums, its input's) with a k
        loop each, the head's parts, and each stream's choice (its reductions over subgroups, two passes
        over the vocabulary for top-k and top-p, its n-gram scan of the history). Measured on lavapipe at
        tiny.toml's shape it is 2-4x the count the loop limit saw."""
        H, B, V, lanes = self.H, self.B, self.V, self.lanes
        k_loop = 1 + ceil_div(H // 4 if H % 4 == 0 else H, lanes)
        layers = 2 * L * self.shape.workgroups(B) * k_loop
        head = self.kp * ceil_div(B, self.head_streams) * (1 + ceil_div(self.head_streams * self.k_per_part,
                                                                       self.threads))
        choice = B * (8 * ceil_div(self.threads, lanes) + 2 * V + 8 * ceil_div(history_cap, self.threads))
        return layers + head + choice + 16

    @staticmethod
    def of(dev: Device, H: int, B: int, V: int) -> PersistentPlan:
        threads = persistent_threads(dev, V, H)
        sub = max(1, dev.info.subgroup_size)
        shape = DecodeShape(stream_tile(B), threads, ceil_div(H, threads // sub))
        k_per_part, kp, head_streams = head_parts(H, B)
        vec = 4 if H % 4 == 0 else 1
        shared_bytes = 4 * (vec * head_streams * k_per_part + 4 * threads + 8)  # ys; z, p, wg_red, wg_ured; banned
        stage_wgs = max(shape.workgroups(B), kp * ceil_div(B, head_streams), B)
        return PersistentPlan(threads, shape, k_per_part, kp, head_streams,
                              persistent_grid(dev, threads, shared_bytes, stage_wgs), H, B, V, sub)


@dataclass
class PersistentBuffers:
    """What a decoder's chunk kernels share beside its state: the head's parts [KP, B, V] then [KP, B],
    the layers' offsets (`lay`, [L, LAYER_ARGS]), the grid barrier's words, the stats its timeouts are
    counted in, each layer's W_hh sums taken a step ahead (`ghp`, [L, B, 3, H]), and (half) the float16
    weights and activation shadows with the kernels that make them."""

    parts: object
    lay: object
    sync: object
    stats: object
    ghp: object
    w16: object = None
    a16: object = None
    start: list = field(default_factory=list)

    def half_tensors(self) -> list:
        return [self.w16, self.a16] if self.w16 is not None else []


class DecodePersistent(Kernel):
    """`chunk(K)` dispatches K decode steps (choices into rows 0 .. K-1 of `out`) on the fused step's
    buffers (PersistentStep's own): the ping-pong state, each layer's x + h, the next token; the
    choice's (logits, ctl, cfg, forced, history); half (the "persistent16" step): the float16 weights and
    activation shadows that `start_ops` makes, as the fused16 step's. `shared`: another chunk kernel's
    `own` PersistentBuffers."""

    shader = "decode_persistent"

    def __init__(self, dev: Device, layout: ParamLayout, params, table0, state, ysum, token, ctl, logits, cfg,
                 forced, history, out, *, B: int, history_cap: int, half: bool = False, shared=None):
        s, o = layout.spec, layout.offsets
        self.B, self.H, self.L, self.V, self.half = int(B), s.hidden, s.layers, s.vocab_size, bool(half)
        H, B = self.H, self.B
        plan = PersistentPlan.of(dev, H, B, self.V)
        self.shape, self.grid, sh, kp = plan.shape, plan.grid, plan.shape, plan.kp
        # buffers the chunk kernels of one decoder share (the parts, the lay table, the half copies)
        self.own = own = shared or self._buffers(dev, layout, params, state, kp)
        tensors = [params, table0, state, ysum, token, ctl, own.parts, logits, cfg, forced, history, out,
                   own.lay, own.sync, own.stats, own.ghp] + own.half_tensors()
        defines = {**(DecodeShape.defines(H) or {}), **({"HALF": 1} if self.half else {})}
        self._fixed = (self.L, self.V, sh.row_wgs, vocab.BOS, float(math.sqrt(H)), float(s.norm_eps),
                       o[head_name(s)], o[f"layers.{self.L - 1}.norm.weight"], kp, B, int(history_cap),
                       vocab.PAD, vocab.EOS, H)
        super().__init__(dev, tensors, [self.grid], spec=[plan.threads, sh.tile, H, B, plan.k_per_part, kp,
                                                          plan.head_streams],
                         push=(*self._fixed, 2), defines=defines or None)

    def _buffers(self, dev: Device, layout: ParamLayout, params, state, kp: int) -> PersistentBuffers:
        lay = np.zeros((self.L, LAYER_ARGS), np.uint32)
        for l in range(self.L):
            lay[l, 0], lay[l, 2:] = l, layer_args(layout, l, self.half)
        own = PersistentBuffers(dev.tensor(kp * self.B * (self.V + 1)), dev.tensor(lay, np.uint32),
                                dev.tensor(SYNC_WORDS, np.uint32), dev.tensor(slots.ST_WORDS, np.uint32),
                                dev.tensor(self.L * self.B * 3 * self.H))
        if self.half:
            own.w16, own.a16, own.start = half_state(dev, layout, params, state, self.B)
        dev.upload([own.lay, own.sync, own.stats])
        return own

    def start_ops(self) -> list:
        """What a call's start records after taking the carry into state half 0 (half: the float16 copies
        of the weights and the state's shadow of parity 0; else nothing)."""
        return [op for k in self.own.start for op in k.ops()]

    def chunk(self, K: int):
        """The dispatch of K steps (even, as sequences.record_decode_chunk checks: the chunk ends on state
        half 0)."""
        return self.op(*self._fixed, int(K))

    @property
    def stats(self):
        return self.own.stats

    def check(self) -> None:
        """After a chunk (its stats downloaded): a barrier that gave up made its tokens from garbage."""
        if host_view(self.own.stats)[slots.ST_SYNC_TIMEOUTS]:
            raise DeviceLost(f"the one-dispatch decode chunk on {self.dev.info.name} lost its workgroups (they were "
                             "not all resident at once), so its tokens are wrong",
                             hint="run with CATCHAT_DECODE=fused (a dispatch per stage) and report the GPU")
