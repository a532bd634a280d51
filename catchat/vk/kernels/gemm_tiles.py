"""GEMM tile shapes and the choice among them: glsl/gemm.comp's (GemmTiles: the device family's row of
catchat/vk/tiles.py, or what `catchat bench --tune` cached), glsl/gemm_coopmat.comp's subgroup fragments
(CoopTiles) and glsl/gemm_coopmat2.comp's workgroup-scope matrices (Coop2Tiles), with what each device
can run; split-K counts. catchat.vk.kernels.gemm's kernels take them."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from catchat.errors import UsageError, VulkanUnavailable
from catchat.vk import shaders, tiles, tune
from catchat.vk.device import Device, coop2_dimension_name
from catchat.vk.kernels import ceil_div, device_sms
from catchat.vk.switches import env_switch


def _is_gpu(dev: Device) -> bool:
    return dev.info.type != "CPU" and dev.info.max_shared_memory_bytes >= 48 * 1024



# ---------------------------------------------------------------------------------------------
# GEMM
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmTiles:
    """Workgroup tile BM x BN over k-slices of BK; each thread computes TM x TN outputs, in 4 x 4
    blocks (TM and TN multiples of 4: the shader reads its operands as vec4s). wx > 0: each subgroup
    of 32 threads covers wx thread columns x 32 / wx thread rows (the shader's WX), else 32
    consecutive threads along the rows."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    wx: int = 0

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def shared_bytes(self) -> int:
        return 4 * 2 * self.bk * (self.bm + 4 + self.bn + 4)  # double-buffered A and B slices

    def spec(self) -> list[int]:
        return [self.threads, self.bm, self.bn, self.bk, self.tm, self.tn, self.wx]

    def _bad_wx(self) -> bool:
        """Whether wx does not tile the threads into whole subgroups of 32."""
        rn, rm = self.bn // self.tn, self.bm // self.tm
        return bool(self.wx) and (self.wx not in (1, 2, 4, 8, 16, 32) or rn % self.wx
                                  or rm % (32 // self.wx) or self.threads % 32)

    def problem(self, dev: Device, trans: tuple[bool, bool] = (False, False)) -> str | None:
        """Why these tiles cannot run glsl/gemm.comp on dev (None: they can)."""
        if self.bm % self.tm or self.bn % self.tn or self.tm % 4 or self.tn % 4 or self.bk % 4 \
                or self.threads > dev.info.max_workgroup_invocations or self._bad_wx():
            return f"bad GEMM tiles {self}"
        if self.shared_bytes > dev.info.max_shared_memory_bytes:
            return f"GEMM tiles {self} need {self.shared_bytes} B of shared memory"
        return None

    def __iter__(self):
        """(BM, BN, BK, TM, TN[, WX]), the tables' and the tuning cache's form (WX where it is set)."""
        return iter((self.bm, self.bn, self.bk, self.tm, self.tn) + ((self.wx,) if self.wx else ()))


# The measured tiles live in catchat/vk/tiles.py (a row per device family, with the measurement).
# The H200's and the CPU row's, by name, for tests and benchmarks that force a tile shape:
GPU_TILE = GemmTiles(*tiles.GEMM_ROWS[0].large)
GPU_SPLIT_K_TILE = GemmTiles(*tiles.GEMM_ROWS[0].split_k)
GPU_SMALL_TILE = GemmTiles(*tiles.GEMM_ROWS[0].small)


@dataclass(frozen=True)
class CoopTiles:
    """Tiles of glsl/gemm_coopmat.comp: wm x wn subgroups (of 32 threads) per workgroup, each fm x fn
    fragments of 16 x 16, a k-slice of bk (a multiple of 16) staged per iteration, in `stages` shared
    buffers (2: one barrier per slice; 1: half the shared memory, two barriers per slice)."""

    wm: int
    wn: int
    fm: int
    fn: int
    bk: int
    stages: int = 2
    api: str = "nv"  # "khr": the same kernel on VK_KHR_cooperative_matrix (glsl/gemm_coopmat_khr.comp)

    @property
    def bm(self) -> int:
        return self.wm * self.fm * 16

    @property
    def bn(self) -> int:
        return self.wn * self.fn * 16

    @property
    def threads(self) -> int:
        return self.wm * self.wn * COOP_SUBGROUP

    def shared_bytes(self, trans_a: bool = False, trans_b: bool = False, split: bool = False) -> int:
        """The shader's one array of 8-byte words: `stages` float16 slices, each laid out along its
        operand's contiguous direction in rows padded by two words, or the epilogue's scratch where
        that is larger: per subgroup a row of its fn fragments (16 rows of 16 fn floats, padded by two
        words); split (SPLIT): each slice twice (hi and lo parts), and one fragment's scratch twice (acc
        and acc_lo)."""
        a = self.bk * (self.bm // 4 + 2) if trans_a else self.bm * (self.bk // 4 + 2)
        b = self.bn * (self.bk // 4 + 2) if trans_b else self.bk * (self.bn // 4 + 2)
        scratch = self.wm * self.wn * 16 * ((1 if split else self.fn) * 8 + 2)
        parts = 2 if split else 1
        return 8 * parts * max(self.stages * (a + b), scratch)

    def spec(self) -> list[int]:
        return [self.threads, self.wm, self.wn, self.fm, self.fn, self.bk, self.stages]

    def problem(self, dev: Device, trans: tuple[bool, bool] = (False, False), split: bool = False) -> str | None:
        """Why these tiles cannot run glsl/gemm_coopmat.comp on dev with these transposes (None: they can);
        split: as the float32 GEMM from float16 splits (one shared buffer)."""
        if self.bk % 16 or self.stages not in (1, 2) or self.threads > dev.info.max_workgroup_invocations \
                or self.api not in ("nv", "khr") or (split and self.stages != 1):
            return f"bad cooperative-matrix tiles {self}" + (" for a split GEMM (one shared buffer)" if split else "")
        if self.api == "khr" and not coopmat_khr_runs(dev):
            return f"{dev.info.name} does not run VK_KHR_cooperative_matrix GEMMs (or the newer glslc is missing)"
        if self.shared_bytes(*trans, split) > dev.info.max_shared_memory_bytes:
            return f"cooperative-matrix tiles {self} need {self.shared_bytes(*trans, split)} B of shared memory"
        return None

    def defines(self) -> dict:
        return {}

    @property
    def shader(self) -> str:
        return "gemm_coopmat_khr" if self.api == "khr" else "gemm_coopmat"


COOP_SUBGROUP = 32  # glsl/gemm_coopmat.comp assumes NVIDIA's subgroup size
# 128 x 256 on 8 subgroups of 64 x 64 over 32-deep slices in one shared buffer: the fastest of 11
# tiles at v5's three big GEMMs on the H200 (165-187 TFLOP/s; the 256 x 128 of the 16-byte staging
# before, 87-104) and at v3's (125-172); 256 x 128 (the same, transposed) for outputs of at most 128
# columns (the head: 56 against 42 TFLOP/s at v5); 64 x 64 on 4 subgroups for grids that would not fill
# the GPU (tools/bench_gemm.py --operands coopmat, docs/benchmarks.md "Tensor-core GEMMs").
COOP_TILE = CoopTiles(2, 4, 4, 4, 32, 1)
COOP_NARROW_TILE = CoopTiles(4, 2, 4, 4, 32, 1)
COOP_SMALL_TILE = CoopTiles(2, 2, 2, 2, 16)
COOP_SHAPE = "16x16x16 f16*f16+f32->f32"  # the fragments glsl/gemm_coopmat.comp multiplies
# The tuner's and tools/bench_gemm.py's grid: subgroups x fragments (128 x 256, 256 x 128, 128 x 128 on
# 4 or 8 subgroups, 64 x 64), then slice depth and shared buffers
COOP_GRID_WARPS = ((2, 4, 4, 4), (4, 2, 4, 4), (2, 2, 4, 4), (2, 4, 4, 2), (4, 2, 2, 4), (2, 2, 2, 2))
COOP_GRID_PIPES = ((16, 1), (16, 2), (32, 1), (32, 2))  # (bk, stages)


def coopmat_runs(dev: Device) -> bool:
    """Whether glsl/gemm_coopmat.comp can run on dev: VK_NV_cooperative_matrix enabled (kp patch
    0005) with COOP_SHAPE among its shapes, on subgroups of 32."""
    return ("cooperativeMatrixNV" in dev.features and COOP_SHAPE in dev.coop_shapes
            and dev.info.subgroup_size == COOP_SUBGROUP)


def coopmat_khr_runs(dev: Device) -> bool:
    """Whether glsl/gemm_coopmat_khr.comp can run on dev: what `coopmat_runs` asks, plus
    VK_KHR_cooperative_matrix enabled (kp patch 0006) and the newer glslc at hand."""
    return coopmat_runs(dev) and "cooperativeMatrixKHR" in dev.features and newer_glslc_present()


def coop_api(dev: Device) -> str:
    """The extension the subgroup-fragment GEMM uses on dev: "khr" where VK_KHR_cooperative_matrix runs
    it (faster on the H200), unless CATCHAT_COOP_API=nv; else "nv"."""
    return "khr" if os.environ.get(ENV_COOP_API) != "nv" and coopmat_khr_runs(dev) else "nv"


def coop_candidates(dev: Device, trans: tuple[bool, bool] = (False, False)) -> list[CoopTiles]:
    """Every tile of the grid (COOP_GRID_WARPS x COOP_GRID_PIPES) that runs on dev
    at these transposes, on its extension (`coop_api`), the program's three first: what `catchat bench
    --tune` measures and tools/bench_gemm.py sweeps, and what a cached choice must be."""
    if not coopmat_runs(dev):
        return []
    api = coop_api(dev)
    grid = [COOP_TILE, COOP_NARROW_TILE, COOP_SMALL_TILE] + [
        CoopTiles(*w, bk, stages) for w in COOP_GRID_WARPS for bk, stages in COOP_GRID_PIPES]
    out = []
    for t in grid:
        t = replace(t, api=api)
        if t not in out and t.problem(dev, trans) is None:
            out.append(t)
    return out


# The float32 GEMM from float16 splits (SPLIT: three products a fragment pair, two accumulator sets, so
# 8 fragments a subgroup where the float16 GEMM has 16): 128 x 128 on 8 subgroups of 64 x 32, 32-deep
# slices in one buffer (37 KB of shared memory with their lo parts); 64 x 64 on 4 subgroups where that
# grid would not fill the GPU. `catchat bench --tune` times SPLIT_GRID at a fp32 program's shapes (kind
# "split"); tools/bench_gemm.py --operands split does too, beside cuBLAS.
SPLIT_TILE = CoopTiles(2, 4, 4, 2, 32, 1)
SPLIT_SMALL_TILE = CoopTiles(2, 2, 2, 2, 16, 1)
SPLIT_GRID = (SPLIT_TILE, CoopTiles(2, 4, 4, 2, 16, 1), CoopTiles(4, 2, 2, 4, 32, 1), CoopTiles(2, 2, 4, 2, 32, 1),
              CoopTiles(2, 2, 2, 4, 32, 1), CoopTiles(4, 2, 4, 2, 16, 1), SPLIT_SMALL_TILE)
ENV_GEMM32_SPLIT = "CATCHAT_GEMM32_SPLIT"  # "0": never; "1": every float32 GEMM (emulated fragments elsewhere)
SPLIT_MIN_MACS = 1 << 30  # smaller float32 GEMMs (decode, per-timestep rows) stay on gemm.comp
SPLIT_MIN_SHAPE = (128, 64, SPLIT_MIN_MACS // (128 * 64))  # (M, N, K): the smallest GEMM `split_gemm` splits


def split_gemm(dev: Device, M: int, N: int, K: int) -> bool:
    """Whether a float32 GEMM of [M, N] over K runs on tensor cores from float16 splits (SPLIT): where the
    device runs glsl/gemm_coopmat.comp, for outputs of at least 128 x 64 and 2^30 multiply-adds, unless
    CATCHAT_GEMM32_SPLIT=0; with CATCHAT_GEMM32_SPLIT=1 every one (on emulated fragments where the device
    has no tensor cores but float16: the tests)."""
    forced = env_switch(ENV_GEMM32_SPLIT, "0 keeps float32 GEMMs on gemm.comp's FMAs, 1 splits every one")
    if forced is not None:
        return forced and (coopmat_runs(dev) or dev.runs_float16)
    m, n, _ = SPLIT_MIN_SHAPE
    return coopmat_runs(dev) and M >= m and N >= n and M * N * K >= SPLIT_MIN_MACS


def split_tiles(dev: Device, M: int, N: int, split_k: int = 1,
                trans: tuple[bool, bool] = (False, False)) -> CoopTiles | None:
    """The split GEMM's tile: SPLIT_TILE where a grid of 128 x 128 tiles fills the GPU or, for at most 128
    columns (the head), gives a workgroup per two SMs (H100, v5's head: 24.6 against 17.1 TFLOP/s), else
    SPLIT_SMALL_TILE, on the device's extension (`coop_api`: "nv" where KHR does not run, so emulated
    fragments take gemm_coopmat.comp); the first that fits, or None."""
    wide = _narrow_fills(dev, M, N, split_k, SPLIT_TILE) or _fills(dev, M, N, split_k)
    for t in ((SPLIT_TILE, SPLIT_SMALL_TILE) if wide else (SPLIT_SMALL_TILE,)):
        t = replace(t, api=coop_api(dev))
        if t.problem(dev, trans, split=True) is None:
            return t
    return None


def split_candidates(dev: Device, trans: tuple[bool, bool] = (False, False)) -> list[CoopTiles]:
    """SPLIT_GRID's tiles that run on dev at these transposes (tools/bench_gemm.py --operands split)."""
    api = coop_api(dev)
    return [t for t in (replace(t, api=api) for t in SPLIT_GRID) if t.problem(dev, trans, split=True) is None]


def newer_glslc_present() -> bool:
    """Whether the compiler of shaders.NEWER_SHADERS is at hand."""
    try:
        shaders.glslc_path(newer=True)
    except VulkanUnavailable:
        return False
    return True


def products(dev: Device, precision: str) -> str:
    """How a program's GEMMs multiply at `precision` on dev, for logs and bench headers: with the
    extension the tensor-core GEMM runs on, since it moves the GEMMs' time by ~20% (`coop_api`)."""
    if precision != "fp16":
        split = split_gemm(dev, *SPLIT_MIN_SHAPE)  # whether the rule splits any GEMM here
        return (f"{precision} (large GEMMs on tensor cores from float16 splits, {coop_extension(dev)})" if split
                else precision)
    if coopmat2_first(dev):
        return "fp16 on tensor cores (VK_NV_cooperative_matrix2, workgroup scope)"
    if coopmat_runs(dev):
        return f"fp16 on tensor cores ({coop_extension(dev)})"
    return "fp16 emulated (no tensor cores: VK_NV_cooperative_matrix; no faster than fp32)"


def sweep_api(dev: Device, default: str | None = None) -> str:
    """The extension of the sweeps' and the tensor-core decode step's fragments (include/coopmat_ext.glsl)
    on dev: "khr" where CATCHAT_SWEEP_API says so (or `default` does) and VK_KHR_cooperative_matrix runs
    with the newer glslc (`coopmat_khr_runs`), else "nv". default: SWEEP_API_DEFAULT unless given."""
    raw = os.environ.get(ENV_SWEEP_API, "").strip() or default or SWEEP_API_DEFAULT
    if raw not in ("nv", "khr"):
        raise UsageError(f"{ENV_SWEEP_API}={raw!r} is not nv or khr",
                         hint="set nv (VK_NV_cooperative_matrix) or khr (VK_KHR_cooperative_matrix), or unset it")
    return "khr" if raw == "khr" and coopmat_khr_runs(dev) else "nv"


def frag_defines(dev: Device, emulate: bool, default: str | None = None) -> dict:
    """The define that puts a shader's real fragments (include/coopmat_ext.glsl) on VK_KHR_cooperative_matrix
    (`sweep_api`; `default` where CATCHAT_SWEEP_API is unset)."""
    return {"KHR": 1} if not emulate and sweep_api(dev, default) == "khr" else {}


def extension_name(api: str) -> str:
    """The cooperative-matrix extension an api ("nv" or "khr": `coop_api`, `sweep_api`) names."""
    return "VK_KHR_cooperative_matrix" if api == "khr" else "VK_NV_cooperative_matrix"


def coop_extension(dev: Device) -> str:
    """The extension of the subgroup-fragment GEMM on dev, by name (`coop_api`)."""
    return extension_name(coop_api(dev))


def tensor_core_extensions(dev: Device) -> str | None:
    """Which extension the tensor-core GEMMs and the sweeps' fragments run on here (`catchat doctor`),
    None where the device has no cooperative matrices."""
    if not coopmat_runs(dev):
        return None
    return (f"tensor-core GEMMs on {coop_extension(dev)}, streamed sweeps and decode on "
            f"{extension_name(sweep_api(dev))}, register-resident sweeps on "
            f"{extension_name(sweep_api(dev, RESIDENT_SWEEP_API_DEFAULT))}")


def coop_tiles(dev: Device, M: int, N: int, split_k: int = 1,
               trans: tuple[bool, bool] = (False, False)) -> CoopTiles | None:
    """The tile for an [M, N] output: COOP_NARROW_TILE for at most 128 columns where its grid (with the
    split-K count) gives at least one workgroup per two SMs, else COOP_TILE where a grid of 128 x 128
    tiles fills the GPU as the tables' large GEMM tile must (`table_gemm_tiles`), else COOP_SMALL_TILE;
    the first that fits the device's threads and shared memory, or None."""
    if _narrow_fills(dev, M, N, split_k, COOP_NARROW_TILE):
        order = (COOP_NARROW_TILE, COOP_SMALL_TILE)
    elif _fills(dev, M, N, split_k):
        order = (COOP_TILE, COOP_SMALL_TILE)
    else:
        order = (COOP_SMALL_TILE,)
    for t in order:
        if t.problem(dev, trans) is None:
            return t
    return None


@dataclass(frozen=True)
class Coop2Tiles:
    """Tiles of glsl/gemm_coopmat2.comp: one bm x bn float32 accumulator per workgroup of `threads`
    (a workgroup-scope cooperative matrix: the driver spreads it over the subgroups), products over
    k-slices of bk."""

    bm: int
    bn: int
    bk: int
    threads: int = 256
    unroll: int = 1  # k-slices per iteration of the unclamped loop
    unclamped: bool = True  # False: every tile on the clamped loop (for comparison)

    def spec(self) -> list[int]:
        return [self.threads, self.bm, self.bn, self.bk, self.unroll, int(self.unclamped)]

    def problem(self, dev: Device, trans: tuple[bool, bool] = (False, False)) -> str | None:
        """Why these tiles cannot run glsl/gemm_coopmat2.comp on dev (None: they can): the device's
        flexible dimensions for float16 products with float32 sums at workgroup scope for this many
        threads, its largest dimension and workgroup, and at most 128 accumulators per thread."""
        if not coopmat2_runs(dev):
            return f"{dev.info.name} does not run cooperative-matrix-2 GEMMs"
        max_threads, max_dim = (dev.coop2_limits + (0, 0))[:2]
        # M, N, K granularity, A, B, C, result types, saturating, scope, invocations (kp patch 0006)
        fits = any(tuple(d[3:7]) == COOP2_COMPONENTS and d[8] == SCOPE_WORKGROUP and d[9] == self.threads
                   and self.bm % d[0] == 0 and self.bn % d[1] == 0 and self.bk % d[2] == 0
                   for d in dev.coop2_dimensions)
        if self.threads > max_threads or max(self.bm, self.bn, self.bk) > max_dim or not fits:
            offered = ", ".join(coop2_dimension_name(d) for d in dev.coop2_dimensions) or "none"
            return (f"cooperative-matrix-2 tiles {self} are not among {dev.info.name}'s workgroup-scope "
                    f"dimensions ({offered}; largest {max_dim}, at most {max_threads} threads)")
        if self.bm * self.bn > 128 * self.threads:
            return f"cooperative-matrix-2 tiles {self} need {self.bm * self.bn // self.threads} accumulators per thread"
        return None

    def defines(self) -> dict:
        return {}


COOP2_TYPES = "f16*f16+f32->f32"
COOP2_COMPONENTS = (0, 0, 1, 1)  # VkComponentTypeKHR of A, B, C, result: float16, float16, float32, float32
SCOPE_WORKGROUP = 2  # VkScopeKHR
COOP2_FEATURES = frozenset({"cooperativeMatrixKHR", "cooperativeMatrixWorkgroupScope",
                            "cooperativeMatrixFlexibleDimensions", "cooperativeMatrixTensorAddressing",
                            "cooperativeMatrixPerElementOperations"})
# The subgroup-fragment GEMM on VK_KHR_cooperative_matrix where it runs (the newer glslc): on the H200 its
# code runs v5's GEMMs at 190-250 TFLOP/s against VK_NV_cooperative_matrix's 169-187, same source, same tiles
# (tools/bench_gemm.py --operands coopmat-khr --probe; the products alone: 344-393 against 235-254).
# CATCHAT_COOP_API=nv keeps the NV extension.
ENV_COOP_API = "CATCHAT_COOP_API"
# The streamed sweeps and the tensor-core decode step on either extension: CATCHAT_SWEEP_API=nv|khr. The
# GEMM's products alone ran 344-393 TFLOP/s on KHR against 235-254 on NV (same source, H200); the sweeps'
# products are the same 16 x 16 fragments, so they are built for both and measured (tools/gpu-check.sh).
ENV_SWEEP_API = "CATCHAT_SWEEP_API"
SWEEP_API_DEFAULT = "khr"  # the streamed sweeps and the decode step: KHR measured faster (H100, 2026-12-07)
# The register-resident sweeps on tensor cores (gru_*_resident.comp COOP: v3's forward-only programs at fp16)
# build on either extension too, but their KHR variants have not run on a GPU: NV unless CATCHAT_SWEEP_API=khr
# asks, until their parity and timing (tools/gpu-check.sh group resident-khr) say otherwise.
RESIDENT_SWEEP_API_DEFAULT = "nv"
ENV_COOPMAT2 = "CATCHAT_COOPMAT2"  # "1": workgroup scope first where it runs; "0": never
# H200 (driver 580.159.04, tools/bench_gemm.py --operands coopmat2 / coopmat2-f16 at v5): 128 x 256 on 256
# threads over 32-deep slices is the fastest with float32 operands converted (94-113 TFLOP/s), 128 x 128 on
# 128 threads with float16 ones (134-168); both below the subgroup fragments' 165-203, hence not the default.
# Those rows predate the shader's unclamped, unrolled fast path (llama.cpp's), not yet measured.
COOP2_TILE = Coop2Tiles(128, 256, 32)
COOP2_NARROW_TILE = Coop2Tiles(128, 128, 32, 128)


def coopmat2_runs(dev: Device) -> bool:
    """Whether glsl/gemm_coopmat2.comp can run on dev: VK_KHR_cooperative_matrix and
    VK_NV_cooperative_matrix2's workgroup scope, flexible dimensions, tensor addressing and per-element
    operations enabled (kp patch 0006), its compiler at hand, and not turned off by CATCHAT_COOPMAT2=0."""
    return os.environ.get(ENV_COOPMAT2, "1") != "0" and COOP2_FEATURES <= dev.features and newer_glslc_present()


def coopmat2_first(dev: Device) -> bool:
    """Whether the program's GEMMs take glsl/gemm_coopmat2.comp first on dev: where it runs and either
    CATCHAT_COOPMAT2=1 asks for it or the device has no subgroup fragments (measured slower than them
    at every shape on the H200 and the H100: docs/benchmarks.md). `catchat parity` checks it then."""
    return coopmat2_runs(dev) and (os.environ.get(ENV_COOPMAT2) == "1" or not coopmat_runs(dev))


def coop2_tiles(dev: Device, M: int, N: int, split_k: int = 1) -> Coop2Tiles | None:
    """COOP2_TILE where its grid fills the GPU and the output is wider than 128 columns, else
    COOP2_NARROW_TILE; the first that the device offers, or None."""
    wide = N > COOP2_NARROW_TILE.bn and _fills(dev, M, N, split_k)
    for t in ((COOP2_TILE, COOP2_NARROW_TILE) if wide else (COOP2_NARROW_TILE,)):
        if t.problem(dev) is None:
            return t
    return None


CPU_TILE = GemmTiles(*tiles.gemm_row("", gpu=False).large)


def gemm_candidates(dev: Device) -> list[GemmTiles]:
    """Every tile the tables list (each row's large, split-K and small tile) that fits this device's
    threads and shared memory: what `catchat bench --tune` measures, and what a cached choice must be."""
    out = []
    for row in tiles.GEMM_ROWS:
        for t in (row.large, row.split_k, row.small):
            g = GemmTiles(*t)
            if g not in out and g.problem(dev) is None:
                out.append(g)
    return out


def table_gemm_tiles(dev: Device, M: int, N: int, split_k: int = 1) -> GemmTiles:
    """The tables' choice (tiles.GEMM_ROWS, the device family's row): the large (or split-K) tile
    where the grid of 128x128 tiles reaches the row's fill count, scaled to this device's SMs
    (the measured device's count where the driver does not tell), else the small tile."""
    row = tiles.gemm_row(dev.info.name, _is_gpu(dev))
    if _fills(dev, M, N, split_k):
        return GemmTiles(*(row.split_k if split_k > 1 else row.large))
    return GemmTiles(*row.small)


def _narrow_fills(dev: Device, M: int, N: int, split_k: int, tile: CoopTiles) -> bool:
    """Whether an output of at most `tile`'s columns (the head) gives a workgroup per two SMs in `tile`s
    (with the split-K count): the narrow-output rule of both tensor-core GEMMs (on a CPU device, which
    reports no SMs, always: there the first tile that fits the shared memory decides)."""
    return N <= tile.bn and 2 * ceil_div(M, tile.bm) * split_k >= device_sms(dev)


def _fills(dev: Device, M: int, N: int, split_k: int) -> bool:
    """Whether a grid of 128x128 tiles (times the split-K count) reaches the device row's fill count."""
    row = tiles.gemm_row(dev.info.name, _is_gpu(dev))
    fill = tiles.scaled_workgroups(row.fill_workgroups, device_sms(dev), row.measured_cus)
    return bool(row.fill_workgroups) and ceil_div(M, 128) * ceil_div(N, 128) * split_k >= fill


def gemm_tiles(dev: Device, M: int, N: int, split_k: int = 1, K: int | None = None,
               trans: tuple[bool, bool] = (False, False)) -> GemmTiles:
    """Tile sizes for this device and output shape: the choice `catchat bench --tune` cached for
    this device and (M, N, K, split_k, transposes) where there is one and it is still a candidate
    (`gemm_candidates`), else the tables' (`table_gemm_tiles`). Without K the cache is not asked."""
    if K is not None:
        t = _tuned(dev, "gemm", (M, N, K, split_k, trans), lambda c: GemmTiles(*(int(v) for v in c)),
                   lambda: gemm_candidates(dev), "GEMM tiles", "")
        if t is not None:
            return t
    return table_gemm_tiles(dev, M, N, split_k)


def _tuned(dev: Device, kind: str, shape: tuple, build, candidates, what: str, flags: str):
    """The tile `catchat bench --tune` cached for a GEMM of `shape` (M, N, K, split_k, transposes) of
    cache kind `kind`, rebuilt by build(cached) and accepted only where it is among candidates() (else
    a note naming `what` and None); while `tune.recording()` the shape is collected."""
    M, N, K, split_k, trans = shape
    key = tune.gemm_key(M, N, K, split_k, *trans)
    cached = tune.lookup(dev.info, kind, key, dict(M=M, N=N, K=K, split_k=split_k, trans_a=trans[0],
                                                   trans_b=trans[1]))
    if cached is None:
        return None
    try:
        t = build(cached)
    except (TypeError, ValueError):
        t = None
    if t is not None and t in candidates():
        return t
    tune.note(f"ignoring the tuned {what} {cached} for {key}: not a candidate on this device "
              f"(`catchat bench CONFIG --tune{flags}` measures again)")
    return None


def gemm_split_k(dev: Device, M: int, N: int, K: int, max_workspace_bytes: int = 256 << 20,
                 min_k_range: int = 1024) -> int:
    """A split-K count for a long-K GEMM with few output tiles (weight gradients, K = T*B):
    the row's workgroups in all (~512 on an H200, ~4 per SM), k-ranges of >= min_k_range, a workspace
    of at most max_workspace_bytes; 1 on a CPU device. (H200, dW [1536,512] over K = 65536: 7.4 ms
    unsplit -> 3.2 ms at 16.)"""
    if not _is_gpu(dev):
        return 1
    row = tiles.gemm_row(dev.info.name, True)
    target = tiles.scaled_workgroups(row.split_k_workgroups, device_sms(dev), row.measured_cus)
    s = ceil_div(target, ceil_div(M, 128) * ceil_div(N, 128))
    return max(1, min(s, K // min_k_range, max_workspace_bytes // max(1, 4 * M * N)))


SHORT_K_RANGE = 256  # k-range per split of a short GEMM's (a forward of a few rows)
SHORT_ROWS = 1024  # at most this many rows: a forward of a few timesteps (never a training window's)


def short_split_k(dev: Device, M: int, N: int, K: int) -> int:
    """A split-K count for a forward GEMM of few rows (generation's batched step: M = the streams,
    K = H): 1 past SHORT_ROWS rows (a training window's M = T*B keeps the kernels it was measured
    with) or where the output tiles fill the GPU; else k-ranges of >= SHORT_K_RANGE. (H200, v5
    batched decode at 64 streams: the head [64, 2048] x [2048, 101] took 217 us and each input
    projection most of a layer's 266-323 us, a few output tiles each walking K = 2048, 2026-12-05.)"""
    return 1 if M > SHORT_ROWS else gemm_split_k(dev, M, N, K, min_k_range=SHORT_K_RANGE)


def tuned_coop_tiles(dev: Device, M: int, N: int, K: int, split_k: int,
                     trans: tuple[bool, bool]) -> CoopTiles | None:
    """The subgroup-fragment tile `catchat bench --tune` cached for this device and (M, N, K, split_k,
    transposes) (kind "coop": `dataclasses.astuple` of a CoopTiles), where it is still one of
    `coop_candidates` (else a note and None); while `tune.recording()` the shape is collected."""
    return _tuned(dev, "coop", (M, N, K, split_k, trans), lambda c: CoopTiles(*c),
                  lambda: coop_candidates(dev, trans), "cooperative-matrix tiles", " --precision fp16")


def pick_split_tiles(dev: Device, M: int, N: int, split_k: int, trans: tuple[bool, bool],
                     K: int | None = None) -> CoopTiles | None:
    """The split GEMM's tile: the one `catchat bench --tune` cached for this device and (M, N, K, split_k,
    transposes) (kind "split"), where it is still one of `split_candidates` (else a note); else
    `split_tiles`. Without K the cache is not asked; None where nothing fits."""
    if K is not None:
        t = _tuned(dev, "split", (M, N, K, split_k, trans), lambda c: CoopTiles(*c),
                   lambda: split_candidates(dev, trans), "split GEMM tiles", "")
        if t is not None:
            return t
    return split_tiles(dev, M, N, split_k, trans)


def pick_coop_tiles(dev: Device, M: int, N: int, split_k: int, trans: tuple[bool, bool],
                    coopmat2: bool | None = None, K: int | None = None) -> CoopTiles | Coop2Tiles | None:
    """A cooperative-matrix GEMM's tile. coopmat2 True: the workgroup-scope tile; False: the subgroup
    fragments' tile; None: the subgroup fragments' where the device runs them (measured faster on the
    H200: docs/benchmarks.md), unless CATCHAT_COOPMAT2=1 asks for workgroup scope first. The subgroup
    fragments' on VK_KHR_cooperative_matrix where that runs (ENV_COOP_API): the one `catchat bench --tune`
    cached for the shape where there is one (`tuned_coop_tiles`; without K the cache is not asked), else
    `coop_tiles`. None where nothing fits."""
    if coopmat2 is None:
        coopmat2 = True if os.environ.get(ENV_COOPMAT2) == "1" else None
    first = coopmat2 is True or (coopmat2 is None and coopmat2_first(dev))
    t = coop2_tiles(dev, M, N, split_k) if first and coopmat2_runs(dev) else None
    if t is None and not coopmat2 and coopmat_runs(dev):
        t = tuned_coop_tiles(dev, M, N, K, split_k, trans) if K is not None else None
        if t is None:
            t = coop_tiles(dev, M, N, split_k, trans)
            if t is not None:
                t = replace(t, api=coop_api(dev))
    return t
