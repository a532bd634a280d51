"""Tile tables: the measured tile choices of the GEMM and GRU sweep kernels, one row per device family.

These are measurements, not constants of the algorithms: each row names the device it was
measured on, the command that measured it and the numbers that chose it (docs/benchmarks.md).
The pickers (`gemm.gemm_tiles`, `gru.pick_tiles`, `gru.pick_resident_tiles`) read the row of
the device's family (`gemm_row`, `gru_row`); a new GPU adds a row here (and a `match` on its
name) instead of editing the kernels. Devices with no row of their own take the default row of
their kind: GPUs the H200's, CPU devices (lavapipe) the CPU row. A choice `catchat bench --tune`
measured on this very device (catchat/vk/tune.py) comes before the row.

Nothing here is tied to the measured GPU's size: workgroup counts that mean "enough to fill the
GPU" are the measured device's (`*_workgroups`, with its SM count `measured_cus`) and scale with
the device's SM count (`scaled_workgroups`, `DeviceInfo.compute_units`).
Where the driver does not report it (every non-NVIDIA GPU: VK_NV_shader_sm_builtins is the only
way Vulkan tells), `scaled_workgroups` falls back to the SM count of the device the row was
measured on (`measured_cus`), i.e. the thresholds as they were measured.

Plain data only (no imports from catchat): GEMM tiles are (BM, BN, BK, TM, TN), GRU tiles as in
catchat/vk/kernels/gru.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmRow:
    """GEMM tiles (BM, BN, BK, TM, TN) of a device family: `large` for output grids of at least
    `fill_workgroups` workgroups at 128x128 (`split_k` when split over K), else `small`. Split-K
    aims at `split_k_workgroups` workgroups in all, the column sums at `colsum_workgroups`. Each
    count is the measured device's (`measured_cus` SMs), scaled to the device's (`scaled_workgroups`)."""

    family: str
    match: tuple[str, ...]  # device-name substrings (case-insensitive) that select this row
    large: tuple[int, int, int, int, int]
    split_k: tuple[int, int, int, int, int]
    small: tuple[int, int, int, int, int]
    fill_workgroups: int  # 0: always `small`
    split_k_workgroups: int
    colsum_workgroups: int
    measured_cus: int  # SMs of the measured device: the fallback where a device's count is unknown
    measured: str


@dataclass(frozen=True)
class GruRow:
    """GRU sweep tile candidates of a device family (see catchat/vk/kernels/gru.py for the tuples)."""

    family: str
    match: tuple[str, ...]
    forward: tuple  # ((tiles, min workgroups), ...) per-step forward, in order of preference
    backward: tuple
    persistent_forward: tuple  # tiles of one-dispatch sweeps: the one with the most tiles that fit
    persistent_backward: tuple
    resident_forward: tuple  # (cols, per_thread, kv, batch or 0, sl) register-resident candidates
    resident_backward: tuple
    register_file: int  # 32-bit registers per SM (resident sweeps stay within it)
    measured_cus: int  # SMs of the measured device: `forward`/`backward` workgroup minimums scale from it
    measured: str


GEMM_ROWS = (
    GemmRow(
        family="nvidia-h200", match=("H200",),
        large=(128, 128, 8, 16, 8), split_k=(128, 64, 8, 8, 4), small=(64, 64, 8, 4, 4),
        fill_workgroups=264, split_k_workgroups=512, colsum_workgroups=1024,  # ~2, ~4, ~8 per SM
        measured_cus=132,
        measured="NVIDIA H200, driver 580.159.04: `python tools/bench_gemm.py configs/catchat-v3.toml` (TFLOP/s at "
                 "v3's shapes, median of 9): 128 threads per 128x128 tile of 16x8 outputs: input projection 30.4 -> "
                 "33.2, input gradient 31.2 -> 36.5, head 15.3 -> 16.1 (8x8 per thread on 256 threads: 30-31); "
                 "split-K weight gradients 128x64 / 8x4: 38.3 (large tile 37.1); 64x64 / 4x4 where too few large "
                 "tiles fill the machine. docs/benchmarks.md, 'GEMM kernel'."),
    GemmRow(
        family="cpu", match=(),
        large=(32, 32, 8, 4, 4), split_k=(32, 32, 8, 4, 4), small=(32, 32, 8, 4, 4), fill_workgroups=0,
        split_k_workgroups=0, colsum_workgroups=0, measured_cus=0,
        measured="lavapipe (Mesa 22.3, 2 cores): 32x32 / 4x4 on every shape (fits its 32 KB of shared memory)."),
)

GRU_ROWS = (
    GruRow(
        family="nvidia-h200", match=("H200",),
        forward=(((4, 16, 4, 2, 2, 64), 256), ((8, 16, 4, 1, 1, 64), 128), ((8, 8, 4, 1, 1, 64), 32),
                 ((4, 8, 2, 1, 1, 32), 1)),
        backward=(((4, 8, 8, 1, 2, 128), 256), ((2, 16, 16, 1, 1, 128), 128), ((2, 16, 8, 1, 1, 64), 32),
                  ((4, 8, 1, 1, 1, 32), 1)),
        persistent_forward=((8, 16, 4, 2, 1, 64), (4, 16, 4, 2, 2, 64), (8, 16, 4, 2, 2, 64)),
        persistent_backward=((4, 16, 8, 1, 1, 128), (8, 8, 8, 1, 2, 128), (8, 16, 4, 1, 2, 128)),
        resident_forward=((16, 2, 2, 4, 32), (8, 2, 2, 4, 32), (4, 2, 2, 2, 32), (2, 1, 2, 2, 32)),
        resident_backward=((16, 2, 0, 8, 2), (8, 2, 0, 8, 2), (8, 4, 0, 8, 2), (4, 4, 0, 8, 2), (2, 4, 0, 8, 2)),
        register_file=65536, measured_cus=132,
        measured="NVIDIA H200, driver 580.159.04 (`python tools/bench_gru.py`, `catchat bench CONFIG`; "
                 "docs/benchmarks.md). Per-step tiled sweeps at B=64, T=256 (us per step incl. the 2.75 us dispatch "
                 "floor): forward (8,16,4,1,1,64) 20.8 at H=512, 61 at 1024, 207 at 2048; backward "
                 "(2,16,16,1,1,128) 22.6 at H=512, (4,8,8,1,2,128) 51 at 1024, 178 at 2048; at B=32 H=2048 the "
                 "forward's (4,16,4,2,2,64) made catchat-v5 training 5% and eval 12% faster. Resident sweeps at "
                 "B=64 H=512 (a v3 layer, one persistent dispatch): forward (16,2,2,4) 7.5 us per step, "
                 "(32,1,4,2) 7.9-12.9, tiled 18; backward by rows (ms per sweep in a training step): "
                 "(16,2,0,8,2) 8.34, (16,2,0,16,1) 8.34, (16,1,0,16,1) 8.96, (16,2,0,16,2) 9.3, (16,4,0,4,4) 10.5, "
                 "(16,8,0,4,8) 10.8, (16,4,0,8,4) 12.1."),
)


def scaled_workgroups(count: int, cus: int, measured_cus: int) -> int:
    """A workgroup count measured on a GPU of `measured_cus` SMs, scaled to one of `cus` (rounded up;
    `cus` 0 = unknown: the count as measured)."""
    if cus <= 0 or measured_cus <= 0 or cus == measured_cus:
        return count
    return max(1, -(-count * cus // measured_cus))


def _row(rows, name: str, gpu: bool):
    """The row whose `match` names this device, else the default of its kind (GPUs: the first row,
    the H200's; CPU devices: the 'cpu' row where the table has one)."""
    low = name.lower()
    for r in rows:
        if any(m.lower() in low for m in r.match):
            return r
    if not gpu:
        for r in rows:
            if r.family == "cpu":
                return r
    return rows[0]


def gemm_row(name: str, gpu: bool) -> GemmRow:
    return _row(GEMM_ROWS, name, gpu)


def gru_row(name: str, gpu: bool) -> GruRow:
    return _row(GRU_ROWS, name, gpu)
