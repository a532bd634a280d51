"""GRU recurrent sweeps (glsl/gru_forward.comp, glsl/gru_backward.comp; where W_hh fits on chip,
the register-resident glsl/gru_forward_resident.comp, glsl/gru_backward_resident.comp).

Only the serial path lives here. Before the forward sweep a GEMM computes gi = x @ W_ih^T + b_ih
[T,B,3H] for all steps; after the backward sweep GEMMs compute dW_ih = dGi^T x, dW_hh = dGh^T hprev,
db_ih = colsum(dGi), db_hh = colsum(dGh), dx = dGi @ W_ih from the dGi, dGh, hprev written here.
numpy twins: catchat.reference.gru_layer_forward, gru_sweep_backward, gru_weight_grads.

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

import os
from typing import NamedTuple

import numpy as np

from catchat.errors import UsageError
from catchat.vk import slots, tiles, tune
from catchat.vk.device import Device, pack_push
from catchat.vk.kernels import Kernel, LazyAlgorithm, ceil_div, device_sms
from catchat.vk.kernels.gemm import coopmat_runs
from catchat.vk.occupancy import Residency, co_residency

# Tiles: (threads x, threads y, k-slices, block x, block y, k chunk).
#   forward:  x = units (block x = units per thread), y = lanes, k chunk = KC floats of H
#   backward: x = vec4 column groups (block x = groups of 4 columns per thread), y = lanes,
#             k chunk = RC rows of W_hh
# Threads x*y*slices; one workgroup covers (x*bx [*4 backward]) x (y*by) outputs. Candidates in
# order of preference, each with the fewest workgroups it needs to fill a big GPU; the last is
# the fallback for small shapes. The candidates are measurements: catchat/vk/tiles.py holds them,
# a row per device family with the benchmark that chose them; the pickers read the device's row
# (`tile_row`). The H200's row, by name (tests, parity and tools force these):
_H200 = tiles.GRU_ROWS[0]
FORWARD_TILES, BACKWARD_TILES = _H200.forward, _H200.backward

def shader_defines(tiles, H: int, backward: bool) -> dict:
    """The compile-time defines of the step shader for `tiles`: register blocks, chunk and the
    elements each thread stages per chunk."""
    nx, ny, ks, bx, by, kc = tiles
    nt, (tx, tb) = nx * ny * ks, tile_extent(tiles, backward)
    if backward:  # staged per chunk: dGh [TB][RC], W_hh [RC][TK]
        return {"RQ": bx, "RB": by, "RC": kc, "LG": ceil_div(tb * kc, nt), "LW": ceil_div(kc * tx, nt)}
    # staged per chunk: hp [TB][KC], W_hh [3TJ][KC]
    return {"RJ": bx, "RB": by, "KC": kc, "LH": ceil_div(tb * kc, nt), "LW": ceil_div(3 * tx * kc, nt)}


# Persistent sweeps (one dispatch per sweep, see glsl/include/grid_sync.glsl) want about one tile
# per resident workgroup: bigger tiles, tried in order, the one with the most tiles that still fit.
PERSISTENT_FORWARD_TILES, PERSISTENT_BACKWARD_TILES = _H200.persistent_forward, _H200.persistent_backward

class ResidentTiles(NamedTuple):
    """Tiles of a register-resident sweep (glsl/gru_*_resident.comp): a workgroup owns `cols`
    units x `lanes`, i.e. their 3*cols rows of W_hh.
    Forward: a thread owns `per_thread` of the units and `kv` vec4 of the reduction over k,
    12*per_thread*kv floats of W_hh, sums `batch` lanes at a time, and up to `sl` slices reduce
    by subgroup shuffles. Backward: a thread owns `per_thread` columns of dh and one of `sl` row
    slices, ceil(3*cols/sl)*per_thread floats of W_hh, and sums `batch` lanes (a multiple of 4) at
    a time; the slices reduce by shuffles; kv is unused (0)."""

    cols: int
    lanes: int
    per_thread: int
    kv: int
    batch: int
    sl: int = 32


# Candidates (cols, per_thread, kv, batch or 0 = all lanes, sl) in order of preference; the lanes
# per tile follow from the workgroups available (the fewest that leave one workgroup per tile).
# Measured per device family (tiles.py; docs/benchmarks.md).
RESIDENT_FORWARD_TILES, RESIDENT_BACKWARD_TILES = _H200.resident_forward, _H200.resident_backward
# 32-bit registers per SM (every NVIDIA GPU since Kepler; resident sweeps run where the driver
# reports SMs, i.e. NVIDIA): a workgroup whose threads need more than REGISTER_FILE / threads
# each would spill its W_hh slice to memory or not launch.
REGISTER_FILE = _H200.register_file


def tile_row(dev: Device) -> tiles.GruRow:
    """The device family's row of sweep tile candidates (tiles.GRU_ROWS)."""
    return tiles.gru_row(dev.info.name, dev.info.type != "CPU")

