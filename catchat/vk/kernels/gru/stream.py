"""The streamed tensor-core sweeps (glsl/gru_forward_stream.comp, glsl/gru_backward_stream.comp):
W_hh's product on cooperative matrices straight from a float16 copy in memory, for hidden sizes
whose W_hh fits neither registers nor shared memory (v5), where the resident COOP tiles (v3) do
not fit. A slice of 16 units (forward) or 16 columns of dh (backward) for every lane per
workgroup; 8 k-groups of subgroups per lane fragment; h_prev and dGh through float16 shadows
double-buffered by step parity; both operands in 16 x 16 blocks of 512 contiguous bytes. Their
shape, defines and resources live here; the kernels are GruForward / GruBackward with coop and a
float16 W_hh (sweeps.py).

On a device without cooperative matrices (lavapipe) the fragments are emulated (EMU,
glsl/include/sweep_frag.glsl): the tests run the sweeps' logic there; only a GPU runs them fast.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from catchat.errors import UsageError
from catchat.vk.kernels import ceil_div

STREAM_UNITS = 16  # units (forward) or dh columns (backward) per slice
STREAM_KGROUPS = 8  # k-groups of subgroups per lane fragment
STREAM_MAX_LANES = 32  # two lane fragments: `red` within 48 KB at most (24 KB forward)
W16_ALIGN = 8  # halves: W_hh's float16 copy starts on a 16-byte boundary (fragment rows)
# Fragments whose loads are in flight ahead of the product (forward, backward: the shaders' PD);
# CATCHAT_STREAM_DEPTH=F,B sets them (to measure; tools/gpu-check.sh).
STREAM_DEPTH = (4, 8)
DEPTH_ENV = "CATCHAT_STREAM_DEPTH"
# W_hh's float16 copy as 16 x 16 blocks of 512 contiguous bytes (BLOCKED_W: a fragment is one run of
# memory); CATCHAT_STREAM_BLOCKED=0: row-major [3H][H] (to compare).
BLOCKED_ENV = "CATCHAT_STREAM_BLOCKED"
# CATCHAT_STREAM_SPLIT=lanes: a subgroup takes both lane fragments of its k-group (16 k-groups at
# B > 16), so each W_hh fragment is loaded once per workgroup rather than once per lane fragment
# (BOTH_LANES; to measure against the default).
SPLIT_ENV = "CATCHAT_STREAM_SPLIT"
# Timing probes of the streamed sweeps (wrong results: tools/gpu-check.sh only): 1 = no W_hh loads,
# 2 = no h_prev / dGh loads.
PROBE_ENV = "CATCHAT_STREAM_PROBE"


class StreamTiles(NamedTuple):
    """A streamed sweep's split: `lane_frags` 16-lane fragments (B <= 16 * lane_frags),
    `k_per_group` 16-deep k-fragments per k-group (8 * k_per_group * 16 >= H forward, 3H backward),
    `depth` fragments' loads in flight ahead of the product (a register ring), and whether a
    subgroup takes `both_lanes` fragments of its k-group (8 * lane_frags k-groups then)."""

    lane_frags: int
    k_per_group: int
    depth: int = 1
    both_lanes: bool = False  # BOTH_LANES: a subgroup takes every lane fragment of its k-group


def stream_ok(B: int, H: int) -> bool:
    """Whether the streamed sweeps take [B, H]: H a multiple of 16, 1 <= B <= 32."""
    return H > 0 and H % STREAM_UNITS == 0 and 1 <= B <= STREAM_MAX_LANES


def stream_tiles(B: int, H: int, backward: bool) -> StreamTiles:
    if not stream_ok(B, H):
        raise ValueError(f"the streamed sweeps need H a multiple of {STREAM_UNITS} and 1 <= B <= "
                         f"{STREAM_MAX_LANES} (got B={B}, H={H})")
    lane_frags = ceil_div(B, 16)
    both = lane_frags > 1 and stream_split() == "lanes"
    kpg = ceil_div((3 * H if backward else H) // 16, STREAM_KGROUPS * (lane_frags if both else 1))
    return StreamTiles(lane_frags, kpg, min(kpg, stream_depth()[backward]), both)


def stream_split() -> str:
    """CATCHAT_STREAM_SPLIT: "kgroups" (the default: a subgroup per lane fragment and k-group) or "lanes"."""
    split = os.environ.get(SPLIT_ENV, "").strip() or "kgroups"
    if split not in ("kgroups", "lanes"):
        raise UsageError(f"{SPLIT_ENV}={split!r} is not a split", hint="unset it, or set kgroups or lanes")
    return split


def stream_depth() -> tuple[int, int]:
    """(forward, backward) ring depths: CATCHAT_STREAM_DEPTH=F,B, else STREAM_DEPTH."""
    env = os.environ.get(DEPTH_ENV, "").strip()
    if not env:
        return STREAM_DEPTH
    try:
        f, b = (int(v) for v in env.split(","))
        if f >= 1 and b >= 1:
            return f, b
    except ValueError:
        pass
    raise UsageError(f"{DEPTH_ENV}={env!r} is not two depths", hint="unset it, or set e.g. 4,8 (forward, backward)")


def stream_threads(tiles: StreamTiles) -> int:
    """256 per lane fragment: 8 subgroups of 32, one thread per output of the slice."""
    return 256 * tiles.lane_frags


def stream_shared_bytes(tiles: StreamTiles, backward: bool) -> int:
    """`red`: forward 4 k-group slots x lane fragments x 3 gates of 16 x 16 floats; backward 8 k-groups
    x lane fragments of 16 x 16 floats (plus the grid barrier's flag)."""
    blocks = STREAM_KGROUPS * tiles.lane_frags if backward else 4 * tiles.lane_frags * 3
    return 4 * 256 * blocks + 4


def shadow_words(tiles: StreamTiles, H: int, backward: bool) -> int:
    """uint32 words of the float16 shadow: [2][16 * lane_frags][H] halves forward (h_prev), [2][..][3H]
    backward (dGh)."""
    return 2 * 16 * tiles.lane_frags * (3 * H if backward else H) // 2


def w16_blocked() -> bool:
    """Whether the float16 W_hh copy is blocked (BLOCKED_ENV; on unless set to 0)."""
    return os.environ.get(BLOCKED_ENV, "").strip() != "0"


def block_halves(w: np.ndarray) -> np.ndarray:
    """A [R, C] matrix (R, C multiples of 16) as its 16 x 16 blocks, row of blocks by row of blocks,
    each row-major: the layout of a blocked float16 copy (glsl/include/sweep_frag.glsl, ToHalf)."""
    R, C = w.shape
    return np.ascontiguousarray(w.reshape(R // 16, 16, C // 16, 16).transpose(0, 2, 1, 3)).reshape(-1)


def stream_defines(tiles: StreamTiles, H: int, backward: bool, emulate: bool) -> dict:
    """The shaders' defines: LF, KPG, PD (the ring's depth); FULL where every k-group has KPG
    fragments (no bound checks in the product loop); BLOCKED_W (W_hh's copy in blocks); BOTH_LANES
    (a subgroup per k-group, every lane fragment); PROBE (timing probes); EMU (emulated fragments)."""
    k_groups = STREAM_KGROUPS * (tiles.lane_frags if tiles.both_lanes else 1)
    full = k_groups * tiles.k_per_group * 16 == (3 * H if backward else H)
    probe = os.environ.get(PROBE_ENV, "").strip()
    return {"LF": tiles.lane_frags, "KPG": tiles.k_per_group, "PD": tiles.depth, **({"FULL": "true"} if full else {}),
            **({"BLOCKED_W": 1} if w16_blocked() else {}), **({"BOTH_LANES": 1} if tiles.both_lanes else {}),
            **({"PROBE": int(probe)} if probe else {}),
            **({"EMU": 1} if emulate else {})}


def stream_slices(H: int) -> int:
    return H // STREAM_UNITS
