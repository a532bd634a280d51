"""Matrix multiply and column sums (glsl/gemm.comp, glsl/colsum.comp).

Operands are row-major matrices inside bigger buffers, given as `(tensor, element offset, leading
dimension)`: e.g. W_ih of layer l is `(params, layout.offsets["layers.l.gru.weight_ih"], H)`.
Where the model uses them:
    input projection   G[T*B,3H]  = X[T*B,H] @ W_ih^T + b_ih        Gemm(trans_b=True, bias=...)
    head logits        Z[T*B,V]   = X[T*B,H] @ W_head^T             Gemm(trans_b=True)
    weight gradient    dW[3H,H]  += dG^T[3H,T*B] @ X[T*B,H]         Gemm(trans_a=True, beta=1, split_k=S)
    input gradient     dX[T*B,H] (+)= dG[T*B,3H] @ W_ih[3H,H]       Gemm(beta=0 or 1)
    bias gradient      db[3H]    += colsum(dG[T*B,3H])              ColSum
Both kernels are deterministic: fixed summation orders, no float atomics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from catchat.errors import VulkanUnavailable
from catchat.precision import PRECISIONS
from catchat.vk import shaders, tiles, tune
from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div, device_sms

MAX_GROUPS = 65535  # the smallest maxComputeWorkGroupCount Vulkan allows per dimension


def _is_gpu(dev: Device) -> bool:
    return dev.info.type != "CPU" and dev.info.max_shared_memory_bytes >= 48 * 1024


def _check_matrix(tensor, off: int, rows: int, cols: int, ld: int, what: str, per_word: int = 1) -> None:
    """Refuse a matrix view that reaches past its buffer (kp would not tell). per_word: elements per
    32-bit word of the tensor (2 for float16 packed by `pack_half`)."""
    if off < 0 or ld < cols:
        raise ValueError(f"{what}: offset {off} / leading dimension {ld} invalid for {cols} columns")
    if rows > 0 and cols > 0 and off + (rows - 1) * ld + cols > per_word * tensor.size():
        raise ValueError(f"{what}: [{rows},{cols}] at offset {off} (ld {ld}) exceeds its buffer "
                         f"of {per_word * tensor.size()} elements")


def _check_vector(tensor, off: int, n: int, what: str) -> None:
    if off < 0 or off + n > tensor.size():
        raise ValueError(f"{what}: [{n}] at offset {off} exceeds its buffer of {tensor.size()} elements")


# ---------------------------------------------------------------------------------------------
# GEMM
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmTiles:
    """Workgroup tile BM x BN over k-slices of BK; each thread computes TM x TN outputs, in 4 x 4
    blocks (TM and TN multiples of 4: the shader reads its operands as vec4s)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def shared_bytes(self) -> int:
        return 4 * 2 * self.bk * (self.bm + 4 + self.bn + 4)  # double-buffered A and B slices

    def spec(self) -> list[int]:
        return [self.threads, self.bm, self.bn, self.bk, self.tm, self.tn]

    def problem(self, dev: Device, trans: tuple[bool, bool] = (False, False)) -> str | None:
        """Why these tiles cannot run glsl/gemm.comp on dev (None: they can)."""
        if self.bm % self.tm or self.bn % self.tn or self.tm % 4 or self.tn % 4 or self.bk % 4 \
                or self.threads > dev.info.max_workgroup_invocations:
            return f"bad GEMM tiles {self}"
        if self.shared_bytes > dev.info.max_shared_memory_bytes:
            return f"GEMM tiles {self} need {self.shared_bytes} B of shared memory"
        return None

    def __iter__(self):
        """(BM, BN, BK, TM, TN), the tables' and the tuning cache's form."""
        return iter((self.bm, self.bn, self.bk, self.tm, self.tn))


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

    @property
    def bm(self) -> int:
        return self.wm * self.fm * 16

    @property
    def bn(self) -> int:
        return self.wn * self.fn * 16

    @property
    def threads(self) -> int:
        return self.wm * self.wn * COOP_SUBGROUP

    def shared_bytes(self, trans_a: bool = False, trans_b: bool = False) -> int:
        """The shader's one array of 8-byte words: `stages` float16 slices, each laid out along its
        operand's contiguous direction in rows padded by two words, or the epilogue's scratch (a
        16 x 20 float fragment per subgroup) where that is larger."""
        a = self.bk * (self.bm // 4 + 2) if trans_a else self.bm * (self.bk // 4 + 2)
        b = self.bn * (self.bk // 4 + 2) if trans_b else self.bk * (self.bn // 4 + 2)
        scratch = self.wm * self.wn * 16 * 10
        return 8 * max(self.stages * (a + b), scratch)

    def spec(self) -> list[int]:
        return [self.threads, self.wm, self.wn, self.fm, self.fn, self.bk, self.stages]

    def problem(self, dev: Device, trans: tuple[bool, bool] = (False, False)) -> str | None:
        """Why these tiles cannot run glsl/gemm_coopmat.comp on dev with these transposes (None: they can)."""
        if self.bk % 16 or self.stages not in (1, 2) or self.threads > dev.info.max_workgroup_invocations:
            return f"bad cooperative-matrix tiles {self}"
        if self.shared_bytes(*trans) > dev.info.max_shared_memory_bytes:
            return f"cooperative-matrix tiles {self} need {self.shared_bytes(*trans)} B of shared memory"
        return None

    def defines(self) -> dict:
        return {}


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


def coopmat_runs(dev: Device) -> bool:
    """Whether glsl/gemm_coopmat.comp can run on dev: VK_NV_cooperative_matrix enabled (kp patch
    0005) with COOP_SHAPE among its shapes, on subgroups of 32."""
    return ("cooperativeMatrixNV" in dev.features and COOP_SHAPE in dev.coop_shapes
            and dev.info.subgroup_size == COOP_SUBGROUP)


def products(dev: Device, precision: str) -> str:
    """How a program's GEMMs multiply at `precision` on dev, for logs and bench headers."""
    if precision != "fp16":
        return precision
    if coopmat2_runs(dev):
        return "fp16 on tensor cores (cooperative matrix 2)"
    if coopmat_runs(dev):
        return "fp16 on tensor cores"
    return "fp16 emulated (no tensor cores: VK_NV_cooperative_matrix; no faster than fp32)"


def coop_tiles(dev: Device, M: int, N: int, split_k: int = 1,
               trans: tuple[bool, bool] = (False, False)) -> CoopTiles | None:
    """The tile for an [M, N] output: COOP_NARROW_TILE for at most 128 columns where its grid (with the
    split-K count) gives at least one workgroup per two SMs, else COOP_TILE where a grid of 128 x 128
    tiles fills the GPU as the tables' large GEMM tile must (`table_gemm_tiles`), else COOP_SMALL_TILE;
    the first that fits the device's threads and shared memory, or None."""
    if N <= COOP_NARROW_TILE.bn and 2 * ceil_div(M, COOP_NARROW_TILE.bm) * split_k >= device_sms(dev):
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

    def spec(self) -> list[int]:
        return [self.threads, self.bm, self.bn, self.bk]

    def problem(self, dev: Device, trans: tuple[bool, bool] = (False, False)) -> str | None:
        """Why these tiles cannot run glsl/gemm_coopmat2.comp on dev (None: they can): the device's
        flexible dimensions for float16 products with float32 sums at workgroup scope for this many
        threads, its largest dimension and workgroup, and at most 128 accumulators per thread."""
        if not coopmat2_runs(dev):
            return f"{dev.info.name} does not run cooperative-matrix-2 GEMMs"
        max_threads, max_dim = (dev.coop2_limits + (0, 0))[:2]
        grains = [tuple(int(g) for g in d.split()[0].split("x")) for d in dev.coop2_dimensions
                  if d.endswith(f"{COOP2_TYPES} workgroup {self.threads}")]
        fits = any(self.bm % gm == 0 and self.bn % gn == 0 and self.bk % gk == 0 for gm, gn, gk in grains)
        if self.threads > max_threads or max(self.bm, self.bn, self.bk) > max_dim or not fits:
            return (f"cooperative-matrix-2 tiles {self} are not among {dev.info.name}'s workgroup-scope "
                    f"dimensions ({', '.join(dev.coop2_dimensions) or 'none'}; largest {max_dim}, "
                    f"at most {max_threads} threads)")
        if self.bm * self.bn > 128 * self.threads:
            return f"cooperative-matrix-2 tiles {self} need {self.bm * self.bn // self.threads} accumulators per thread"
        return None

    def defines(self) -> dict:
        return {}


COOP2_TYPES = "f16*f16+f32->f32"
COOP2_FEATURES = frozenset({"cooperativeMatrixKHR", "cooperativeMatrixWorkgroupScope",
                            "cooperativeMatrixFlexibleDimensions", "cooperativeMatrixTensorAddressing",
                            "cooperativeMatrixPerElementOperations"})
ENV_COOPMAT2 = "CATCHAT_COOPMAT2"  # "0": the subgroup-fragment GEMM even where cooperative matrix 2 runs
# 128 x 256 accumulators on 256 threads over 32-deep slices; 128 x 128 for outputs of at most 128 columns
# or grids that would not fill the GPU (first choices, before the H200's measurement)
COOP2_TILE = Coop2Tiles(128, 256, 32)
COOP2_NARROW_TILE = Coop2Tiles(128, 128, 32)


def coopmat2_runs(dev: Device) -> bool:
    """Whether glsl/gemm_coopmat2.comp can run on dev: VK_KHR_cooperative_matrix and
    VK_NV_cooperative_matrix2's workgroup scope, flexible dimensions, tensor addressing and per-element
    operations enabled (kp patch 0006), its compiler at hand, and not turned off by CATCHAT_COOPMAT2=0."""
    if os.environ.get(ENV_COOPMAT2, "1") == "0" or not COOP2_FEATURES <= dev.features:
        return False
    try:
        shaders.glslc_path(newer=True)
    except VulkanUnavailable:
        return False
    return True


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
        key = tune.gemm_key(M, N, K, split_k, *trans)
        cached = tune.lookup(dev.info, "gemm", key, dict(M=M, N=N, K=K, split_k=split_k, trans_a=trans[0],
                                                         trans_b=trans[1]))
        if cached is not None:
            try:
                t = GemmTiles(*(int(v) for v in cached))
            except (TypeError, ValueError):
                t = None
            if t is not None and t in gemm_candidates(dev):
                return t
            tune.note(f"ignoring the tuned GEMM tiles {cached} for {key}: not a candidate on this device "
                      f"(`catchat bench CONFIG --tune` measures again)")
    return table_gemm_tiles(dev, M, N, split_k)


def gemm_split_k(dev: Device, M: int, N: int, K: int, max_workspace_bytes: int = 256 << 20) -> int:
    """A split-K count for a long-K GEMM with few output tiles (weight gradients, K = T*B):
    the row's workgroups in all (~512 on an H200, ~4 per SM), k-ranges of >= 1024, a workspace of at
    most max_workspace_bytes; 1 on a CPU device. (H200, dW [1536,512] over K = 65536: 7.4 ms
    unsplit -> 3.2 ms at 16.)"""
    if not _is_gpu(dev):
        return 1
    row = tiles.gemm_row(dev.info.name, True)
    target = tiles.scaled_workgroups(row.split_k_workgroups, device_sms(dev), row.measured_cus)
    s = ceil_div(target, ceil_div(M, 128) * ceil_div(N, 128))
    return max(1, min(s, K // 1024, max_workspace_bytes // max(1, 4 * M * N)))


def _vec4_ok(operand, contiguous_extent: int, along_k: bool, k_split: int) -> bool:
    """Whether a (tensor, offset, ld) operand can be read as whole vec4s: offset, leading
    dimension and the extent of its contiguous direction are multiples of 4 (along k, so is the
    split-K range: every split starts on a vec4)."""
    _, off, ld = operand
    return off % 4 == 0 and ld % 4 == 0 and contiguous_extent % 4 == 0 and (not along_k or k_split % 4 == 0)


def _workspace(dev: Device, given, n: int, what: str):
    """The caller's scratch tensor (shareable between kernels that run one after another) or a
    new device-only one of n floats."""
    if given is None:
        return dev.tensor(n, kind="storage")
    if given.size() < n:
        raise ValueError(f"{what}: workspace of {given.size()} floats, needs {n}")
    return given


class _GemmSplitReduce(Kernel):
    """Second pass of split-K: C[M,N] = alpha * sum_s W[s,M,N] (s in order) + beta*C + bias."""

    shader = "gemm"
    WORKGROUP = 256

    def __init__(self, dev, work, c, M, N, S, alpha, beta, bias):
        defines = {"SPLITK_REDUCE": 1, **({"HAS_BIAS": 1} if bias is not None else {})}
        tensors = [work, c[0]] + ([bias[0]] if bias is not None else [])
        self.push = (M, N, S, c[1], c[2], bias[1] if bias is not None else 0, float(alpha), float(beta))
        groups = min(max(1, ceil_div(M * N, self.WORKGROUP)), MAX_GROUPS)
        super().__init__(dev, tensors, [groups], spec=[self.WORKGROUP], push=self.push, defines=defines)

    def op(self):
        return super().op(*self.push)


class Gemm(Kernel):
    """C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C + bias[N] (glsl/gemm.comp).

    a, b, c: (tensor, element offset, leading dimension) of row-major matrices. A is stored
    [M,K] (or [K,M] with trans_a), B is stored [K,N] (or [N,K] with trans_b), C is [M,N].
    bias: None or (tensor, element offset) of [N], added to every row. beta = 0 never reads C.
    split_k = S > 1 splits K into S ranges (use it when K is large and M*N small: weight
    gradients over T*B): the main pass writes S partial products to a private workspace of
    S*M*N floats (device-only; or pass `workspace`, a float tensor of >= S*M*N, to share one
    between GEMMs), a second dispatch sums them in order into C. Deterministic either way; S
    changes the rounding (not the run-to-run result). `gemm_split_k` suggests S per device.
    vec4: read A and B as vec4s where their offsets, leading dimensions and contiguous extents are
    multiples of 4 (same results; False forces float loads, for tests and benchmarks).
    precision "fp16" (train.precision): A and B stay float32 in memory and the products take them
    rounded to float16 (to nearest even), with float32 sums and C: on tensor cores where the device
    has them (`coopmat_runs`), else gemm.comp's ROUND_HALF (the same numbers up to the order of the
    float32 sums, and no faster than "fp32").
    half: A and B hold float16 (uint32 tensors of `pack_half`; offsets and leading dimensions in
    halves), widened on load: float32 products and sums, float32 C. Needs `Device.runs_float16`.
    coopmat: the products on cooperative matrices: float16 x float16 on tensor cores, float32 sums,
    for float16 operands (half, or precision "fp16"): on workgroup-scope matrices fed by the driver
    (glsl/gemm_coopmat2.comp, tiles `coop2_tiles`) where the device has VK_NV_cooperative_matrix2
    (`coopmat2_runs`; coopmat2=False: never, True: only), else on subgroup fragments
    (glsl/gemm_coopmat.comp, tiles `coop_tiles`) where it has VK_NV_cooperative_matrix. None
    (default): with precision "fp16" wherever the device can; with half only when asked.
    `ops()` gives the dispatches to record in order; `op()` the single one when split_k == 1.
    """

    shader = "gemm"

    def __init__(self, dev: Device, a, b, c, M: int, N: int, K: int, trans_a: bool = False,
                 trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0, bias=None,
                 split_k: int = 1, tiles: GemmTiles | CoopTiles | None = None, workspace=None, vec4: bool = True,
                 half: bool = False, coopmat: bool | None = None, precision: str = "fp32",
                 coopmat2: bool | None = None):
        M, N, K, split_k = int(M), int(N), int(K), max(1, int(split_k))
        if precision not in PRECISIONS:
            raise ValueError(f"GEMM precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        rounded = precision == "fp16" and not half  # float32 operands rounded to float16
        if half and not dev.runs_float16:
            raise ValueError(f"a float16 GEMM needs float16 arithmetic and 16-bit storage, which {dev.info.name} "
                             "does not offer")
        auto = coopmat is None
        tensor_cores = coopmat_runs(dev) or coopmat2_runs(dev)
        if auto:
            coopmat = rounded and tensor_cores
        if coopmat and not ((half or rounded) and tensor_cores):
            raise ValueError(f"a cooperative-matrix GEMM needs float16 operands (half=True or precision fp16) "
                             f"and VK_NV_cooperative_matrix2, or VK_NV_cooperative_matrix with {COOP_SHAPE} "
                             f"fragments on subgroups of {COOP_SUBGROUP}; {dev.info.name} offers "
                             f"{', '.join(dev.coop_shapes) or 'none'}")
        self.M, self.N, self.K, self.trans_a = M, N, K, bool(trans_a)
        # k-range per split, a multiple of 4 so that vec4 loads along k stay whole; S shrinks if K < S
        k_split = K if split_k == 1 else 4 * ceil_div(ceil_div(K, split_k), 4)
        self.split_k = ceil_div(max(K, 1), max(k_split, 1))
        trans = (self.trans_a, bool(trans_b))
        t = tiles
        if coopmat:
            # workgroup scope by default only on float16 operands: loading float32 ones and converting them
            # ran at 94-113 TFLOP/s at v5 on the H200, against the subgroup fragments' 165-187
            use2 = coopmat2 if coopmat2 is not None else (False if not half else None)
            t = tiles if isinstance(tiles, CoopTiles | Coop2Tiles) else self._coop_tiles(dev, M, N, trans, use2)
            if coopmat2 and not isinstance(t, Coop2Tiles):
                raise ValueError(f"no cooperative-matrix-2 tile runs on {dev.info.name}")
            if t is None:
                if not auto:
                    raise ValueError(f"no cooperative-matrix tile fits {dev.info.name}'s "
                                     f"{dev.info.max_shared_memory_bytes} B of shared memory")
                coopmat = False  # precision fp16 on gemm.comp's rounding loads instead
        if not coopmat:
            if isinstance(tiles, CoopTiles | Coop2Tiles):
                raise ValueError(f"cooperative-matrix tiles {tiles} for a GEMM that does not run on them")
            t = tiles or gemm_tiles(dev, M, N, self.split_k, K, trans)
        problem = t.problem(dev, trans)
        if problem:
            raise ValueError(problem)
        self.precision, self.coopmat, self.tiles = ("fp16" if half else precision), bool(coopmat), t
        self.coopmat2 = isinstance(t, Coop2Tiles)
        spec = t.spec()
        per_word = 2 if half else 1
        _check_matrix(a[0], a[1], *((K, M) if trans_a else (M, K)), a[2], "gemm A", per_word)
        _check_matrix(b[0], b[1], *((N, K) if trans_b else (K, N)), b[2], "gemm B", per_word)
        _check_matrix(c[0], c[1], M, N, c[2], "gemm C")
        if bias is not None:
            _check_vector(bias[0], bias[1], N, "gemm bias")

        grid = [ceil_div(M, t.bm), ceil_div(N, t.bn), self.split_k]
        if max(grid) > MAX_GROUPS:
            raise ValueError(f"GEMM grid {grid} exceeds {MAX_GROUPS} workgroups per dimension")
        grid = [max(1, g) for g in grid]

        defines = {}
        if half and not coopmat:
            defines["HALF"] = 1
        if rounded:
            defines["FLOAT_IN" if coopmat else "ROUND_HALF"] = 1
        if coopmat:
            defines.update(t.defines())
        if trans_a:
            defines["TRANS_A"] = 1
        if trans_b:
            defines["TRANS_B"] = 1
        # vec4 loads where the operand's contiguous direction allows (k: also every split's start)
        vec4 = vec4 and not self.coopmat2  # its loads are the driver's
        self.vec4_a = vec4 and _vec4_ok(a, M if trans_a else K, not trans_a, k_split)
        self.vec4_b = vec4 and _vec4_ok(b, K if trans_b else N, trans_b, k_split)
        if self.vec4_a:
            defines["VEC4_A"] = 1
        if self.vec4_b:
            defines["VEC4_B"] = 1
        self.reduce = None
        if self.split_k == 1:
            if bias is not None:
                defines["HAS_BIAS"] = 1
            tensors = [a[0], b[0], c[0]] + ([bias[0]] if bias is not None else [])
            bias_off = bias[1] if bias is not None else 0
            self.push = (M, N, K, a[1], a[2], b[1], b[2], c[1], c[2], bias_off,
                         float(alpha), float(beta), k_split, 0)
        else:
            if self.split_k * M * N >= 2**32:
                raise ValueError(f"split-K workspace of {self.split_k}x{M}x{N} floats is too large")
            self.work = _workspace(dev, workspace, self.split_k * M * N, "gemm split-K")  # [S,M,N]
            tensors = [a[0], b[0], self.work]
            self.push = (M, N, K, a[1], a[2], b[1], b[2], 0, N, 0, 1.0, 0.0, k_split, M * N)
            self.reduce = _GemmSplitReduce(dev, self.work, c, M, N, self.split_k, alpha, beta, bias)
        super().__init__(dev, tensors, grid, spec=spec, push=self.push, defines=defines,
                         shader=("gemm_coopmat2" if self.coopmat2 else "gemm_coopmat") if coopmat else None)

    def _coop_tiles(self, dev: Device, M: int, N: int, trans, coopmat2: bool | None) -> CoopTiles | Coop2Tiles | None:
        """The cooperative-matrix-2 tile where the device runs it (unless coopmat2 is False), else the
        subgroup fragments' tile (unless coopmat2 is True)."""
        t = coop2_tiles(dev, M, N, self.split_k) if coopmat2 is not False and coopmat2_runs(dev) else None
        if t is None and not coopmat2 and coopmat_runs(dev):
            t = coop_tiles(dev, M, N, self.split_k, trans)
        return t

    def op(self):
        """The one dispatch (split_k == 1)."""
        if self.reduce is not None:
            raise ValueError("this Gemm is split over K: record every op of ops() in order")
        return super().op(*self.push)

    def op_at(self, row: int):
        """The dispatch with the rows of A and C moved down by `row` (same shapes): one GEMM
        algorithm serves every row block of a per-timestep sweep. Not with split-K or trans_a."""
        if self.reduce is not None or self.trans_a:
            raise ValueError("op_at needs an unsplit Gemm with A stored [M,K]")
        p = list(self.push)
        p[3], p[7] = p[3] + int(row) * p[4], p[7] + int(row) * p[8]  # offset += row * leading dimension
        return super().op(*p)

    def ops(self) -> list:
        """The dispatches to record, in order (two with split-K)."""
        main = super().op(*self.push)
        return [main] if self.reduce is None else [main, self.reduce.op()]


# ---------------------------------------------------------------------------------------------
# Column sums (bias gradients)
# ---------------------------------------------------------------------------------------------


def colsum_geometry(dev: Device) -> tuple[int, int]:
    """(columns, row lanes) per workgroup; the row lanes are a power of two (tree reduction)."""
    return (32, 8) if _is_gpu(dev) else (16, 4)


def colsum_splits(dev: Device, M: int, N: int) -> int:
    """Row splits for ColSum: the row's workgroups (~1024 on an H200, ~8 per SM) with >= 512 rows
    each on a GPU, 1 on a CPU. (H200, [65536,1536]: 1.0 ms unsplit -> 0.15 ms at 16 splits.)"""
    if not _is_gpu(dev):
        return 1
    row = tiles.gemm_row(dev.info.name, True)
    target = tiles.scaled_workgroups(row.colsum_workgroups, device_sms(dev), row.measured_cus)
    cols = ceil_div(N, colsum_geometry(dev)[0])
    return max(1, min(ceil_div(target, cols), M // 512))


class ColSum(Kernel):
    """out[N] += sum over M rows of A[M,N] (glsl/colsum.comp), rows summed in a fixed order.

    a: (tensor, element offset, leading dimension) of A [M,N]; out: (tensor, element offset) of
    [N], accumulated into. row_splits = S > 1 sums S row chunks in parallel into a workspace
    [S,N] (private, or `workspace`: a float tensor of >= S*N), then a second dispatch adds the
    S partials in order (for M ~ 65536; `colsum_splits` suggests S per device).
    `ops()` gives the dispatches in order; `op()` the single one when S == 1.
    """

    shader = "colsum"

    def __init__(self, dev: Device, a, out, M: int, N: int, row_splits: int = 1, workspace=None):
        M, N = int(M), int(N)
        self.M, self.N = M, N
        _check_matrix(a[0], a[1], M, N, a[2], "colsum A")
        _check_vector(out[0], out[1], N, "colsum out")
        wx, wy = colsum_geometry(dev)
        rows = ceil_div(max(M, 1), max(1, int(row_splits)))
        self.splits = ceil_div(max(M, 1), rows)
        cols = max(1, ceil_div(N, wx))
        if cols > MAX_GROUPS or self.splits > MAX_GROUPS:
            raise ValueError(f"colsum grid [{cols},{self.splits}] exceeds {MAX_GROUPS} workgroups")
        spec = [wx, wy]
        self.second = None
        if self.splits == 1:
            self.push = (M, N, a[1], a[2], out[1], max(M, 1), 1)
            super().__init__(dev, [a[0], out[0]], [cols, 1], spec=spec, push=self.push)
        else:
            self.work = _workspace(dev, workspace, self.splits * N, "colsum")  # [S,N]
            self.push = (M, N, a[1], a[2], 0, rows, 0)
            super().__init__(dev, [a[0], self.work], [cols, self.splits], spec=spec, push=self.push)
            self.second = _ColSumPass(dev, self.work, out, self.splits, N, spec, cols)

    def op(self):
        if self.second is not None:
            raise ValueError("this ColSum is split over rows: record every op of ops() in order")
        return super().op(*self.push)

    def ops(self) -> list:
        first = super().op(*self.push)
        return [first] if self.second is None else [first, self.second.op()]


class _ColSumPass(Kernel):
    """Second pass of a row-split ColSum: out[N] += sum over the S partial rows, in order."""

    shader = "colsum"

    def __init__(self, dev, work, out, S, N, spec, cols):
        self.push = (S, N, 0, N, out[1], S, 1)
        super().__init__(dev, [work, out[0]], [cols, 1], spec=spec, push=self.push)

    def op(self):
        return super().op(*self.push)
