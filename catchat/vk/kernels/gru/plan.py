"""Planning a sweep: which tiles it takes on this device (tuned, or the tables': register-resident
where W_hh fits, else tiled), whether it runs as one persistent dispatch (co-residency shown from
the device's limits, catchat/vk/occupancy.py; CATCHAT_PERSISTENT) or a dispatch per step, and
whether its products run on tensor cores.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from catchat.errors import UsageError
from catchat.vk import tiles, tune
from catchat.vk.device import Device
from catchat.vk.kernels import ceil_div, device_sms
from catchat.vk.kernels.gemm import coopmat_runs
from catchat.vk.kernels.gru.resident import (
    ResidentTiles,
    coop_shared_bytes,
    coop_tiles_ok,
    partial_words,
    pick_resident_tiles,
    resident_candidate,
    resident_fits,
    resident_resources,
    resident_shape,
)
from catchat.vk.kernels.gru.stream import (
    SYNC_GROUPS,
    StreamTiles,
    stream_items,
    stream_ok,
    stream_shared_bytes,
    stream_split,
    stream_threads,
    stream_tiles,
)
from catchat.vk.kernels.gru.tiled import _tiles_fit, n_workgroups, pick_tiles, shared_bytes
from catchat.vk.occupancy import Residency, co_residency
from catchat.vk.switches import env_switch


def tile_row(dev: Device) -> tiles.GruRow:
    """The device family's row of sweep tile candidates (tiles.GRU_ROWS)."""
    return tiles.gru_row(dev.info.name, dev.info.type != "CPU")


# =0: the threads' FMAs at fp16 too; =resident: the resident tiles both ways where they fit (no "mixed");
# =mixed: the resident forward and the streamed backward even where a program would stream both ("stream32");
# =stream / =stream32: the streamed sweeps both ways even where the resident tiles fit (float16 / float32
# saves); 1 or unset: the program's choice (`program_products`); to compare (tools/gpu-check.sh)
COOP_ENV = "CATCHAT_SWEEP_COOP"
COOP_CHOICES = ("", "0", "1", "resident", "mixed", "stream", "stream32")


def coop_sweeps(dev: Device, B: int, H: int, precision: str) -> bool:
    """Whether a program at `precision` runs its sweeps' products on tensor cores (forward and
    backward alike, as the twin's `recurrent` assumes): `sweep_products` says how, or None."""
    return sweep_products(dev, B, H, precision) is not None


def stream_sweeps(dev: Device, B: int, H: int, precision: str) -> bool:
    """Whether a program at `precision` runs the streamed tensor-core sweeps both ways (stream.py: W_hh's
    product from a float16 copy in memory): `sweep_products` says "stream"."""
    return sweep_products(dev, B, H, precision) == "stream"


def streams_backward(products: str | None) -> bool:
    """Whether a program's backward sweeps run streamed ("stream", "stream32", or "mixed": forward resident)."""
    return products in ("stream", "stream32", "mixed")


def streams_forward(products: str | None) -> bool:
    """Whether a program's forward sweeps run streamed ("stream", "stream32")."""
    return products in ("stream", "stream32")


def sweep_products(dev: Device, B: int, H: int, precision: str) -> str | None:
    """How a program at `precision` multiplies its sweeps' products on tensor cores:
    - "mixed" where resident 16 x 16 tiles are planned for both directions (W_hh on chip: v3) and the
      streamed backward is shown co-resident: the forward on the resident tiles, the backward streamed
      (H200, v3 at 64 lanes: resident 5.1 ms forward, 7.2 backward; streamed 5.9 and 5.1); a program of
      two layers or more runs "stream32" there instead where it can (`program_products`);
    - "resident" where the resident tiles fit and the streamed backward does not (or
      CATCHAT_SWEEP_COOP=resident);
    - "stream" where [B, H] is a shape the streamed sweeps take and both their persistent dispatches are
      shown co-resident (one dispatch per step would give back what streaming wins: v5), or
      CATCHAT_SWEEP_COOP=stream where they fit;
    - "stream32" with CATCHAT_SWEEP_COOP=stream32 where they fit: streamed both ways as "stream", with
      float32 saves as "mixed", so both directions can run as wavefronts (`program_products` picks it);
    - None at fp32, with CATCHAT_SWEEP_COOP=0, without cooperative matrices, or where neither fits (the
      threads' FMAs)."""
    choice = coop_choice()
    if precision != "fp16" or choice == "0" or not coopmat_runs(dev):
        return None
    resident = resident_workgroups(dev)

    def streamed(backward: bool) -> bool:
        return bool(stream_ok(B, H) and resident and sweep_residency(dev, stream_tiles(B, H, backward), B, H,
                                                                      backward, resident).ok)

    if choice not in ("stream", "stream32") and all(coop_tiles_ok(plan_sweep(dev, B, H, backward, coop=True).tiles)
                                                    for backward in (False, True)):
        return "mixed" if choice != "resident" and streamed(True) else "resident"
    return ("stream32" if choice == "stream32" else "stream") if streamed(False) and streamed(True) else None


