"""Tiles of the tiled sweep shaders (glsl/gru_forward.comp, glsl/gru_backward.comp: W_hh streamed
through shared memory a chunk at a time), per step or persistent: their defines, extent, shared
memory and the picker over the device family's row of candidates (catchat/vk/tiles.py).
"""

from __future__ import annotations

from catchat.vk import tiles
from catchat.vk.device import Device
from catchat.vk.kernels import ceil_div

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


def _tiles_fit(t, backward: bool, max_threads: int, max_shared: int) -> bool:
    """Tiled-sweep tiles within a workgroup's threads and shared memory."""
    return t[0] * t[1] * t[2] <= max_threads and shared_bytes(t, backward) <= max_shared


def tile_extent(tiles, backward: bool) -> tuple[int, int]:
    """(columns or units, lanes) one workgroup covers."""
    nx, ny, _, bx, by, _ = tiles
    return nx * bx * (4 if backward else 1), ny * by


def n_workgroups(tiles, B: int, H: int, backward: bool) -> int:
    tx, tb = tile_extent(tiles, backward)
    return ceil_div(H, tx) * ceil_div(B, tb)


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
