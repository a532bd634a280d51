"""GRU recurrent sweeps (glsl/gru_forward.comp, glsl/gru_backward.comp; where W_hh fits on chip,
the register-resident glsl/gru_forward_resident.comp, glsl/gru_backward_resident.comp).

Only the serial path lives here. Before the forward sweep a GEMM computes gi = x @ W_ih^T + b_ih
[T,B,3H] for all steps; after the backward sweep GEMMs compute dW_ih = dGi^T x, dW_hh = dGh^T hprev,
db_ih = colsum(dGi), db_hh = colsum(dGh), dx = dGi @ W_ih from the dGi, dGh, hprev written here.
numpy twins: catchat.model.reference.gru_layer_forward, gru_sweep_backward, gru_weight_grads.

Forward, per step t = 0..T-1: the recurrent matmul h_prev @ W_hh^T fused with the gates; writes
o[t], save[t] = (r, z, n, ghn), hT at T-1, and hprev[0] (the state entering the window, after its
reset). The state entering step t >= 1 is o[t-1], so the state sequence is not stored twice: with
`state_rows(B, H)`, o's buffer has T+1 row blocks, row 0 = hprev[0] and row t+1 = o[t], and rows
[0, T) are hprev (before the resets, which the backward applies: where a reset cut it zeroes the
row in place, so after the backward sweep they are the states entering each step, for dW_hh).
Backward, s = T, T-1, ..., 0 (T+1 steps): step s finishes dh_{s-1} = (dhz + dGh[s] @ W_hh) * carry
(clamp, dh0 at s = 0; dhz = dhtot * z[s] kept from step s's gate backward) and then runs the gate
backward of step s-1 on the same elements, so no dh ping-pong buffer is needed: each thread owns
its (b, k) element in every step (see the shader header). dGh may be written over save's r, z, n
(dgh=None): an element's gate backward reads them before it writes its dGh there, and nothing
reads them again.

A sweep (`sweep_ops()`) is either one dispatch per step, or, where the device tells how many
workgroups can be resident at once (`resident_workgroups`: one per SM on NVIDIA) and the sweep's
dispatch is shown co-resident from the device's limits (`plan_sweep`, catchat/vk/occupancy.py),
one persistent dispatch whose workgroups walk the tiles of each step and meet at a grid barrier
between steps (glsl/include/grid_sync.glsl): no per-step launch, drain and barrier. A kernel's
`residency` says why (None: a dispatch per step by choice, or a forced count). `step(t)` is always one
dispatch (the per-timestep path interleaves other kernels between steps).
"""

from __future__ import annotations

import numpy as np

from catchat.vk import slots
from catchat.vk.device import Device, pack_push
from catchat.vk.kernels import Kernel, LazyAlgorithm
from catchat.vk.kernels.gemm import coopmat_runs
from catchat.vk.kernels.gemm_tiles import RESIDENT_SWEEP_API_DEFAULT, frag_defines
from catchat.vk.kernels.gru.plan import (
    plan_sweep,
    resident_workgroups,
    sweep_residency,
    sweep_workgroups,
    sync_words,
    tile_count,
)
from catchat.vk.kernels.gru.resident import (
    COOP_UNITS,
    ResidentTiles,
    coop_tiles_ok,
    partial_words,
    resident_defines,
    resident_resources,
)
from catchat.vk.kernels.gru.stream import (
    W16_ALIGN,
    fit_shared,
    ksplit_partial_words,
    shadow_words,
    stream_defines,
    stream_items,
    stream_shared_bytes,
    stream_threads,
    stream_tiles,
    w16_blocked,
)
from catchat.vk.kernels.gru.tiled import _check_tiles, shader_defines