def coop_choice() -> str:
    """CATCHAT_SWEEP_COOP, checked against COOP_CHOICES ("" where unset)."""
    choice = os.environ.get(COOP_ENV, "").strip()
    if choice not in COOP_CHOICES:
        raise UsageError(f"{COOP_ENV}={choice!r} is not 0, 1, resident, mixed, stream or stream32",
                         hint="unset it to let the program choose")
    return choice


# Where "mixed" would run, a program of two layers or more streams both directions with float32 saves
# ("stream32") when each direction's streamed sweep takes at most half the SMs, so that two layers' forward
# sweeps run at once in the forward's wavefront as the backward's do (wavefront.forward_default). H100, fp16,
# one call (docs/results/2026-12-06-h100-*-stream32*.json): a streamed forward sweep alone 6.0 ms against the
# resident one's 4.7, but two side by side 6.72 ms against 12.18 in order; configs/catchat-v3.toml's step 32.8 ms
# against 34.9 ("mixed", its backward already a wavefront), eval 4.27 M tok/s against 3.84 M;
# configs/speedrun.toml (L = 4) 41.6 ms against 44.8.
def program_products(dev: Device, B: int, H: int, L: int, precision: str, training: bool) -> str | None:
    """`sweep_products` for a program of L layers: "stream32" where it says "mixed" unasked
    (CATCHAT_SWEEP_COOP unset or 1), L >= 2 and both directions' streamed sweeps fit half the GPU
    (`streams_in_halves`); else a forward-only program runs "mixed"'s forward alone ("resident")."""
    products = sweep_products(dev, B, H, precision)
    if products == "mixed" and L >= 2 and coop_choice() in ("", "1") and streams_in_halves(dev, B, H):
        return "stream32"
    return "resident" if products == "mixed" and not training else products


def streams_in_halves(dev: Device, B: int, H: int) -> bool:
    """Whether the streamed sweeps at [B, H] (float32 saves) are persistent and co-resident with each
    direction's on at most half the GPU's SMs, so two layers' sweeps run at once."""
    sms, resident = device_sms(dev), resident_workgroups(dev)
    if not (sms and resident and stream_ok(B, H)):
        return False
    for backward in (False, True):
        tiles = stream_tiles(B, H, backward)
        if not sweep_residency(dev, tiles, B, H, backward, resident).ok \
                or sweep_workgroups(resident, stream_items(tiles, H)) > sms // 2:
            return False
    return True


# The bias gradients summed inside the backward sweeps that own their elements for the window (the
# streamed and the register-resident ones: the shaders' BIAS_SUMS, glsl/include/gru_bias_sums.glsl): each
# element's (dar, daz, dan, r dan) over the steps in its thread's registers, then two column sums over
# [B, 6H] instead of three over dGi's and dGh's [T*B] rows (v5 fp16 on an H100: 0.74-0.76 ms a layer for
# those, docs/results/2026-12-06-h100-catchat-v5-fp16-rows.json). CATCHAT_SWEEP_BIAS=0 keeps the column
# sums over the rows (to compare).
BIAS_ENV = "CATCHAT_SWEEP_BIAS"
STREAM_F32_ENV = "CATCHAT_SWEEP_STREAM32"  # =0: fp32 sweeps stay on the tiled or resident shaders; =1: streamed
# even where the register-resident tiles fit (v3: to compare, as CATCHAT_SWEEP_COOP=stream at fp16)


def sweep_bias_sums() -> bool:
    """Whether the streamed and register-resident backward sweeps sum the bias gradients themselves
    (BIAS_ENV; on unless 0)."""
    return env_switch(BIAS_ENV, "set 0 (column sums over the rows after the sweep) or 1, or unset it", True)


def stream_f32_sweep(dev: Device, B: int, H: int, backward: bool, precision: str) -> bool:
    """Whether a program's sweep at [B, H] (one direction) runs the float32 streamed split
    (stream.py's f32: W_hh straight from params, on the threads' FMAs): at fp32 on a GPU, where W_hh
    fits no chip (the tables plan no register-resident tiles: v5; or anywhere with
    CATCHAT_SWEEP_STREAM32=1), [B, H] is a shape the streamed sweeps take and their persistent
    dispatch is shown co-resident; not with CATCHAT_SWEEP_STREAM32=0. CPU devices keep the tiled
    shaders (they run one workgroup at a time)."""
    forced = env_switch(STREAM_F32_ENV, "unset it to let the program choose")
    if precision != "fp32" or dev.info.type == "CPU" or forced is False:
        return False
    resident = resident_workgroups(dev)
    if not (stream_ok(B, H) and resident):
        return False
    if forced is not True and isinstance(plan_sweep(dev, B, H, backward).tiles, ResidentTiles):
        return False
    return sweep_residency(dev, stream_tiles(B, H, backward, f32=True), B, H, backward, resident).ok


