"""The streamed tensor-core sweeps (glsl/gru_forward_stream.comp, glsl/gru_backward_stream.comp):
W_hh's product on cooperative matrices straight from a float16 copy in memory, for hidden sizes
whose W_hh fits neither registers nor shared memory (v5), where the resident COOP tiles (v3) do
not fit. A slice of 16 units (forward) or 16 columns of dh (backward) for every lane per
workgroup; 8 subgroups per lane fragment, each a k-group taking every lane fragment (each W_hh
fragment loaded once per workgroup); h_prev and dGh through float16 shadows double-buffered by
step parity; both operands in 16 x 16 blocks of 512 contiguous bytes. Their
shape, defines and resources live here; the kernels are GruForward / GruBackward with coop and a
float16 W_hh (sweeps.py).

On a device without cooperative matrices (lavapipe) the fragments are emulated (EMU,
glsl/include/sweep_frag.glsl): the tests run the sweeps' logic there; only a GPU runs them fast.

The same split runs in float32 on the threads' FMAs (StreamTiles.f32, the shaders' F32): W_hh
straight from params, h_prev and dGh through float32 shadows (glsl/include/sweep_simt.glsl), for
programs at fp32 whose W_hh fits no chip (v5: 50 MB per layer), where the tiled shaders staged it
through shared memory a chunk at a time.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from catchat.errors import UsageError
from catchat.vk.kernels import ceil_div
from catchat.vk.switches import env_count, env_switch

STREAM_UNITS = 16  # units (forward) or dh columns (backward) per slice
STREAM_KGROUPS = 8  # k-groups (subgroups) per lane fragment
STREAM_GROUP_LANES = 32  # lanes of a lane group: two lane fragments, `red` within 48 KB at most (24 KB forward)
STREAM_MAX_LANES = 64  # two lane groups, each its own recurrence (v3 and the speedrun run 64 lanes)
W16_ALIGN = 8  # halves: W_hh's float16 copy starts on a 16-byte boundary (fragment rows)
# Fragments whose loads are in flight ahead of the product (forward, backward: the shaders' PD);
# CATCHAT_STREAM_DEPTH=F,B sets them (to measure; tools/gpu-check.sh). With RES below, measured best
# on the H200 at v5 (tools/stream_variants.py, 2026-12-03): deeper rings cost registers the
# resident fragments use better.
STREAM_DEPTH = (2, 4)
DEPTH_ENV = "CATCHAT_STREAM_DEPTH"
# The split forward's (no resident fragments; twice the operands a k-fragment): v5 fp32 on an H100
# (2026-12-06), forward sweep 49.9 ms a layer at 2 ahead, 48.1 at 1, 43.7 at 4, 43.4 at 6, 44.3-48.8 at 8
SPLIT_DEPTH = 4
# W_hh's float16 copy as 16 x 16 blocks of 512 contiguous bytes (BLOCKED_W: a fragment is one run of
# memory); CATCHAT_STREAM_BLOCKED=0: row-major [3H][H] (to compare).
BLOCKED_ENV = "CATCHAT_STREAM_BLOCKED"
# W_hh fragments of each subgroup's first k-fragments kept in registers for the whole persistent
# sweep (forward, backward: the shaders' RES; only where a workgroup has one slice);
# CATCHAT_STREAM_RESIDENT=F,B sets them (to measure; tools/gpu-check.sh). v5 on the H200: 2 of 8
# (forward: 6 fragments, 24 registers) and 12 of 24 (backward: 48 registers) took v5's fp16 step from
# 130.1 to 117.2 ms, among 0..4 and 0..20 tried. With the fragments on VK_KHR_cooperative_matrix (H100,
# 2026-12-07, tools/stream_variants.py in one call): backward 12 / 16 / 20 gave 11.55 / 11.12 / 10.75 ms a
# layer and the step 108.0 / 108.0 / 105.6 ms; forward 3 and 4 were slower (12.55, 13.45 against 11.72).
STREAM_RESIDENT = (2, 20)
RESIDENT_ENV = "CATCHAT_STREAM_RESIDENT"
# W_hh fragments of each subgroup's next k-fragments (after the resident ones) kept in shared memory
# for the whole dispatch (forward, backward: the shaders' SRES; one slice per workgroup, as RES), in
# what `red` leaves of the workgroup's shared memory; CATCHAT_STREAM_SHARED=F,B sets them, cut to what
# fits. Not yet measured on the H200: 0, 0 until it is (tools/stream_variants.py).
STREAM_SHARED = (0, 0)
SHARED_ENV = "CATCHAT_STREAM_SHARED"
# Block flags instead of the grid barrier between steps (the shaders' KFLAGS, persistent sweeps
# only; glsl/include/grid_sync.glsl): each subgroup waits for the blocks of the shadow its k-group
# reads, written by KPG of the workgroups, not for all of them. On by default on tensor cores, where the
# barrier was ~30% of a v5 step (H200: v5 fp16 245,740 -> 255,173 tok/s, v3 at 64 lanes 1,360,507 ->
# 1,423,615, 2026-12-05); off for the float32 sweeps, bound by their FMAs (63,726 against 64,505).
# CATCHAT_STREAM_FLAGS=0 or 1 sets it for both (to compare).
# Without the barrier's shared flag the forward at v5 has room for one k-fragment of W_hh in shared
# memory per k-group (CATCHAT_STREAM_SHARED=1,B).
FLAGS_ENV = "CATCHAT_STREAM_FLAGS"
# The backward's product split over k between workgroups (glsl/gru_backward_ksplit.comp): a workgroup per
# (k-part, column group) stages its k-part of dGh[s] in shared memory once and sums partials through
# memory, where the plain split has every workgroup read all of dGh[s] (v5: 50 MB a step from L2; a
# probe skipping those loads took the backward sweep from ~12.5 to 5.6 ms a layer on an H100,
# 2026-12-05). Persistent sweeps of one lane group only. On by default: on an H100 it took v5's fp16
# backward sweeps from 13.4-13.7 to 12.2-12.4 ms a layer and the step from 124.5 to 120.8 ms (same call,
# docs/results/2026-12-05-h100-catchat-v5-fp16-{base,ksplit}.json); CATCHAT_STREAM_KSPLIT=0 turns it off.
KSPLIT_ENV = "CATCHAT_STREAM_KSPLIT"
KSPLIT_DEFAULT = True  # where it applies and CATCHAT_STREAM_KSPLIT is unset
# The same k-split in float32 (the shader's F32): every workgroup of the plain split reads all of dGh[s]
# in float32 each step (v5: 786 KB a workgroup, 100 MB a step). On by default: on an H100 it took v5's
# fp32 backward sweeps from 66.6-68.9 to 37.2-37.5 ms a layer (ring 4; 38.7-39.1 at 8) and the step
# from 540.3 to 479.6 ms (same call, docs/results/2026-12-06-h100-catchat-v5-fp32-{plain,ksplit-d4,
# ksplit-d8}.json); CATCHAT_STREAM_KSPLIT=0 turns it off.
KSPLIT32_DEFAULT = True
# Bytes of a k-part of dGh staged at a time in float32 (its passes: the shader's NPASS). A k-part is 24H
# bytes whatever the lanes (v5: 48 KB); with the W_hh chunks' 8 KB beside it the stage fits 32 KB.
KSPLIT32_STAGE_BYTES = 24 * 1024
# The float32 k-split's ring of W_hh chunks (8 rows x 16 columns, a vec4 per invocation) loaded ahead;
# deeper than the plain split's, whose chunks also carry dGh (CATCHAT_STREAM32_DEPTH sets both). 4 and 8
# within 4% of each other at v5 on an H100 (37.4 against 39.0 ms a backward sweep).
KSPLIT32_DEPTH = 4
# Timing probes of the streamed sweeps (wrong results: tools/gpu-check.sh only): 1 = no W_hh loads,
# 2 = no h_prev / dGh loads.
PROBE_ENV = "CATCHAT_STREAM_PROBE"
# A float32 program's forward sweeps on tensor cores from float16 splits of W_hh and h_prev (x = hi +
# 2^-11 lo; three products into two sets of accumulators: the shaders' SPLIT; tools/split16_error.py,
# docs/benchmarks.md "v5 at fp32"), where the float32 streamed sweeps would run (v5 at fp32) and the
# device has cooperative matrices. Nothing of W_hh resident; the backward stays float32 on the threads'
# FMAs. On by default: it passes the model parity at float32's tolerances on the GPU, and on an H100 took
# v5 fp32 from 68,317 to 71,767 tokens/s at one lane fragment a workgroup (forward sweeps 49.9 to 44.7 ms a
# layer), and to 81,242 at two (below; 1.47x torch FP32, docs/results/2026-12-06-h100-catchat-v5-fp32-
# split2.json); CATCHAT_STREAM32_SPLIT=0 keeps the forward's product on the FMAs.
SPLIT_ENV = "CATCHAT_STREAM32_SPLIT"
# Its lane fragments: up to 2 a workgroup, v5's 32 lanes in one workgroup a slice, so each W_hh hi and lo
# fragment is loaded once a step for both (its 256 threads two gate outputs each). On an H100 at v5
# (2026-12-06, one call) that took the forward sweep from 43.5 ms a layer (a workgroup a lane group of
# 16, W_hh loaded twice) to 25.8, the step from 454 to 403 ms.
SPLIT_SCALE = 2048.0  # x = hi + lo / SPLIT_SCALE (glsl/include/split_half.glsl's)
# How the float16 sweeps read W_hh's copy (the shaders' W16_CACHE, to measure): unset, as a readonly
# buffer; "restrict", readonly restrict (the driver may take the read-only cached path); "l2", coherent
# (bypassing L1: whether W_hh's slice, 144-196 KB a workgroup, is now served from L1 between steps).
WCACHE_ENV = "CATCHAT_STREAM_WCACHE"
WCACHE_DEFINES = {"": {}, "restrict": {"W16_CACHE": 1}, "l2": {"W16_CACHE": 2}}
# The float32 backward's register ring: chunks of 2 row quads loaded ahead of the one multiplied
# (the forward loads what it multiplies straight); CATCHAT_STREAM32_DEPTH=N sets it (to measure).
# v5 on the H200: 3, 4 and 6 within 6% of each other (64.7, 65.2, 68.9 us per step).
STREAM32_DEPTH = 3
DEPTH32_ENV = "CATCHAT_STREAM32_DEPTH"
# =0: the float32 backward's stages synced by workgroup barriers even where subgroups are 32 wide (to
# compare; tools/gpu-check.sh)
SUBGROUP32_ENV = "CATCHAT_STREAM32_SUBGROUP"


class StreamTiles(NamedTuple):
    """A streamed sweep's split: `lane_frags` 16-lane fragments (B <= 16 * lane_frags),
    `k_per_group` 16-deep k-fragments per k-group (8 * lane_frags k-groups, one per subgroup, each
    taking every lane fragment: 8 * lane_frags * k_per_group * 16 >= H forward, 3H backward),
    `depth` fragments' loads in flight ahead of the product (a register ring), `resident` of a
    k-group's fragments whose W_hh stays in registers through a persistent sweep, and `shared` more
    whose W_hh stays in shared memory (`fit_shared` cuts it to the device). `f32`: the same
    split in float32 on the threads' FMAs (nothing resident; `depth` the backward's ring of chunks of
    2 row quads, 0 forward: its loads go straight to the invocations that multiply them). `flags`:
    a persistent sweep waits on block flags instead of the grid barrier (no shared flag either).
    `lane_groups`: past 32 lanes, groups of 16 * lane_frags lanes, each a recurrence of its own with
    its own shadow and flags; a workgroup per (slice, lane group): B <= 16 * lane_frags * lane_groups.
    `ksplit` (backward, one lane group): the product split over k between workgroups instead
    (glsl/gru_backward_ksplit.comp): `k_per_group` is then a k-part's fragments (KPW: `ksplit_parts`
    k-parts), `resident` / `depth` of a column block's W_hh in it; block flags always, nothing in shared
    memory but the staged k-part of dGh. With `f32` as well, the same split in float32: `depth` is the
    ring of W_hh chunks (8 rows x 16 columns), and the k-part is staged in `ksplit32_passes` passes beside
    each subgroup's chunk. `split` (forward; 8 k-groups, 256 threads at any lane_frags): the product in float32 from
    float16 hi and lo parts of W_hh and h_prev (`SPLIT_ENV`); the shadow twice as large."""

    lane_frags: int
    k_per_group: int
    depth: int = 1
    resident: int = 0
    f32: bool = False
    shared: int = 0
    flags: bool = False
    lane_groups: int = 1
    ksplit: bool = False
    split: bool = False


def stream_ok(B: int, H: int) -> bool:
    """Whether the streamed sweeps take [B, H]: H a multiple of 16, 1 <= B <= 64."""
    return H > 0 and H % STREAM_UNITS == 0 and 1 <= B <= STREAM_MAX_LANES


# Flag words a streamed sweep may count in (`plan.sync_words` allocates them): a k-group's of each lane
# group (STREAM_KGROUPS per lane fragment, two lane groups), or the k-split's k-parts and column groups.
SYNC_GROUPS = 2 * STREAM_KGROUPS * 2


def ksplit_parts(lane_frags: int) -> int:
    """The k-split's k-parts, and its column blocks per column group: one per subgroup."""
    return STREAM_KGROUPS * lane_frags