def sweep_shader(tiles, B: int, H: int, subgroup: int, backward: bool, off: int = 0,
                 coop: bool = False, split: bool = False) -> tuple[str, dict]:
    """The shader and compile-time defines of a sweep at these tiles: gru_*_resident.comp for
    ResidentTiles (`resident_defines`; off, coop and split as there), else the tiled gru_*.comp."""
    name = (GruBackward if backward else GruForward).shader
    if isinstance(tiles, ResidentTiles):
        return name + "_resident", resident_defines(tiles, B, H, subgroup, off, backward, coop, split)
    return name, shader_defines(tiles, H, backward)


def _need(tensor, n: int, what: str) -> None:
    """Out-of-bounds shader writes are silent: check every operand is big enough up front."""
    if tensor.size() < n:
        raise ValueError(f"{what}: buffer holds {tensor.size()} elements, needs {n}")


class _Sweep(Kernel):
    """A recurrent sweep: one dispatch per step over one workgroup per tile, and, when persistent,
    the whole sweep as one dispatch of co-resident workgroups (the PERSISTENT shader variant)."""

    backward = False
    stream = False  # W_hh streamed (stream.py): on tensor cores (coop with a float16 W_hh), or stream_f32
    stream_f32 = False  # ... in float32 on the threads' FMAs, W_hh from params
    split = False  # ... on tensor cores from float16 splits of W_hh and h_prev (forward; stream.SPLIT_ENV)
    w_frag = False  # ... W_hh's float16 copy in fragment order (forward; glsl/frag_order.comp, FRAG_W)
    vec4_offset = 0  # forward: o's offset (the resident shader reads o[t-1] rows as vec4)
    want_bias_sums = False  # backward: the sweep sums the bias gradients (GruBackward's bias_sums)

    def _whh_words(self, w_half, w_off: int) -> int:
        """The words params must hold for W_hh: w_off + 3H*H, or 0 when W_hh comes from the float16
        copy w_half (uint32 words of `pack_half`, w_off in halves), whose size is checked here."""
        if w_half is None:
            return w_off + 3 * self.H * self.H
        parts = 2 if self.split else 1  # split: hi, then lo
        if 2 * w_half.size() < w_off + parts * 3 * self.H * self.H:
            raise ValueError(f"W_hh in float16: {parts} x [3H,H] at half {w_off} exceeds its buffer of "
                             f"{2 * w_half.size()} halves")
        return 0

    def _check_save_half(self, save_half: bool) -> bool:
        """Float16 saves (SAVE16) are the streamed tensor-core sweeps' (coop with w_half) alone."""
        if save_half and not (self.coop and self.w_half is not None):
            raise ValueError("float16 saves (save_half) run on the streamed tensor-core sweeps: pass coop and w_half")
        return bool(save_half)

    def _save_words(self, save_off: int) -> int:
        """The words save must hold: [T,B,4H] at save_off, in floats, or in halves with save_half."""
        n = save_off + self.T * self.B * 4 * self.H
        return (n + 1) // 2 if self.save_half else n

    def _build(self, dev: Device, tensors, tiles, persistent: int | None, push):
        """Tiles (given, or picked for this device and sweep mode), then both shader variants. A
        sweep over resident workgroups keeps W_hh in registers where it fits (ResidentTiles,
        gru_*_resident.comp). W_hh in float16 (w_half) runs on the tiled shaders (HALF_W)."""
        B, H, backward, info = self.B, self.H, self.backward, dev.info
        if self.stream_f32 and (self.coop or self.w_half is not None or tiles is not None):
            raise ValueError("a float32 streamed sweep (stream_f32) has its own split: no tiles, coop or w_half")
        if self.stream_f32 or (self.coop and self.w_half is not None):
            return self._build_stream(dev, tensors, persistent, push)
        plan = plan_sweep(dev, B, H, backward, persistent, tiles, tiled=self.w_half is not None, coop=self.coop)
        if self.w_half is not None and isinstance(plan.tiles, ResidentTiles):
            raise ValueError("W_hh in float16 runs on the tiled sweeps: pass tiled (6-number) tiles")
        resident, self.tiles, self.residency = plan.resident, plan.tiles, plan.residency
        emulate = self.coop and not coopmat_runs(dev)  # emulated fragments (EMU: lavapipe, for the tests)
        if self.coop and ((emulate and not dev.runs_float16) or not coop_tiles_ok(self.tiles)):
            raise ValueError(f"a tensor-core sweep needs cooperative matrices (VK_NV_cooperative_matrix, "
                             f"{dev.info.name}: {', '.join(dev.coop_shapes) or 'none'}) or float16 to emulate "
                             f"them, and resident tiles of {COOP_UNITS} units x {COOP_UNITS} lanes "
                             f"(planned: {self.tiles})")
        shader, defines = sweep_shader(self.tiles, B, H, info.subgroup_size, backward, self.vec4_offset, self.coop,
                                       self.split)
        if self.coop:  # the resident tensor-core sweeps: NV until their KHR variants are measured
            defines = {**defines, **({"EMU": 1} if emulate else frag_defines(dev, False, RESIDENT_SWEEP_API_DEFAULT))}
        if self.w_half is not None:
            if not dev.runs_float16:
                raise ValueError(f"W_hh in float16 needs float16 arithmetic and 16-bit storage, which "
                                 f"{info.name} does not offer")
            defines, tensors = {**defines, "HALF_W": 1}, tensors + [self.w_half]
        if isinstance(self.tiles, ResidentTiles):
            _, nt, self.shared_bytes, _ = resident_resources(self.tiles, B, H, backward, info.subgroup_size,
                                                             self.coop, self.split)
            if nt > info.max_workgroup_invocations or self.shared_bytes > info.max_shared_memory_bytes:
                raise ValueError(f"resident tiles {self.tiles} at H={H}: {nt} threads, {self.shared_bytes} bytes "
                                 f"of shared memory (limits {info.max_workgroup_invocations}, "
                                 f"{info.max_shared_memory_bytes})")
            spec = [nt]
            if backward:  # the partial products of dGh[s] @ W_hh, binding 12
                self.partial = dev.tensor(partial_words(B, H, self.tiles), kind="storage")
                tensors = self._bias_binding(dev, tensors + [self.partial], defines)
            tensors = self._extra_bindings(tensors, defines)
        else:
            self.tiles = tuple(self.tiles)
            self.shared_bytes = _check_tiles(dev, self.tiles, backward)
            spec = list(self.tiles[:3])
        self._algorithms(dev, tensors, tile_count(self.tiles, B, H, backward), spec, push, defines, shader, resident)

    def _algorithms(self, dev: Device, tensors, n_tiles: int, spec, push, defines: dict, shader: str,
                    resident: int) -> None:
        """Both shader variants: a dispatch per step over n_tiles workgroups, and the PERSISTENT one
        over `sweep_workgroups(resident, n_tiles)` (none where resident is 0)."""
        Kernel.__init__(self, dev, tensors, [n_tiles], spec=spec, push=push, defines=defines, shader=shader)
        self.sweep_workgroups = sweep_workgroups(resident, n_tiles)
        self._sweep_algo = None
        if self.sweep_workgroups:
            self._sweep_algo = LazyAlgorithm(dev, tensors, self.shader, {**defines, "PERSISTENT": 1},
                                             [self.sweep_workgroups], spec, pack_push(*push))

    def _build_stream(self, dev: Device, tensors: list, persistent: int | None, push) -> None:
        """The streamed sweep (stream.py): its shadow (zeroed: lanes past B stay 0), then both shader
        variants. Persistent over `persistent` workgroups (default one per SM where the dispatch is
        shown co-resident), else a dispatch per step. On tensor cores: real fragments where the
        device has cooperative matrices, emulated elsewhere (EMU: lavapipe, for the tests); stream_f32:
        float32 on the threads' FMAs, W_hh read as vec4 from params (w_off a multiple of 4)."""
        B, H, backward, info, f32 = self.B, self.H, self.backward, dev.info, self.stream_f32
        emulate = not f32 and not coopmat_runs(dev)
        if emulate and not dev.runs_float16:
            raise ValueError(f"a streamed sweep needs float16 storage and arithmetic, which {info.name} does not offer")
        align, unit = (4, "floats") if f32 else (W16_ALIGN, "halves")
        if self.offsets[0 if backward else 1] % align:
            raise ValueError(f"a streamed sweep's {'float32' if f32 else 'float16'} W_hh must start at a multiple "
                             f"of {align} {unit}")
        self.stream = True
        self.tiles = fit_shared(stream_tiles(B, H, backward, f32, split=self.split), backward,
                                info.max_shared_memory_bytes)
        resident = self._stream_resident(dev, persistent)
        # the k-split's items meet inside a step (one persistent dispatch only), and its stage must fit
        if self.tiles.ksplit and (not resident or stream_shared_bytes(self.tiles, True) > info.max_shared_memory_bytes):
            self.tiles = fit_shared(stream_tiles(B, H, backward, f32, ksplit=False), backward,
                                    info.max_shared_memory_bytes)
            resident = self._stream_resident(dev, persistent)
        w = tensors[4 if backward else 1] if f32 else self.w_half  # f32: params again, as vec4
        nt, self.shared_bytes = stream_threads(self.tiles), stream_shared_bytes(self.tiles, backward)
        if nt > info.max_workgroup_invocations or self.shared_bytes > info.max_shared_memory_bytes:
            raise ValueError(f"a streamed sweep at B={B}: {nt} threads, {self.shared_bytes} bytes of shared memory "
                             f"(limits {info.max_workgroup_invocations}, {info.max_shared_memory_bytes})")
        self.shadow = dev.tensor(np.zeros(shadow_words(self.tiles, H, backward), np.uint32), np.uint32)
        dev.upload([self.shadow])
        if backward:  # the dGh shadow, W_hh at bindings 12, 13 (k-split: its partials at 14)
            tensors = tensors + [self.shadow, w]
            if self.tiles.ksplit:
                self.partial = dev.tensor(ksplit_partial_words(self.tiles, H), kind="storage")
                tensors = tensors + [self.partial]
        else:  # the h_prev shadow at 8 (the resident shader's second view of o), W_hh at 11
            tensors = tensors[:8] + [self.shadow] + tensors[9:] + [w]
        if self.w_frag:  # fragments from the copy in their order only: none staged through shared memory
            self.tiles = self.tiles._replace(shared=0)
        items = stream_items(self.tiles, H)
        if (self.tiles.resident or self.tiles.shared) and 0 < sweep_workgroups(resident, items) < items:
            # W_hh kept on chip needs one item (one slice) per workgroup
            self.tiles = self.tiles._replace(resident=0, shared=0)
            self.shared_bytes = stream_shared_bytes(self.tiles, backward)
        defines = {**stream_defines(self.tiles, H, backward, emulate, info.subgroup_size),
                   **({"SAVE16": 1} if self.save_half else {}), **({"FRAG_W": 1} if self.w_frag else {}),
                   **frag_defines(dev, emulate or f32)}
        if backward:
            tensors = self._bias_binding(dev, tensors, defines)
        tensors = self._extra_bindings(tensors, defines)
        shader = (GruBackward if backward else GruForward).shader + ("_ksplit" if self.tiles.ksplit else "_stream")
        self._algorithms(dev, tensors, items, [nt], push, defines, shader, resident)

    def _stream_resident(self, dev: Device, persistent: int | None) -> int:
        """Workgroups of the streamed sweep's persistent dispatch at self.tiles (0: a dispatch per step):
        `persistent`, else one per SM where that is shown co-resident (self.residency says why)."""
        resident = resident_workgroups(dev) if persistent is None else int(persistent)
        self.residency = None
        if resident and persistent is None:
            self.residency = sweep_residency(dev, self.tiles, self.B, self.H, self.backward, resident)
            resident = resident if self.residency.ok else 0
        return resident

    def _bias_binding(self, dev: Device, tensors: list, defines: dict) -> list:
        """A backward whose threads own their elements for the window (streamed, resident) sums the bias
        gradients where asked (`want_bias_sums`): `bias_sums` [B, 6H] at the binding after the sweep's own
        (BIAS_SUMS, defines updated in place). Readable from the host (the parity reads it)."""
        if not self.want_bias_sums:
            return tensors
        self.bias_sums = dev.tensor(6 * self.B * self.H)
        defines["BIAS_SUMS"] = len(tensors)
        return tensors + [self.bias_sums]

    def _extra_bindings(self, tensors: list, defines: dict) -> list:
        """The bindings of a resident or streamed sweep's shaders (defines updated in place for any added):
        the sweep's own. A hook for developer tools: tools/sweep_phases.py's clocked twins add a
        phase-clock buffer (glsl/include/phase_clock.glsl)."""
        return tensors

    @staticmethod
    def _sync_tensors(dev: Device, stats, B: int):
        """The grid barrier's zeroed words and the stats buffer (a private one if None)."""
        sync = dev.tensor(np.zeros(sync_words(B), np.uint32), np.uint32)
        own = stats is None
        stats = dev.tensor(np.zeros(slots.ST_WORDS, np.uint32), np.uint32) if own else stats
        dev.upload([sync] + ([stats] if own else []))
        return sync, stats

    def _dispatch(self, push, persistent: bool = False):
        algo = self._sweep_algo.get() if persistent else self.algo
        return self.dev.kp.OpAlgoDispatch(algo, pack_push(*push))