def split_forward(dev: Device, B: int, H: int, precision: str) -> bool:
    """Whether a program's forward sweeps at [B, H] take their product on tensor cores from float16
    splits (stream.SPLIT_ENV): asked for, where the float32 streamed forward would run (fp32, W_hh on no
    chip), on cooperative matrices, and with the split's persistent dispatch shown co-resident."""
    if not stream_split() or not stream_f32_sweep(dev, B, H, False, precision) or not coopmat_runs(dev):
        return False
    return sweep_residency(dev, stream_tiles(B, H, False, split=True), B, H, False, resident_workgroups(dev)).ok


# A float32 program's register-resident forward sweeps (v3 at fp32) on tensor cores from float16 splits of
# W_hh and h_prev (gru_forward_resident.comp's COOP with SPLIT: the streamed forward's split, W_hh's hi and lo
# fragments held for the sweep): the FMA forward's product phase was ~2x its FMAs' time (docs/benchmarks.md
# "The step kernel"). Off until measured on a GPU (RESIDENT_SPLIT_DEFAULT); CATCHAT_RESIDENT_SPLIT=1 asks for it.
RESIDENT_SPLIT_ENV = "CATCHAT_RESIDENT_SPLIT"
RESIDENT_SPLIT_DEFAULT = False


def resident_split_forward(dev: Device, B: int, H: int, precision: str) -> bool:
    """Whether a program's forward sweeps at [B, H] run register-resident on tensor cores from float16
    splits (RESIDENT_SPLIT_ENV): asked for, at fp32, on cooperative matrices, where the tensor-core forward
    plans its 16 x 16 resident tiles and the split's shared memory fits."""
    on = env_switch(RESIDENT_SPLIT_ENV, "set 1 (the resident fp32 forward from float16 splits) or 0, or unset it",
                    RESIDENT_SPLIT_DEFAULT)
    if not on or precision != "fp32" or not coopmat_runs(dev):
        return False
    return (coop_tiles_ok(plan_sweep(dev, B, H, False, coop=True).tiles)
            and coop_shared_bytes(H, split=True) <= dev.info.max_shared_memory_bytes)


def backward_scratch_words(dev: Device | None, B: int, H: int, streamed: bool = False) -> int:
    """Words a GruBackward at [B, H] allocates on dev beyond its operands, by default tiles: dhz,
    the barrier words and, when resident, the partial products (no dev: as on a CPU device);
    streamed: a streamed backward's (its shadow is counted with the streamed sweeps' buffers). Both
    the streamed and the resident ones sum the bias gradients into a [B, 6H] where that is on
    (`sweep_bias_sums`, as the program builds them)."""
    tiles = plan_sweep(dev, B, H, True).tiles if dev is not None and not streamed else None
    owns = streamed or isinstance(tiles, ResidentTiles)  # each element a thread's for the window
    bias = 6 * B * H if owns and sweep_bias_sums() else 0
    return B * H + sync_words(B) + partial_words(B, H, tiles) + bias


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
    shown co-resident on dev (catchat/vk/occupancy.py); coop: of the tensor-core kernels. StreamTiles:
    the streamed sweeps' (a workgroup per slice of 16 units, registers not modelled)."""
    info = dev.info
    if isinstance(tiles, StreamTiles):
        n_tiles, nt = stream_items(tiles, H), stream_threads(tiles)
        nbytes, regs = stream_shared_bytes(tiles, backward), 0
    elif isinstance(tiles, ResidentTiles):
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


def tile_count(tiles, B: int, H: int, backward: bool) -> int:
    """Tiles (workgroups of a per-step dispatch) of a sweep over [B, H] outputs, resident or tiled."""
    if isinstance(tiles, ResidentTiles):
        return resident_shape(tiles, B, H, backward)[1]
    return n_workgroups(tiles, B, H, backward)


def sync_words(B: int) -> int:
    """Words of a sweep's grid-barrier buffer: abort, finished, and arrivals of at most a group per
    lane, or the block flags of a streamed sweep (stream.SYNC_GROUPS), each word in a 128-byte line of
    its own: GROUP_STRIDE 32; glsl/include/grid_sync.glsl)."""
    return 2 + max(int(B), SYNC_GROUPS * 32)
