"""Tiles of the register-resident sweep shaders (glsl/gru_forward_resident.comp,
glsl/gru_backward_resident.comp: a workgroup holds its tile's rows of W_hh in registers for the
whole sweep), their shape, registers, defines and picker, and the tensor-core variant (COOP).
"""

from __future__ import annotations

from typing import NamedTuple

from catchat.vk import tiles
from catchat.vk.kernels import ceil_div

# The H200's row of the tables (catchat/vk/tiles.py), by name: the defaults tests, parity and tools force.
_H200 = tiles.GRU_ROWS[0]


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
                     backward: bool = False, coop: bool = False, split: bool = False) -> dict:
    """Compile-time defines of gru_{forward,backward}_resident.comp (see their headers). off: the
    element offset of o, read as vec4 rows by the forward shader: vec4 loads need it and H to be
    multiples of 4. coop: the sweep's product on tensor cores (COOP; `coop_tiles_ok`). split (the
    forward, with coop): that product in float32 from float16 splits (SPLIT)."""
    t = tiles
    if coop and not coop_tiles_ok(t):
        raise ValueError(f"the tensor-core sweeps take tiles of {COOP_UNITS} x {COOP_UNITS}, not {t}")
    if split and (backward or not coop):
        raise ValueError("the resident sweep's product from float16 splits is the tensor-core forward's (coop)")
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
    coop_defs = {"COOP": 1, "COOP_KF": ceil_div(ceil_div(H, 16), 4), **({"SPLIT": 1} if split else {})} if coop else {}
    return {**common, "RU": t.per_thread, "KV": t.kv, "KS": ks, **vec4_rows, **coop_defs}


# The sweeps' products on tensor cores (gru_*_resident.comp COOP, train.precision fp16): tiles of 16
# units x 16 lanes (one 16 x 16 fragment per gate), 16 subgroups of 32 (the forward's 12 multiply).
COOP_UNITS, COOP_THREADS = 16, 512


def coop_tiles_ok(t) -> bool:
    """Whether resident tiles suit the tensor-core sweeps (forward and backward): 16 units x 16 lanes."""
    return isinstance(t, ResidentTiles) and t.cols == COOP_UNITS and t.lanes == COOP_UNITS


def coop_shared_bytes(H: int, backward: bool = False, split: bool = False) -> int:
    """Shared memory of a tensor-core sweep. Forward: h_prev as float16 [16][16*4*COOP_KF + 8] (split:
    twice, hi and lo; at least the 12 subgroups' 16 x 16 staging of W_hh) and the 4 k-groups' float32
    partials [4][3][16][16]. Backward: dGh as float16 [16][48 + 8], and per subgroup a float16 and a
    float32 16 x 16 scratch."""
    if backward:
        return 2 * 16 * (3 * COOP_UNITS + 8) + 16 * 256 * (2 + 4)
    sh = 16 * 4 * ceil_div(ceil_div(H, 16), 4) + 8
    return 2 * max((2 if split else 1) * 16 * sh, 12 * 256) + 4 * 4 * 3 * 256


def resident_resources(tiles: ResidentTiles, B: int, H: int, backward: bool, subgroup: int,
                       coop: bool = False, split: bool = False) -> tuple[int, int, int, int]:
    """(tiles, threads, shared bytes, registers per thread or 0 where unknown) of a resident sweep's
    workgroups: the FMA kernels' (`resident_shape`, `resident_registers`), or with coop the
    tensor-core kernels' (COOP_THREADS, `coop_shared_bytes`, split as there; their registers are not modelled)."""
    _, n_tiles, nt, nbytes = resident_shape(tiles, B, H, backward, subgroup)
    if coop and coop_tiles_ok(tiles):
        return n_tiles, COOP_THREADS, coop_shared_bytes(H, backward, split), 0
    return n_tiles, nt, nbytes, resident_registers(tiles, backward)


def partial_words(B: int, H: int, tiles) -> int:
    """Words of the resident backward sweep's partial products [2, unit tiles, B, H] (0 otherwise)."""
    return 2 * ceil_div(H, tiles.cols) * B * H if isinstance(tiles, ResidentTiles) else 0