def state_rows(B: int, H: int) -> int:
    """Words of one row block [B,H]: o sits this far after hprev in the one state buffer
    (hprev_off = o_off - state_rows(B, H))."""
    return int(B) * int(H)


class GruForward(_Sweep):
    """The forward sweep: per timestep the recurrent matmul fused with the gates.

    gi: float32 [T,B,3H] at gi_off (x @ W_ih^T + b_ih); params: W_hh [3H,H] at w_off, b_hh [3H]
    at b_off; h0: [B,H] at h0_off (e.g. layer l of an [L,B,H] state); resets: uint32 [T,B]
    (1 = the state entering t is zero). Written: o [T,B,H] at o_off, hprev [B,H] at hprev_off
    (the state entering step 0, after its reset: row 0 of the state sequence, see the module
    docstring; the program passes o's buffer with hprev_off = o_off - B*H), save [T,B,4H] at
    save_off = (r, z, n, ghn) per step, hT [B,H] at hT_off (at t = T-1). Nothing accumulates. hT
    may share h0's buffer, but not the same words when T == 1 (step 0 reads h0 while writing hT).
    stats: uint32 [ST_WORDS] (default a private one): stats[ST_SYNC_TIMEOUTS] counts persistent
    sweeps whose grid barrier gave up. tiles: (threads x, threads y, k-slices, units per thread,
    lanes per thread, k chunk) or ResidentTiles, default `default_tiles(dev, B, H, False,
    persistent)`. persistent: workgroups of the one-dispatch sweep (co-resident on the device!),
    0 = T dispatches; default `resident_workgroups(dev)`. `step_ops(t)` are timestep t's dispatches
    (the per-timestep path interleaves other work). w_half: W_hh read from this float16 copy instead
    (uint32 words of `pack_half`, w_off counted in halves; b_hh stays in params), on the tiled
    shaders (HALF_W: the arithmetic stays float32); needs `Device.runs_float16`. coop: the
    per-step product h_prev @ W_hh^T on tensor cores from float16 h_prev and W_hh (float32 sums;
    resident tiles of 16 x 16 and cooperative matrices, `coop_sweeps`). coop with w_half: the
    streamed sweep (stream.py: W_hh's product from the float16 copy in memory, w_off a multiple of
    8 halves, H a multiple of 16, B <= 32; `stream_sweeps`), emulated fragments on a device
    without cooperative matrices. stream_f32: the same streamed split in float32 on the threads'
    FMAs, W_hh from params (w_off a multiple of 4; stream.py, `stream_f32_sweep`). save_half (the
    streamed tensor-core sweep only): save holds float16 (uint32 words of halves, save_off counted in
    halves; SAVE16), half the bytes; the gates' arithmetic stays float32. split (with w_half, not
    save_half; coop implied): the streamed sweep's product in float32 from float16 splits, w_half holding W_hh's
    hi then its lo (`ToHalf(lo=True)`) 3H*H halves on (stream.SPLIT_ENV; a float32 program's forward). split
    without w_half: the register-resident tensor-core sweep's product from float16 splits of params' W_hh
    (16 x 16 resident tiles; `resident_split_forward`, a float32 program's forward where W_hh fits on chip).
    w_frag (the streamed tensor-core sweep, not split): w_half's blocks at w_off are in fragment order
    (`FragOrder` with col; stream.FRAG_W_ENV), each fragment one 16-byte load an invocation.
    """

    shader = "gru_forward"

    def __init__(self, dev: Device, gi, params, h0, resets, o, hprev, save, hT, *, T: int, B: int, H: int,
                 w_off: int, b_off: int, gi_off: int = 0, h0_off: int = 0, o_off: int = 0,
                 hprev_off: int = 0, save_off: int = 0, hT_off: int = 0, tiles=None, stats=None,
                 persistent: int | None = None, w_half=None, coop: bool = False, stream_f32: bool = False,
                 save_half: bool = False, split: bool = False, w_frag: bool = False):
        self.T, self.B, self.H = T, B, H = int(T), int(B), int(H)
        self.split = bool(split)  # the tensor-core sweep's product from splits (streamed with w_half): coop
        self.w_frag = bool(w_frag)
        if self.w_frag and (self.split or not coop or w_half is None or stream_f32 or not w16_blocked()):
            raise ValueError("GruForward: w_frag is the streamed tensor-core sweep's (coop, blocked w_half, no split)")
        self.coop, self.stream_f32 = bool(coop) or self.split, bool(stream_f32)
        if self.split and save_half:
            raise ValueError("GruForward: split writes float32 saves")
        self.w_half, w_words = w_half, self._whh_words(w_half, w_off)
        self.save_half = self._check_save_half(save_half)
        if T == 1 and h0 is hT and h0_off == hT_off:
            raise ValueError("GruForward: with T == 1, hT must not overwrite h0 in the same dispatch")
        if hprev is o and hprev_off != o_off - state_rows(B, H):
            raise ValueError("GruForward: hprev in o's buffer must be the row block just before o "
                             f"(hprev_off = o_off - {state_rows(B, H)}, got {hprev_off} and {o_off})")
        for t, n, what in ((gi, gi_off + T * B * 3 * H, "gi"),
                           (params, max(w_words, b_off + 3 * H), "params"), (h0, h0_off + B * H, "h0"),
                           (resets, T * B, "resets"), (o, o_off + T * B * H, "o"),
                           (hprev, hprev_off + B * H, "hprev"), (save, self._save_words(save_off), "save"),
                           (hT, hT_off + B * H, "hT")):
            _need(t, n, what)
        self.offsets = (gi_off, w_off, b_off, h0_off, o_off, hprev_off, save_off, hT_off)
        self.vec4_offset = o_off
        self.sync, self.stats = self._sync_tensors(dev, stats, B)
        self._build(dev, [gi, params, h0, resets, o, hprev, save, hT, o, self.sync, self.stats], tiles, persistent,
                    (0, T, B, H, *self.offsets, 1))

    def _steps_op(self, t0: int, t1: int, persistent: bool = False):
        return self._dispatch((t0, self.T, self.B, self.H, *self.offsets, t1), persistent)

    def step(self, t: int):
        """The dispatch of timestep t (must run after step t-1's). A streamed sweep's step 0 needs
        its prologue first: `step_ops`."""
        if not 0 <= t < self.T:
            raise ValueError(f"timestep {t} outside [0, {self.T})")
        return self._steps_op(t, t + 1)

    def step_ops(self, t: int) -> list:
        """The dispatches of timestep t: step(t), after the streamed sweep's prologue at t = 0
        (h_prev's float16 shadow from h0: its own dispatch, as every workgroup reads all of it)."""
        return ([self._steps_op(0, 0)] if self.stream and t == 0 else []) + [self.step(t)]

    def sweep_ops(self):
        """The whole window, steps 0..T-1: one persistent dispatch, or T in this order."""
        return self.steps_ops(0, self.T)

    def steps_ops(self, t0: int, t1: int) -> list:
        """Steps [t0, t1) after steps [0, t0): one persistent dispatch (a streamed sweep's prologue
        inside it when t0 = 0), or a dispatch per step (the layer wavefront's chunks)."""
        if not 0 <= t0 < t1 <= self.T:
            raise ValueError(f"steps [{t0}, {t1}) outside [0, {self.T})")
        if self.sweep_workgroups:
            return [self._steps_op(t0, t1, persistent=True)]
        return [op for t in range(t0, t1) for op in self.step_ops(t)]