def ksplit_ok(B: int, H: int) -> bool:
    """Whether the k-split backward takes [B, H]: one lane group (B <= 32), H whole column groups of
    `ksplit_parts` column blocks (so the 3H rows fall into as many whole k-parts), and its k-parts and
    column groups within SYNC_GROUPS flag words (H <= 4096 at 32 lanes)."""
    kp = ksplit_parts(ceil_div(min(max(B, 1), STREAM_GROUP_LANES), 16))
    return (1 <= B <= STREAM_GROUP_LANES and H > 0 and H % (16 * kp) == 0
            and kp + H // (16 * kp) <= SYNC_GROUPS)


def stream_ksplit(f32: bool = False) -> bool:
    """Whether the k-split backward is asked for: CATCHAT_STREAM_KSPLIT 0 or 1, else KSPLIT_DEFAULT
    (KSPLIT32_DEFAULT for the float32 sweeps)."""
    return env_switch(KSPLIT_ENV, "set 1 (the backward's product split over k) or 0 (the plain split), or unset it",
                      KSPLIT32_DEFAULT if f32 else KSPLIT_DEFAULT)


def ksplit32_stage_bytes(tiles: StreamTiles) -> int:
    """Bytes of a float32 k-part of dGh: its 16 * k_per_group rows of 16 * lane_frags lanes (24H)."""
    return tiles.lane_frags * tiles.k_per_group * 1024


def ksplit32_passes(tiles: StreamTiles) -> int:
    """The float32 k-split's passes of a k-part through its stage: the fewest that divide its chunks
    (2 row quads each) and stage at most KSPLIT32_STAGE_BYTES at a time."""
    chunks = 2 * tiles.k_per_group
    return next(n for n in range(1, chunks + 1)
                if chunks % n == 0 and ksplit32_stage_bytes(tiles) // n <= KSPLIT32_STAGE_BYTES or n == chunks)


def stream_split() -> bool:
    """Whether a float32 program's forward may run on tensor cores from float16 splits (SPLIT_ENV; on)."""
    return env_switch(SPLIT_ENV, "set 0 (the float32 forward on the FMAs) or 1, or unset it for the default", True)


def stream_tiles(B: int, H: int, backward: bool, f32: bool = False, ksplit: bool | None = None,
                 split: bool = False) -> StreamTiles:
    """The streamed split of a [B, H] sweep. ksplit: the k-split backward where it takes the shape (None:
    as CATCHAT_STREAM_KSPLIT says); the caller falls back to ksplit=False where its sweep is not persistent.
    split: the forward from float16 splits (`SPLIT_ENV`): 8 k-groups whatever the lane fragments (`stream_threads`)."""
    if not stream_ok(B, H):
        raise ValueError(f"the streamed sweeps need H a multiple of {STREAM_UNITS} and 1 <= B <= "
                         f"{STREAM_MAX_LANES} (got B={B}, H={H})")
    lane_frags = ceil_div(min(B, STREAM_GROUP_LANES), 16)
    groups = ceil_div(B, 16 * lane_frags)
    if split:
        if backward or f32:
            raise ValueError("the split product is the tensor-core forward's (not backward, not f32)")
        kpg = ceil_div(H // 16, STREAM_KGROUPS)  # 8 k-groups at any lane_frags (`stream_threads`)
        depth = stream_depth((SPLIT_DEPTH, STREAM_DEPTH[1]))[0]
        return StreamTiles(lane_frags, kpg, min(kpg, depth), flags=stream_flags(), lane_groups=groups, split=True)
    if backward and (stream_ksplit(f32) if ksplit is None else ksplit) and ksplit_ok(B, H):
        kpw = 3 * H // 16 // ksplit_parts(lane_frags)
        if f32:  # the ring of W_hh chunks (2 row quads each) ahead
            return StreamTiles(lane_frags, kpw, min(stream32_depth(KSPLIT32_DEPTH), 2 * kpw), f32=True, flags=True,
                               ksplit=True)
        res = min(kpw, _env_pair(RESIDENT_ENV, STREAM_RESIDENT, 0)[1])
        return StreamTiles(lane_frags, kpw, min(kpw, stream_depth()[1]), res, flags=True, ksplit=True)
    kpg = ceil_div((3 * H if backward else H) // 16, STREAM_KGROUPS * lane_frags)
    if f32:  # the backward's ring of chunks of 2 row quads; the forward loads straight (0)
        return StreamTiles(lane_frags, kpg, min(stream32_depth(), 2 * kpg) if backward else 0, f32=True,
                           flags=stream_flags(f32=True), lane_groups=groups)
    resident = min(kpg, _env_pair(RESIDENT_ENV, STREAM_RESIDENT, 0)[backward])
    return StreamTiles(lane_frags, kpg, min(kpg, stream_depth()[backward]), resident,
                       shared=min(kpg - resident, _env_pair(SHARED_ENV, STREAM_SHARED, 0)[backward]),
                       flags=stream_flags(), lane_groups=groups)


def stream32_depth(default: int = STREAM32_DEPTH) -> int:
    """The float32 backward's ring depth: CATCHAT_STREAM32_DEPTH, else `default`."""
    depth = env_count(DEPTH32_ENV, f"unset it, or set e.g. {STREAM32_DEPTH}")
    return default if depth is None else depth


def stream_depth(default: tuple[int, int] = STREAM_DEPTH) -> tuple[int, int]:
    """(forward, backward) ring depths: CATCHAT_STREAM_DEPTH=F,B, else `default` (STREAM_DEPTH; the split
    forward's SPLIT_DEPTH)."""
    return _env_pair(DEPTH_ENV, default, 1)


def _env_pair(name: str, default: tuple[int, int], least: int) -> tuple[int, int]:
    """(forward, backward) from the environment variable `name` ("F,B", each >= least), else default."""
    env = os.environ.get(name, "").strip()
    if not env:
        return default
    try:
        f, b = (int(v) for v in env.split(","))
        if f >= least and b >= least:
            return f, b
    except ValueError:
        pass
    raise UsageError(f"{name}={env!r} is not two counts (forward, backward; at least {least})",
                     hint=f"unset it, or set e.g. {default[0]},{default[1]}")


def stream_threads(tiles: StreamTiles) -> int:
    """256 per lane fragment: 8 subgroups of 32 (k-groups), one thread per output of the slice; the split
    forward 256 at any lane_frags (each thread lane_frags outputs: its two accumulator sets a lane fragment
    leave no room for more threads)."""
    return 256 if tiles.split else 256 * tiles.lane_frags


def stream_shared_bytes(tiles: StreamTiles, backward: bool) -> int:
    """`red`: forward 4 k-group slots x lane fragments x 3 gates of 16 x 16 floats; backward 8 k-groups
    x lane fragments of 16 x 16 floats (plus the grid barrier's flag, none with block flags). f32
    backward: or, where larger, `stage` (the same words): each k-group's vec4s of 2 row quads (32 of
    W_hh, 32 per lane fragment)."""
    if tiles.ksplit and tiles.f32:  # `dst`: a pass of the k-part of dGh; `wst`: each subgroup's W_hh chunk
        return ksplit32_stage_bytes(tiles) // ksplit32_passes(tiles) + ksplit_parts(tiles.lane_frags) * 512
    if tiles.ksplit:  # `ash`: the item's k-part of dGh, both lane fragments
        return tiles.lane_frags * tiles.k_per_group * 512
    red = 4 * 256 * (STREAM_KGROUPS * tiles.lane_frags if backward else 4 * tiles.lane_frags * 3)
    if tiles.f32 and backward:  # the stage and red share `smem4` (a barrier apart)
        red = max(red, 16 * STREAM_KGROUPS * tiles.lane_frags * (32 + 32 * tiles.lane_frags))
    return red + (0 if tiles.flags else 4) + tiles.shared * shared_fragment_bytes(tiles, backward)


def shared_fragment_bytes(tiles: StreamTiles, backward: bool) -> int:
    """Shared memory of one k-fragment's W_hh per k-group kept there (`wsm`): a 16 x 16 float16 block
    for each k-group, three (the gates) forward."""
    return STREAM_KGROUPS * tiles.lane_frags * 512 * (1 if backward else 3)


def fit_shared(tiles: StreamTiles, backward: bool, limit_bytes: int) -> StreamTiles:
    """The tiles with `shared` cut to what fits in `limit_bytes` of shared memory beside `red`."""
    room = limit_bytes - stream_shared_bytes(tiles._replace(shared=0), backward)
    return tiles._replace(shared=max(0, min(tiles.shared, room // shared_fragment_bytes(tiles, backward))))


def shadow_words(tiles: StreamTiles, H: int, backward: bool) -> int:
    """uint32 words of the shadow: [lane groups][2][16 * lane_frags][H] halves forward (h_prev),
    [..][3H] backward (dGh); floats where f32; with split, each lane group's hi then lo."""
    elements = tiles.lane_groups * 2 * 16 * tiles.lane_frags * (3 * H if backward else H) * (2 if tiles.split else 1)
    return elements if tiles.f32 else elements // 2


def stream_flags(f32: bool = False) -> bool:
    """Whether the persistent streamed sweeps wait on block flags instead of a grid barrier: FLAGS_ENV
    0 or 1, else on tensor cores and not on the float32 sweeps (measured, above)."""
    return env_switch(FLAGS_ENV, "unset it for the default, 1 for block flags, 0 for the grid barrier", not f32)


def w16_cache() -> dict:
    """The W16_CACHE define WCACHE_ENV asks for ({} unset)."""
    value = os.environ.get(WCACHE_ENV, "").strip()
    if value not in WCACHE_DEFINES:
        raise ValueError(f"{WCACHE_ENV}={value!r}: use restrict or l2, or unset it for the default")
    return WCACHE_DEFINES[value]


# The tensor-core W copies in their fragments' own order (glsl/frag_order.comp; the shaders' FRAG_W): the
# streamed forward's W_hh and the tensor-core decode step's W_hh and W_ih, each fragment one 16-byte load
# an invocation instead of several narrower ones. CATCHAT_FRAG_W=0 or 1 sets it (to compare); the
# forward's copy is its own, beside the blocked one the backward reads (3H*H halves a layer more).
FRAG_W_ENV = "CATCHAT_FRAG_W"
FRAG_W_DEFAULT = False  # until measured on a GPU (tools/gpu-check.sh group frag-w)


def w_frag_order() -> bool:
    """Whether the tensor-core W copies are in fragment order (FRAG_W_ENV, else FRAG_W_DEFAULT); needs
    them blocked (`w16_blocked`)."""
    return env_switch(FRAG_W_ENV, "set 1 (fragment order) or 0 (blocks), or unset it for the default",
                      FRAG_W_DEFAULT) and w16_blocked()


# The streamed forward's h_prev shadow in the order of its A fragments' elements (the shader's FRAG_H): each
# h_prev fragment one 16-byte load an invocation, the gates writing each element where the driver's order
# puts it. CATCHAT_FRAG_H=0 or 1 sets it (to compare).
FRAG_H_ENV = "CATCHAT_FRAG_H"
FRAG_H_DEFAULT = False  # until measured on a GPU (tools/gpu-check.sh group frag-w)


def h_frag_order() -> bool:
    """Whether the streamed tensor-core forward keeps h_prev's shadow in fragment order (FRAG_H_ENV, else
    FRAG_H_DEFAULT)."""
    return env_switch(FRAG_H_ENV, "set 1 (fragment order) or 0 (blocks), or unset it for the default",
                      FRAG_H_DEFAULT)


def w16_blocked() -> bool:
    """Whether the float16 W_hh copy is blocked (BLOCKED_ENV; on unless set to 0)."""
    return os.environ.get(BLOCKED_ENV, "").strip() != "0"


def split_halves(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (float32) as float16 hi = float16(x) and lo = float16(SPLIT_SCALE (x - hi)): x = hi + lo / SPLIT_SCALE
    to about 22 bits (ToHalf and ToHalf(lo=True); the shaders' SPLIT, glsl/include/split_half.glsl)."""
    x = np.asarray(x, np.float32)
    hi = x.astype(np.float16)
    return hi, ((x - hi.astype(np.float32)) * np.float32(SPLIT_SCALE)).astype(np.float16)


def block_halves(w: np.ndarray) -> np.ndarray:
    """A [R, C] matrix (R, C multiples of 16) as its 16 x 16 blocks, row of blocks by row of blocks,
    each row-major: the layout of a blocked float16 copy (glsl/include/sweep_frag.glsl, ToHalf)."""
    R, C = w.shape
    return np.ascontiguousarray(w.reshape(R // 16, 16, C // 16, 16).transpose(0, 2, 1, 3)).reshape(-1)


def stream_defines(tiles: StreamTiles, H: int, backward: bool, emulate: bool, subgroup: int = 0) -> dict:
    """The shaders' defines: LF, KPG, PD (the ring's depth); RES (resident W_hh fragments) and SRES
    (fragments in shared memory; the caller keeps both only where a workgroup has one slice); FULL
    where every k-group has KPG fragments (no bound checks in the product loop); BLOCKED_W (W_hh's
    copy in blocks); PROBE (timing probes); W16_CACHE (how W_hh's copy is read); EMU (emulated fragments);
    KFLAGS (block flags instead of the grid barrier; the shaders ignore it in a dispatch per step); LG
    (lane groups, past 32 lanes); FRAG_H (the forward's h_prev shadow in fragment order, `h_frag_order`).
    f32 tiles: LF, KPG, PD, FULL, F32, KFLAGS, LG, and SUBGROUP32 where the backward runs on subgroups
    32 wide (its stage synced by subgroup barriers)."""
    if tiles.ksplit and tiles.f32:
        return {"LF": tiles.lane_frags, "KPW": tiles.k_per_group, "PD": tiles.depth, "F32": 1,
                "NPASS": ksplit32_passes(tiles), **_subgroup_stages(subgroup)}
    if tiles.ksplit:  # glsl/gru_backward_ksplit.comp: block flags always, every k-part whole
        return {"LF": tiles.lane_frags, "KPW": tiles.k_per_group, "PD": tiles.depth,
                **({"RES": tiles.resident} if tiles.resident else {}),
                **({"BLOCKED_W": 1} if w16_blocked() else {}), **w16_cache(), **({"EMU": 1} if emulate else {})}
    k_groups = STREAM_KGROUPS * (1 if tiles.split else tiles.lane_frags)
    full = k_groups * tiles.k_per_group * 16 == (3 * H if backward else H)
    flags = {**({"KFLAGS": 1} if tiles.flags else {}), **({"LG": tiles.lane_groups} if tiles.lane_groups > 1 else {})}
    if tiles.f32:
        return {"LF": tiles.lane_frags, "KPG": tiles.k_per_group, "PD": tiles.depth, "F32": 1, **flags,
                **({"FULL": "true"} if full else {}), **(_subgroup_stages(subgroup) if backward else {})}
    probe = _probe()
    return {"LF": tiles.lane_frags, "KPG": tiles.k_per_group, "PD": tiles.depth, **flags,
            **({"SPLIT": 1} if tiles.split else {}),
            **({"FRAG_H": 1} if not (backward or tiles.split) and h_frag_order() else {}),
            **({"RES": tiles.resident} if tiles.resident else {}),
            **({"SRES": tiles.shared} if tiles.shared else {}),
            **({"FULL": "true"} if full else {}),
            **({"BLOCKED_W": 1} if w16_blocked() else {}), **({"PROBE": int(probe)} if probe else {}),
            **w16_cache(), **({"EMU": 1} if emulate else {})}


def _probe() -> str:
    """CATCHAT_STREAM_PROBE's value for a float16 sweep ("" unset)."""
    probe = os.environ.get(PROBE_ENV, "").strip()
    if probe not in ("", "1", "2"):
        raise UsageError(f"{PROBE_ENV}={probe!r}: expected 1 or 2 (timing probes; unset for the real sweeps)")
    return probe


def _subgroup_stages(subgroup: int) -> dict:
    """SUBGROUP32 where the float32 backward's stages sync by subgroup barriers: subgroups 32 wide, unless
    CATCHAT_STREAM32_SUBGROUP=0."""
    return {"SUBGROUP32": 1} if subgroup == 32 and os.environ.get(SUBGROUP32_ENV, "").strip() != "0" else {}


def ksplit_partial_words(tiles: StreamTiles, H: int) -> int:
    """Floats of the k-split backward's partials: [2 parities][k-parts][H / 16 column blocks][lane_frags][16 x 16]."""
    return 2 * ksplit_parts(tiles.lane_frags) * (H // 16) * tiles.lane_frags * 256


def stream_slices(H: int) -> int:
    return H // STREAM_UNITS


def stream_items(tiles: StreamTiles, H: int) -> int:
    """A streamed sweep's work items, a workgroup each where there are enough: (slice, lane group)."""
    return stream_slices(H) * tiles.lane_groups