def resident_registers(tiles: ResidentTiles, backward: bool) -> int:
    """Registers a thread of a resident sweep needs, roughly: W_hh, partial sums, 24 for the rest."""
    t = tiles
    if backward:
        return (ceil_div(3 * t.cols, t.sl) + t.batch) * t.per_thread + 24
    return 12 * t.per_thread * t.kv + 3 * t.per_thread * t.batch + 24


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def shuffle_slices(tiles: ResidentTiles, ks: int, subgroup: int) -> int:
    """Slices that reduce by shuffles: a power of two <= ks, tiles.sl and the subgroup size."""
    return min(ks, tiles.sl, next_pow2(subgroup + 1) // 2)


def resident_shape(tiles: ResidentTiles, B: int, H: int, backward: bool,
                   subgroup: int = 32) -> tuple[int, int, int, int]:
    """(slices, tiles, threads, shared bytes) of resident `tiles` at [B, H] on a device with this
    subgroup size. Forward: the slices are a power of two with slices * kv * 4 >= H. Backward:
    the row slices (at most the subgroup size); threads * per_thread / slices cover H columns, in
    whole subgroups."""
    n_tiles = ceil_div(H, tiles.cols) * ceil_div(B, tiles.lanes)
    if backward:  # dgs [3*cols][lanes in whole batches / 4 + 1] vec4
        sl = shuffle_slices(tiles, next_pow2(3 * tiles.cols), subgroup)
        nt = ceil_div(sl * ceil_div(H, tiles.per_thread), subgroup) * subgroup
        return sl, n_tiles, nt, 16 * 3 * tiles.cols * (ceil_div(tiles.lanes, tiles.batch) * tiles.batch // 4 + 1)
    ks = next_pow2(ceil_div(H, 4 * tiles.kv))
    kg = ks // shuffle_slices(tiles, ks, subgroup)
    # hs [TB*KS*KV] vec4 + red [KG*3*TB*NU]
    nbytes = 16 * tiles.lanes * ks * tiles.kv + 12 * kg * tiles.lanes * tiles.cols
    return ks, n_tiles, tiles.cols // tiles.per_thread * ks, nbytes


def resident_backward(units: int, lanes: int, per_thread: int, slices: int, batch: int) -> ResidentTiles:
    """Backward resident tiles: `units` x `lanes`, `per_thread` columns of dh and one of `slices`
    row slices per thread, lanes in batches of `batch`."""
    return ResidentTiles(units, lanes, per_thread, 0, batch, slices)


def resident_candidate(B: int, H: int, workgroups: int, cols: int, per_thread: int, kv: int, batch: int,
                       sl: int) -> ResidentTiles | None:
    """The tiles of candidate (cols, per_thread, kv, batch or 0 = all lanes, sl) with the fewest
    lanes per tile that leave a workgroup per tile (None: not even one lane tile fits)."""
    lane_tiles = workgroups // ceil_div(H, cols)
    if lane_tiles < 1:
        return None
    lanes = ceil_div(B, min(B, lane_tiles))
    if batch:
        lanes = ceil_div(lanes, batch) * batch
    return ResidentTiles(cols, lanes, per_thread, kv, batch or lanes, sl)


def resident_fits(tiles: ResidentTiles, B: int, H: int, backward: bool, workgroups: int, max_threads: int,
                  max_shared: int, subgroup: int = 32, register_file: int = REGISTER_FILE) -> bool:
    """A workgroup per tile within `workgroups`, the threads, the shared memory and the register file."""
    _, n_tiles, nt, nbytes = resident_shape(tiles, B, H, backward, subgroup)
    return (n_tiles <= workgroups and nt <= max_threads and nbytes <= max_shared
            and nt * resident_registers(tiles, backward) <= register_file)


def pick_resident_tiles(B: int, H: int, workgroups: int, max_threads: int, max_shared: int,
                        backward: bool = False, subgroup: int = 32, row: tiles.GruRow = _H200):
    """The first resident candidate of `row` that fits (`resident_fits`; None: W_hh does not fit
    on chip this way, the tiled shader runs)."""
    for cand in (row.resident_backward if backward else row.resident_forward):
        t = resident_candidate(B, H, workgroups, *cand)
        if t and resident_fits(t, B, H, backward, workgroups, max_threads, max_shared, subgroup, row.register_file):
            return t
    return None


def resident_defines(tiles: ResidentTiles, B: int, H: int, subgroup: int, off: int = 0,
                     backward: bool = False, coop: bool = False) -> dict:
    """Compile-time defines of gru_{forward,backward}_resident.comp (see their headers). off: the
    element offset of o, read as vec4 rows by the forward shader: vec4 loads need it and H to be
    multiples of 4. coop: the sweep's product on tensor cores (COOP; `coop_tiles_ok`)."""
    t = tiles
    if coop and not coop_tiles_ok(t):
        raise ValueError(f"the tensor-core sweeps take tiles of {COOP_UNITS} x {COOP_UNITS}, not {t}")
    if backward:
        if min(t.cols, t.lanes, t.per_thread, t.batch, t.sl) < 1 or t.batch % 4 or t.sl != next_pow2(t.sl):
            raise ValueError(f"bad resident backward tiles {t}: batch must be a multiple of 4, slices a power of two")
    elif t.cols % t.per_thread or t.lanes % t.batch or min(t) < 1:
        raise ValueError(f"bad resident tiles {t}: per_thread must divide cols, batch divide lanes")
    ks = resident_shape(t, B, H, backward, subgroup)[0]
    sl = ks if backward else shuffle_slices(t, ks, subgroup)
    log2sl, nv = sl.bit_length() - 1, (1 if backward else 3) * t.per_thread * t.batch
    ntr = min(log2sl, (nv & -nv).bit_length() - 1)  # halvings while the value count stays whole
    common = {"NU": t.cols, "TB": t.lanes, "LB": t.batch, "SL": sl, "LOG2SL": log2sl, "NTR": ntr}
    if backward:
        coop_defs = {"COOP": 1, "COOP_NF": ceil_div(ceil_div(H, 16), COOP_THREADS // 32)} if coop else {}
        return {**common, "CPT": t.per_thread, **coop_defs}
    vec4_rows = {"HV4": 1} if H % 4 == 0 and off % 4 == 0 else {}
    coop_defs = {"COOP": 1, "COOP_KF": ceil_div(ceil_div(H, 16), 4)} if coop else {}
    return {**common, "RU": t.per_thread, "KV": t.kv, "KS": ks, **vec4_rows, **coop_defs}


# The sweeps' products on tensor cores (gru_*_resident.comp COOP, train.precision fp16): tiles of 16
# units x 16 lanes (one 16 x 16 fragment per gate), 16 subgroups of 32 (the forward's 12 multiply).
COOP_UNITS, COOP_THREADS = 16, 512
COOP_ENV = "CATCHAT_SWEEP_COOP"  # =0: the threads' FMAs at fp16 too (to compare; tools/gpu-check.sh)


def coop_tiles_ok(t) -> bool:
    """Whether resident tiles suit the tensor-core sweeps (forward and backward): 16 units x 16 lanes."""
    return isinstance(t, ResidentTiles) and t.cols == COOP_UNITS and t.lanes == COOP_UNITS


def coop_shared_bytes(H: int, backward: bool = False) -> int:
    """Shared memory of a tensor-core sweep. Forward: h_prev as float16 [16][16*4*COOP_KF + 8] (at
    least the 12 subgroups' 16 x 16 staging of W_hh) and the 4 k-groups' float32 partials
    [4][3][16][16]. Backward: dGh as float16 [16][48 + 8], and per subgroup a float16 and a float32
    16 x 16 scratch."""
    if backward:
        return 2 * 16 * (3 * COOP_UNITS + 8) + 16 * 256 * (2 + 4)
    sh = 16 * 4 * ceil_div(ceil_div(H, 16), 4) + 8
    return 2 * max(16 * sh, 12 * 256) + 4 * 4 * 3 * 256


def coop_sweeps(dev: Device, B: int, H: int, precision: str) -> bool:
    """Whether a program at `precision` runs its sweeps' products on tensor cores (forward and
    backward alike, as the twin's `recurrent` assumes): fp16, not turned off (CATCHAT_SWEEP_COOP=0),
    cooperative matrices on the device, and resident 16 x 16 tiles planned for both directions with
    the tensor-core kernels' own threads and shared memory."""
    if precision != "fp16" or os.environ.get(COOP_ENV, "").strip() == "0" or not coopmat_runs(dev):
        return False
    return all(coop_tiles_ok(plan_sweep(dev, B, H, backward, coop=True).tiles) for backward in (False, True))


def resident_resources(tiles: ResidentTiles, B: int, H: int, backward: bool, subgroup: int,
                       coop: bool = False) -> tuple[int, int, int, int]:
    """(tiles, threads, shared bytes, registers per thread or 0 where unknown) of a resident sweep's
    workgroups: the FMA kernels' (`resident_shape`, `resident_registers`), or with coop the
    tensor-core kernels' (COOP_THREADS, `coop_shared_bytes`; their registers are not modelled)."""
    _, n_tiles, nt, nbytes = resident_shape(tiles, B, H, backward, subgroup)
    if coop and coop_tiles_ok(tiles):
        return n_tiles, COOP_THREADS, coop_shared_bytes(H, backward), 0
    return n_tiles, nt, nbytes, resident_registers(tiles, backward)


def partial_words(B: int, H: int, tiles) -> int:
    """Words of the resident backward sweep's partial products [2, unit tiles, B, H] (0 otherwise)."""
    return 2 * ceil_div(H, tiles.cols) * B * H if isinstance(tiles, ResidentTiles) else 0


def backward_scratch_words(dev: Device | None, B: int, H: int) -> int:
    """Words a GruBackward at [B, H] allocates on dev beyond its operands, by default tiles: dhz,
    the barrier words and, when resident, the partial products (no dev: as on a CPU device)."""
    tiles = plan_sweep(dev, B, H, True).tiles if dev is not None else None
    return B * H + sync_words(B) + partial_words(B, H, tiles)


def table_tiles(dev: Device, B: int, H: int, backward: bool, resident: int):
    """The tables' tiles for a sweep at [B, H] on dev over `resident` persistent workgroups (0: a
    dispatch per step): register-resident where W_hh fits (`pick_resident_tiles`), else tiled
    (`pick_tiles`, its workgroup minimums scaled to the device's SM count)."""
    info = dev.info
    if resident:
        resident_tiles = pick_resident_tiles(B, H, resident, info.max_workgroup_invocations,
                                             info.max_shared_memory_bytes, backward, info.subgroup_size, tile_row(dev))
        if resident_tiles:
            return resident_tiles
    return tiled_tiles(dev, B, H, backward, resident)


def tiled_tiles(dev: Device, B: int, H: int, backward: bool, resident: int) -> tuple:
    """The tables' tiles of the tiled (W_hh streamed) sweep shaders, per step or persistent."""
    info = dev.info
    return tuple(pick_tiles(B, H, backward, resident, info.max_shared_memory_bytes, tile_row(dev), device_sms(dev),
                            info.max_workgroup_invocations))


def sweep_candidates(dev: Device, B: int, H: int, backward: bool, resident: int) -> list:
    """Every tile the tables list for a sweep at [B, H] over `resident` workgroups that fits this
    device: the register-resident candidates (persistent sweeps only), the persistent tiled ones
    that fit `resident`, then the per-step ones. What `catchat bench --tune` measures, and what a
    cached choice must be one of."""
    info, row, out = dev.info, tile_row(dev), []
    limits = (info.max_workgroup_invocations, info.max_shared_memory_bytes)
    if resident:
        for cand in (row.resident_backward if backward else row.resident_forward):
            t = resident_candidate(B, H, resident, *cand)
            if t and t not in out and resident_fits(t, B, H, backward, resident, info.max_workgroup_invocations,
                                                    info.max_shared_memory_bytes, info.subgroup_size,
                                                    row.register_file):
                out.append(t)
        for t in (row.persistent_backward if backward else row.persistent_forward):
            if n_workgroups(t, B, H, backward) <= resident and _tiles_fit(t, backward, *limits) and t not in out:
                out.append(tuple(t))
    for t, _ in (row.backward if backward else row.forward):
        if _tiles_fit(t, backward, *limits) and tuple(t) not in out:
            out.append(tuple(t))
    return out


def _tiles_fit(t, backward: bool, max_threads: int, max_shared: int) -> bool:
    """Tiled-sweep tiles within a workgroup's threads and shared memory."""
    return t[0] * t[1] * t[2] <= max_threads and shared_bytes(t, backward) <= max_shared


def _from_cache(value):
    """A cached sweep choice ["ResidentTiles" | "tuple", [...]] as tiles (None: not that shape)."""
    try:
        kind, vals = value
        vals = [int(v) for v in vals]
        if kind == "ResidentTiles" and len(vals) == len(ResidentTiles._fields):
            return ResidentTiles(*vals)
        if kind == "tuple" and len(vals) == 6:
            return tuple(vals)
    except (TypeError, ValueError):
        pass
    return None


def to_cache(tiles) -> list:
    """Tiles as the tuning cache stores them."""
    return [type(tiles).__name__ if isinstance(tiles, ResidentTiles) else "tuple", [int(v) for v in tiles]]


def default_tiles(dev: Device, B: int, H: int, backward: bool, resident: int):
    """The tiles a sweep at [B, H] uses on dev over `resident` persistent workgroups (0: a dispatch
    per step): the choice `catchat bench --tune` cached for this device and shape where it is still
    a candidate (`sweep_candidates`), else the tables' (`table_tiles`)."""
    key = tune.gru_key(B, H, backward, resident)
    cached = tune.lookup(dev.info, "gru", key, dict(B=B, H=H, backward=backward, resident=resident))
    if cached is not None:
        t = _from_cache(cached)
        if t is not None and t in sweep_candidates(dev, B, H, backward, resident):
            return t
        tune.note(f"ignoring the tuned sweep tiles {cached} for {key}: not a candidate on this device "
                  f"(`catchat bench CONFIG --tune` measures again)")
    return table_tiles(dev, B, H, backward, resident)


class SweepPlan(NamedTuple):
    """How a sweep at [B, H] runs: its tiles, the persistent workgroups it may use (0: a dispatch
    per step) and why (the co-residency shown, or why it was not)."""

    tiles: object
    resident: int
    residency: Residency | None


def sweep_residency(dev: Device, tiles, B: int, H: int, backward: bool, resident: int,
                    coop: bool = False) -> Residency:
    """Whether the persistent dispatch of a sweep at these tiles over `resident` workgroups is
    shown co-resident on dev (catchat/vk/occupancy.py); coop: of the tensor-core kernels."""
    info = dev.info
    if isinstance(tiles, ResidentTiles):
        n_tiles, nt, nbytes, regs = resident_resources(tiles, B, H, backward, info.subgroup_size, coop)
    else:
        n_tiles, nt, nbytes, regs = n_workgroups(tiles, B, H, backward), tiles[0] * tiles[1] * tiles[2], \
            shared_bytes(tiles, backward), 0
    return co_residency(info, sweep_workgroups(resident, n_tiles), nt, nbytes, regs, tile_row(dev).register_file)


def plan_sweep(dev: Device, B: int, H: int, backward: bool, persistent: int | None = None, tiles=None,
               tiled: bool = False, coop: bool = False) -> SweepPlan:
    """The tiles and mode of a sweep. `persistent` given (a caller's count) or CATCHAT_PERSISTENT set:
    that many workgroups, unchecked (the caller vouches; the barrier's timeout guard still reports a
    failure). Else one per SM, if the persistent dispatch is shown co-resident from the device's
    limits (`sweep_residency`); where it is not, one dispatch per step, with per-step tiles.
    tiled: the tiled shaders' tables only (`tiled_tiles`: W_hh streamed, never register-resident).
    coop: co-residency judged for the tensor-core kernels (`resident_resources`)."""
    def pick(resident: int):
        if tiles is not None:
            return tiles
        return tiled_tiles(dev, B, H, backward, resident) if tiled else default_tiles(dev, B, H, backward, resident)

    forced = persistent is not None or persistent_override() is not None
    resident = resident_workgroups(dev) if persistent is None else int(persistent)
    chosen = pick(resident)
    if not resident or forced:
        return SweepPlan(chosen, resident, None)
    res = sweep_residency(dev, chosen, B, H, backward, resident, coop)
    if res.ok:
        return SweepPlan(chosen, resident, res)
    return SweepPlan(pick(0), 0, res)


def sweep_shader(tiles, B: int, H: int, subgroup: int, backward: bool, off: int = 0,
                 coop: bool = False) -> tuple[str, dict]:
    """The shader and compile-time defines of a sweep at these tiles: gru_*_resident.comp for
    ResidentTiles (`resident_defines`; off and coop as there), else the tiled gru_*.comp."""
    name = (GruBackward if backward else GruForward).shader
    if isinstance(tiles, ResidentTiles):
        return name + "_resident", resident_defines(tiles, B, H, subgroup, off, backward, coop)
    return name, shader_defines(tiles, H, backward)


def resident_workgroups(dev: Device) -> int:
    """How many workgroups a persistent sweep may launch, all co-resident; 0 = one dispatch per step.

    CATCHAT_PERSISTENT=0 turns persistent sweeps off, =N forces N workgroups; by default one per
    SM where the driver reports the SM count (VK_NV_shader_sm_builtins), else off.
    """
    forced = persistent_override()
    return device_sms(dev) if forced is None else forced


def persistent_override() -> int | None:
    """CATCHAT_PERSISTENT as a workgroup count (0: a dispatch per step), None where it is not set."""
    env = os.environ.get("CATCHAT_PERSISTENT", "").strip()
    if not env:
        return None
    try:
        return max(0, int(env))
    except ValueError:
        raise UsageError(f"CATCHAT_PERSISTENT={env!r} is not a number",
                         hint="unset it, or set 0 (a dispatch per timestep) or a workgroup count") from None


def per_step_reason(dev: Device) -> str:
    """Why this device runs sweeps a dispatch per step when nothing forces it: two workgroups are
    not shown co-resident from its limits (catchat/vk/occupancy.py)."""
    return co_residency(dev.info, 2, 1, 0).reason


def sweep_workgroups(resident: int, n_tiles: int) -> int:
    """Workgroups of a persistent sweep over n_tiles tiles per step: the fewest that keep the
    tiles per workgroup at ceil(n_tiles / resident) (balanced), 0 when resident is 0."""
    if resident <= 0:
        return 0
    return ceil_div(n_tiles, ceil_div(n_tiles, resident))


def tile_extent(tiles, backward: bool) -> tuple[int, int]:
    """(columns or units, lanes) one workgroup covers."""
    nx, ny, _, bx, by, _ = tiles
    return nx * bx * (4 if backward else 1), ny * by


def n_workgroups(tiles, B: int, H: int, backward: bool) -> int:
    tx, tb = tile_extent(tiles, backward)
    return ceil_div(H, tx) * ceil_div(B, tb)


def tile_count(tiles, B: int, H: int, backward: bool) -> int:
    """Tiles (workgroups of a per-step dispatch) of a sweep over [B, H] outputs, resident or tiled."""
    if isinstance(tiles, ResidentTiles):
        return resident_shape(tiles, B, H, backward)[1]
    return n_workgroups(tiles, B, H, backward)


def pick_tiles(B: int, H: int, backward: bool = False, resident: int = 0, max_shared: int = 48 * 1024,
               row: tiles.GruRow = _H200, cus: int = 0, max_threads: int = 1024):
    """Per-step sweeps (resident 0): the first candidate within max_shared bytes and max_threads
    whose workgroup count for [B, H] outputs reaches its threshold (the row's, measured on a GPU of
    row.measured_cus SMs, scaled to `cus`; 0 = unknown: as measured). Persistent sweeps over
    `resident` workgroups: the persistent candidate with the most tiles that still fit (and within
    max_shared bytes and max_threads), else the per-step choice."""
    if resident > 0:
        fits = [t for t in (row.persistent_backward if backward else row.persistent_forward)
                if n_workgroups(t, B, H, backward) <= resident and _tiles_fit(t, backward, max_threads, max_shared)]
        if fits:
            return max(fits, key=lambda t: n_workgroups(t, B, H, backward))
    cands = row.backward if backward else row.forward
    for cand, min_wg in cands:
        if (_tiles_fit(cand, backward, max_threads, max_shared)
                and n_workgroups(cand, B, H, backward) >= tiles.scaled_workgroups(min_wg, cus, row.measured_cus)):
            return cand
    return cands[-1][0]


def sync_words(B: int) -> int:
    """Words of a sweep's grid-barrier buffer: abort, finished, and arrivals of at most a group
    per lane (glsl/include/grid_sync.glsl)."""
    return 2 + int(B)


def _need(tensor, n: int, what: str) -> None:
    """Out-of-bounds shader writes are silent: check every operand is big enough up front."""
    if tensor.size() < n:
        raise ValueError(f"{what}: buffer holds {tensor.size()} elements, needs {n}")


def shared_bytes(tiles, backward: bool) -> int:
    """Shared memory of the step shader at these tiles."""
    nx, ny, ks, bx, by, kc = tiles
    red = nx * ny * max(ks - 1, 1)  # threads parking partials (slices 1..)
    if backward:  # gs [RC][TB+1] + ws [RC][TK] + red + hits (+ the grid barrier's flag)
        return 4 * kc * (ny * by + 1) + 16 * kc * nx * bx + 4 * 4 * bx * by * red + 8
    # hs [TB][KC+4] + ws [3TJ][KC+4] + red (+ the grid barrier's flag)
    return 4 * (kc + 4) * (ny * by + 3 * nx * bx) + 4 * 3 * bx * by * red + 4


def _check_tiles(dev: Device, tiles, backward: bool) -> int:
    """Validate a tile tuple; returns its shared-memory bytes."""
    nx, ny, ks, bx, by, kc = tiles
    nt = nx * ny * ks
    if nt > dev.info.max_workgroup_invocations or min(tiles) < 1 or kc % 4:
        raise ValueError(f"bad tiles {tiles}: {nt} threads, k chunk must be a multiple of 4")
    nbytes, limit = shared_bytes(tiles, backward), dev.info.max_shared_memory_bytes
    if nbytes > limit:
        raise ValueError(f"tiles {tiles}: {nbytes} bytes of shared memory, limit {limit}")
    return nbytes


class _Sweep(Kernel):
    """A recurrent sweep: one dispatch per step over one workgroup per tile, and, when persistent,
    the whole sweep as one dispatch of co-resident workgroups (the PERSISTENT shader variant)."""

    backward = False
    vec4_offset = 0  # forward: o's offset (the resident shader reads o[t-1] rows as vec4)

    def _whh_words(self, w_half, w_off: int) -> int:
        """The words params must hold for W_hh: w_off + 3H*H, or 0 when W_hh comes from the float16
        copy w_half (uint32 words of `pack_half`, w_off in halves), whose size is checked here."""
        if w_half is None:
            return w_off + 3 * self.H * self.H
        if 2 * w_half.size() < w_off + 3 * self.H * self.H:
            raise ValueError(f"W_hh in float16: [3H,H] at half {w_off} exceeds its buffer of "
                             f"{2 * w_half.size()} halves")
        return 0

    def _build(self, dev: Device, tensors, tiles, persistent: int | None, push):
        """Tiles (given, or picked for this device and sweep mode), then both shader variants. A
        sweep over resident workgroups keeps W_hh in registers where it fits (ResidentTiles,
        gru_*_resident.comp). W_hh in float16 (w_half) runs on the tiled shaders (HALF_W)."""
        B, H, backward, info = self.B, self.H, self.backward, dev.info
        plan = plan_sweep(dev, B, H, backward, persistent, tiles, tiled=self.w_half is not None, coop=self.coop)
        if self.w_half is not None and isinstance(plan.tiles, ResidentTiles):
            raise ValueError("W_hh in float16 runs on the tiled sweeps: pass tiled (6-number) tiles")
        resident, self.tiles, self.residency = plan.resident, plan.tiles, plan.residency
        if self.coop:
            if not coopmat_runs(dev) or not coop_tiles_ok(self.tiles):
                raise ValueError(f"a tensor-core sweep needs cooperative matrices (VK_NV_cooperative_matrix, "
                                 f"{dev.info.name}: {', '.join(dev.coop_shapes) or 'none'}) and resident tiles of "
                                 f"{COOP_UNITS} units x {COOP_UNITS} lanes (planned: {self.tiles})")
        shader, defines = sweep_shader(self.tiles, B, H, info.subgroup_size, backward, self.vec4_offset, self.coop)
        if self.w_half is not None:
            if not dev.runs_float16:
                raise ValueError(f"W_hh in float16 needs float16 arithmetic and 16-bit storage, which "
                                 f"{info.name} does not offer")
            defines, tensors = {**defines, "HALF_W": 1}, tensors + [self.w_half]
        if isinstance(self.tiles, ResidentTiles):
            _, nt, self.shared_bytes, _ = resident_resources(self.tiles, B, H, backward, info.subgroup_size,
                                                             self.coop)
            if nt > info.max_workgroup_invocations or self.shared_bytes > info.max_shared_memory_bytes:
                raise ValueError(f"resident tiles {self.tiles} at H={H}: {nt} threads, {self.shared_bytes} bytes "
                                 f"of shared memory (limits {info.max_workgroup_invocations}, "
                                 f"{info.max_shared_memory_bytes})")
            spec = [nt]
            if backward:  # the partial products of dGh[s] @ W_hh, binding 12
                self.partial = dev.tensor(partial_words(B, H, self.tiles), kind="storage")
                tensors = tensors + [self.partial]
            tensors = self._resident_extras(tensors, defines)
        else:
            self.tiles = tuple(self.tiles)
            self.shared_bytes = _check_tiles(dev, self.tiles, backward)
            spec = list(self.tiles[:3])
        n_tiles = tile_count(self.tiles, B, H, backward)
        Kernel.__init__(self, dev, tensors, [n_tiles], spec=spec, push=push, defines=defines, shader=shader)
        self.sweep_workgroups = sweep_workgroups(resident, n_tiles)
        self._sweep_algo = None
        if self.sweep_workgroups:
            self._sweep_algo = LazyAlgorithm(dev, tensors, self.shader, {**defines, "PERSISTENT": 1},
                                             [self.sweep_workgroups], spec, pack_push(*push))

    def _resident_extras(self, tensors: list, defines: dict) -> list:
        """The bindings of a resident sweep's shaders (defines updated in place for any added):
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
    0 = T dispatches; default `resident_workgroups(dev)`. `step(t)` is always one dispatch (the
    per-timestep path interleaves other work). w_half: W_hh read from this float16 copy instead
    (uint32 words of `pack_half`, w_off counted in halves; b_hh stays in params), on the tiled
    shaders (HALF_W: the arithmetic stays float32); needs `Device.runs_float16`. coop: the
    per-step product h_prev @ W_hh^T on tensor cores from float16 h_prev and W_hh (float32 sums;
    resident tiles of 16 x 16 and cooperative matrices, `coop_sweeps`).
    """

    shader = "gru_forward"

    def __init__(self, dev: Device, gi, params, h0, resets, o, hprev, save, hT, *, T: int, B: int, H: int,
                 w_off: int, b_off: int, gi_off: int = 0, h0_off: int = 0, o_off: int = 0,
                 hprev_off: int = 0, save_off: int = 0, hT_off: int = 0, tiles=None, stats=None,
                 persistent: int | None = None, w_half=None, coop: bool = False):
        self.T, self.B, self.H = T, B, H = int(T), int(B), int(H)
        self.coop = bool(coop)
        self.w_half, w_words = w_half, self._whh_words(w_half, w_off)
        if T == 1 and h0 is hT and h0_off == hT_off:
            raise ValueError("GruForward: with T == 1, hT must not overwrite h0 in the same dispatch")
        if hprev is o and hprev_off != o_off - state_rows(B, H):
            raise ValueError("GruForward: hprev in o's buffer must be the row block just before o "
                             f"(hprev_off = o_off - {state_rows(B, H)}, got {hprev_off} and {o_off})")
        for t, n, what in ((gi, gi_off + T * B * 3 * H, "gi"),
                           (params, max(w_words, b_off + 3 * H), "params"), (h0, h0_off + B * H, "h0"),
                           (resets, T * B, "resets"), (o, o_off + T * B * H, "o"),
                           (hprev, hprev_off + B * H, "hprev"), (save, save_off + T * B * 4 * H, "save"),
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
        """The dispatch of timestep t (must run after step t-1's)."""
        if not 0 <= t < self.T:
            raise ValueError(f"timestep {t} outside [0, {self.T})")
        return self._steps_op(t, t + 1)

    def sweep_ops(self):
        """The whole window, steps 0..T-1: one persistent dispatch, or T in this order."""
        if self.sweep_workgroups:
            return [self._steps_op(0, self.T, persistent=True)]
        return [self.step(t) for t in range(self.T)]


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
    dGh and W_hh (float32 sums; as GruForward's coop, `coop_sweeps`).
    """

    shader = "gru_backward"
    backward = True

    def __init__(self, dev: Device, do, save, hprev, resets, params, hyper, dgi, dgh, dh0, stats, *, T: int,
                 B: int, H: int, w_off: int, do_off: int = 0, save_off: int = 0, hprev_off: int = 0,
                 dgi_off: int = 0, dgh_off: int = 0, dh0_off: int = 0, tiles=None, persistent: int | None = None,
                 w_half=None, coop: bool = False):
        self.T, self.B, self.H = T, B, H = int(T), int(B), int(H)
        self.coop = bool(coop)
        self.w_half, w_words = w_half, self._whh_words(w_half, w_off)
        if dgh is None:  # dGh over r, z, n of each save row
            dgh, dgh_off, self.dgh_ld = save, save_off, 4 * H
        else:
            self.dgh_ld = 3 * H
        for t, n, what in ((do, do_off + T * B * H, "do"), (save, save_off + T * B * 4 * H, "save"),
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
        if self.sweep_workgroups:
            return [self._steps_op(self.T, self.T + 1, persistent=True)]
        return [self.step(s) for s in range(self.T, -1, -1)]