class GruBackward(_Sweep):
    """The backward sweep: per step the gate backward fused with dh @ W_hh.

    do: float32 [T,B,H] at do_off (gradient on the layer's outputs, all t); save [T,B,4H] at
    save_off from GruForward; hprev [T,B,H] at hprev_off: the state sequence (row 0 GruForward's
    hprev, row t >= 1 its o[t-1]; the program's one state buffer, see the module docstring) before
    the resets, which are applied here: where resets[t,b] = 1 row t is zeroed in place; resets
    uint32 [T,B]; params: W_hh [3H,H] at w_off; hyper: uint32 [HP_WORDS] (HP_GRADH_CLAMP, 0 =
    off). Written: dGi [T,B,3H] at dgi_off, dGh [T,B,3H] (every element, every step) in `dgh` at
    dgh_off, or with dgh=None over save's r, z, n (rows 4H apart at save_off: save is used up),
    dh0 [B,H] at dh0_off (gradient on the carried-in state, unclamped; for checks). Accumulates:
    stats[ST_CLAMP_HITS] += clamped elements (uint32), stats[ST_SYNC_TIMEOUTS] persistent sweeps
    whose grid barrier gave up. A private scratch dhz [B,H] carries the running gradient times z
    between steps; it needs no zeroing (step s = T writes it before anything reads it).
    persistent, w_half: as GruForward's. coop: the product dGh @ W_hh on tensor cores from float16
    dGh and W_hh (float32 sums; as GruForward's coop, `coop_sweeps`; with w_half streamed, as there).
    stream_f32: as GruForward's. save_half: save as GruForward's save_half wrote it, and `dgh` (given)
    [T,B,H] at dgh_off takes dGh's n third alone: its r and z thirds are dGi's, the same numbers.
    bias_sums (the streamed and register-resident sweeps; the tiled ones ignore it): the sweep also sums
    the bias gradients into `self.bias_sums`, a private [B, 6H] (row b: lane b's sums over the window of
    db_ih's r, z, n, then db_hh's), written by the window's first dispatch; None where the sweep does not
    (BIAS_SUMS, glsl/include/gru_bias_sums.glsl).
    """

    shader = "gru_backward"
    backward = True

    def __init__(self, dev: Device, do, save, hprev, resets, params, hyper, dgi, dgh, dh0, stats, *, T: int,
                 B: int, H: int, w_off: int, do_off: int = 0, save_off: int = 0, hprev_off: int = 0,
                 dgi_off: int = 0, dgh_off: int = 0, dh0_off: int = 0, tiles=None, persistent: int | None = None,
                 w_half=None, coop: bool = False, stream_f32: bool = False, save_half: bool = False,
                 bias_sums: bool = False):
        self.T, self.B, self.H = T, B, H = int(T), int(B), int(H)
        self.coop, self.stream_f32 = bool(coop), bool(stream_f32)
        self.want_bias_sums, self.bias_sums = bool(bias_sums), None  # the tensor once built (`_bias_binding`)
        self.w_half, w_words = w_half, self._whh_words(w_half, w_off)
        self.save_half = self._check_save_half(save_half)
        if save_half:  # dGh's n third alone, [T,B,H]: its r and z thirds are dGi's
            if dgh is None:
                raise ValueError("GruBackward: with float16 saves dGh's n third needs a [T,B,H] buffer of its own")
            self.dgh_ld = H
        elif dgh is None:  # dGh over r, z, n of each save row
            dgh, dgh_off, self.dgh_ld = save, save_off, 4 * H
        else:
            self.dgh_ld = 3 * H
        for t, n, what in ((do, do_off + T * B * H, "do"), (save, self._save_words(save_off), "save"),
                           (hprev, hprev_off + T * B * H, "hprev"), (resets, T * B, "resets"),
                           (params, w_words, "params"), (hyper, slots.HP_WORDS, "hyper"),
                           (dgi, dgi_off + T * B * 3 * H, "dGi"), (dgh, dgh_off + T * B * self.dgh_ld, "dGh"),
                           (dh0, dh0_off + B * H, "dh0"), (stats, slots.ST_WORDS, "stats")):
            _need(t, n, what)
        self.dhz = dev.tensor(B * H, kind="storage")  # [B,H] running gradient on h_u, times z_u
        self.offsets = (w_off, do_off, save_off, hprev_off, dgi_off, dgh_off, dh0_off)
        self.sync, _ = self._sync_tensors(dev, stats, B)
        self._build(dev, [do, save, hprev, resets, params, hyper, self.dhz, dgi, dgh, dh0, stats, self.sync],
                    tiles, persistent, (0, T, B, H, *self.offsets, self.dgh_ld, 1))

    def _steps_op(self, s: int, n: int, persistent: bool = False):
        return self._dispatch((s, self.T, self.B, self.H, *self.offsets, self.dgh_ld, n), persistent)

    def step(self, s: int):
        """Dispatch s in [0, T]: finishes step s (s < T), then gate backward of step s-1 (s >= 1)."""
        if not 0 <= s <= self.T:
            raise ValueError(f"backward dispatch {s} outside [0, {self.T}]")
        return self._steps_op(s, 1)

    def sweep_ops(self):
        """The whole window, s = T, T-1, ..., 0: one persistent dispatch, or T+1 in this order."""
        return self.steps_ops(0, self.T)

    def steps_ops(self, t0: int, t1: int) -> list:
        """The gate backward of steps [t0, t1) after that of steps [t1, T): dispatches s = t1, ..., t0+1
        (each finishes step s and runs the gate backward of s-1; the running gradient dhz and dGh's shadow
        carry over in memory), and s = 0 (dh0) when t0 = 0. One persistent dispatch, or one per s in
        this order (the layer wavefront's chunks, taken from the top chunk down). They read do's rows
        [t0, t1) and write dGi's and dGh's."""
        if not 0 <= t0 < t1 <= self.T:
            raise ValueError(f"steps [{t0}, {t1}) outside [0, {self.T})")
        n = t1 - t0 + (t0 == 0)
        if self.sweep_workgroups:
            return [self._steps_op(t1, n, persistent=True)]
        return [self.step(s) for s in range(t1, t1 - n, -1)]
