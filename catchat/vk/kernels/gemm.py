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

from catchat.precision import PRECISIONS
from catchat.vk import tiles
from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div, device_sms
from catchat.vk.kernels.gemm_tiles import (  # noqa: F401  (the tile names, re-exported with the kernels)
    COOP2_FEATURES,
    COOP2_NARROW_TILE,
    COOP2_TILE,
    COOP2_TYPES,
    COOP_NARROW_TILE,
    COOP_SHAPE,
    COOP_SMALL_TILE,
    COOP_SUBGROUP,
    COOP_TILE,
    CPU_TILE,
    ENV_COOP_API,
    ENV_COOPMAT2,
    ENV_GEMM32_SPLIT,
    GPU_SMALL_TILE,
    GPU_SPLIT_K_TILE,
    GPU_TILE,
    SPLIT_GRID,
    SPLIT_SMALL_TILE,
    SPLIT_TILE,
    Coop2Tiles,
    CoopTiles,
    GemmTiles,
    _is_gpu,
    coop2_tiles,
    coop_api,
    coop_candidates,
    coop_tiles,
    coopmat2_first,
    coopmat2_runs,
    coopmat_khr_runs,
    coopmat_runs,
    gemm_candidates,
    gemm_split_k,
    gemm_tiles,
    pick_coop_tiles,
    pick_split_tiles,
    products,
    short_split_k,
    split_candidates,
    split_gemm,
    split_tiles,
    table_gemm_tiles,
)

MAX_GROUPS = 65535  # the smallest maxComputeWorkGroupCount Vulkan allows per dimension


def _check_matrix(tensor, off: int, rows: int, cols: int, ld: int, what: str, per_word: int = 1) -> None:
    """Refuse a matrix view that reaches past its buffer (kp would not tell). per_word: elements per
    32-bit word of the tensor (2 for float16 packed by `pack_half`)."""
    if off < 0 or ld < cols:
        raise ValueError(f"{what}: offset {off} / leading dimension {ld} invalid for {cols} columns")
    if rows > 0 and cols > 0 and off + (rows - 1) * ld + cols > per_word * tensor.size():
        raise ValueError(f"{what}: [{rows},{cols}] at offset {off} (ld {ld}) exceeds its buffer "
                         f"of {per_word * tensor.size()} elements")


def _split_wanted(dev: Device, split: bool | None, precision: str, half: bool, coopmat: bool | None,
                  M: int, N: int, K: int, tiles) -> bool:
    """Whether a Gemm runs as the split float32 GEMM: `split`, or where it is None `split_gemm`'s choice
    for a float32 GEMM that asked for no other kernel (nor gemm.comp's tiles: the tuner's rows); a refusal
    where split=True cannot run."""
    if split is None:
        return (precision == "fp32" and not half and coopmat is None and not isinstance(tiles, GemmTiles)
                and split_gemm(dev, M, N, K))
    if split and (half or precision != "fp32" or coopmat is False):
        raise ValueError("a split GEMM multiplies float32 operands on cooperative matrices (precision fp32, "
                         "not half, coopmat None or True)")
    if split and not (coopmat_runs(dev) or dev.runs_float16):
        raise ValueError(f"a split GEMM needs tensor cores or, emulated, float16 arithmetic; {dev.info.name} "
                         "offers neither")
    return bool(split)


def _check_vector(tensor, off: int, n: int, what: str) -> None:
    if off < 0 or off + n > tensor.size():
        raise ValueError(f"{what}: [{n}] at offset {off} exceeds its buffer of {tensor.size()} elements")


def k_ranges(K: int, split_k: int, multiple: int = 4) -> tuple[int, int]:
    """(k per range, ranges) of a GEMM split over K in at most split_k ranges: each a multiple of
    `multiple` (4: vec4 loads along k stay whole; a workgroup-scope tile's k-slice: every range takes
    its unclamped loads), fewer ranges where K is short. Not split: (K, 1)."""
    if split_k <= 1:
        return K, 1
    k_split = multiple * ceil_div(ceil_div(K, split_k), multiple)
    return k_split, ceil_div(max(K, 1), max(k_split, 1))


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
    (glsl/gemm_coopmat2.comp, tiles `coop2_tiles`; coopmat2=True, or CATCHAT_COOPMAT2=1, or where the
    device has VK_NV_cooperative_matrix2 but not the first) or on subgroup fragments
    (glsl/gemm_coopmat.comp, tiles `coop_tiles`; the default, faster on the H200) where it has
    VK_NV_cooperative_matrix. None (default): with precision "fp16" wherever the device can; with half
    only when asked.
    split: a float32 GEMM on tensor cores from float16 splits (glsl/gemm_coopmat.comp's SPLIT: each
    operand scaled by a power of two per workgroup and split as hi + 2^-11 lo, three products into two
    float32 accumulator sets: ~2^-22 per product, float32's range; emulated fragments where the device
    has float16 but no tensor cores: the tests). None (default): where `split_gemm` says (precision
    "fp32", tensor cores, a large enough product, CATCHAT_GEMM32_SPLIT).
    emulate (with coopmat and CoopTiles given, on a device without tensor cores): the subgroup-fragment
    kernel on emulated fragments (EMU), as the split GEMM runs there: its staging and epilogue in the tests.
    `ops()` gives the dispatches to record in order; `op()` the single one when split_k == 1.
    """

    shader = "gemm"

    def __init__(self, dev: Device, a, b, c, M: int, N: int, K: int, trans_a: bool = False,
                 trans_b: bool = False, alpha: float = 1.0, beta: float = 0.0, bias=None,
                 split_k: int = 1, tiles: GemmTiles | CoopTiles | None = None, workspace=None, vec4: bool = True,
                 half: bool = False, coopmat: bool | None = None, precision: str = "fp32",
                 coopmat2: bool | None = None, split: bool | None = None, emulate: bool = False):
        M, N, K, split_k = int(M), int(N), int(K), max(1, int(split_k))
        if precision not in PRECISIONS:
            raise ValueError(f"GEMM precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        rounded = precision == "fp16" and not half  # float32 operands rounded to float16
        if half and not dev.runs_float16:
            raise ValueError(f"a float16 GEMM needs float16 arithmetic and 16-bit storage, which {dev.info.name} "
                             "does not offer")
        self.split = _split_wanted(dev, split, precision, half, coopmat, M, N, K, tiles)
        auto = coopmat is None
        tensor_cores = coopmat_runs(dev) or coopmat2_runs(dev)
        if auto:
            coopmat = rounded and tensor_cores
        emulate = bool(emulate) and bool(coopmat) and not coopmat_runs(dev)  # the tests' fragments (EMU)
        if coopmat and not self.split and not ((half or rounded) and (tensor_cores or emulate)):
            raise ValueError(f"a cooperative-matrix GEMM needs float16 operands (half=True or precision fp16) "
                             f"and VK_NV_cooperative_matrix2, or VK_NV_cooperative_matrix with {COOP_SHAPE} "
                             f"fragments on subgroups of {COOP_SUBGROUP}; {dev.info.name} offers "
                             f"{', '.join(dev.coop_shapes) or 'none'}")
        self.M, self.N, self.K, self.trans_a, self.trans_b = M, N, K, bool(trans_a), bool(trans_b)
        k_split, self.split_k = k_ranges(K, split_k)
        trans = (self.trans_a, bool(trans_b))
        t, coopmat = self._pick_tiles(dev, tiles, coopmat, coopmat2, auto, trans)
        problem = t.problem(dev, trans, split=True) if self.split else t.problem(dev, trans)
        if problem:
            raise ValueError(problem)
        self.precision, self.coopmat, self.tiles = ("fp16" if half else precision), bool(coopmat), t
        self.coopmat2 = isinstance(t, Coop2Tiles)
        if self.coopmat2:  # whole k-slices per split: each takes the shader's unclamped loads
            k_split, self.split_k = k_ranges(K, split_k, t.bk)
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
        self.grid = grid = [max(1, g) for g in grid]  # workgroups of the main pass (x, y, k-range)

        defines = {}
        if half and not coopmat:
            defines["HALF"] = 1
        if rounded or self.split:
            defines["FLOAT_IN" if coopmat else "ROUND_HALF"] = 1
        if self.split:
            defines.update({"SPLIT": 1, **({} if coopmat_runs(dev) else {"EMU": 1})})
        if coopmat:
            defines.update({**t.defines(), **({"EMU": 1} if emulate else {})})
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
        # the subgroup-fragment kernel's epilogue stores quads of C as vec4 where every quad is whole and
        # aligned: N, C's offset and leading dimension (split-K: its [S,M,N] workspace) and the bias's offset
        if coopmat and not self.coopmat2 and N % 4 == 0 and (self.split_k > 1 or (
                c[1] % 4 == 0 and c[2] % 4 == 0 and (bias is None or bias[1] % 4 == 0))):
            defines["VEC4_C"] = 1
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
                         shader=("gemm_coopmat2" if self.coopmat2 else t.shader) if coopmat else None)

    def _pick_tiles(self, dev: Device, tiles, coopmat: bool, coopmat2: bool | None, auto: bool,
                    trans: tuple[bool, bool]):
        """(tiles, whether on cooperative matrices): the caller's where given, else the split GEMM's
        (`pick_split_tiles`), the tensor-core GEMM's (`pick_coop_tiles`; with coopmat auto, gemm.comp's rounding
        loads where none fits) or gemm.comp's (`gemm_tiles`)."""
        M, N, K = self.M, self.N, self.K
        if self.split:
            t = tiles if isinstance(tiles, CoopTiles) else pick_split_tiles(dev, M, N, self.split_k, trans, K)
            if t is None:
                raise ValueError(f"no split GEMM tile fits {dev.info.name}'s {dev.info.max_shared_memory_bytes} B "
                                 "of shared memory")
            return t, True
        if coopmat:
            t = (tiles if isinstance(tiles, CoopTiles | Coop2Tiles)
                 else pick_coop_tiles(dev, M, N, self.split_k, trans, coopmat2, K))
            if coopmat2 and not isinstance(t, Coop2Tiles):
                raise ValueError(f"no cooperative-matrix-2 tile runs on {dev.info.name}")
            if t is not None:
                return t, True
            if not auto:
                raise ValueError(f"no cooperative-matrix tile fits {dev.info.name}'s "
                                 f"{dev.info.max_shared_memory_bytes} B of shared memory")
            # precision fp16 on gemm.comp's rounding loads instead
        if isinstance(tiles, CoopTiles | Coop2Tiles):
            raise ValueError(f"cooperative-matrix tiles {tiles} for a GEMM that does not run on them")
        return tiles or gemm_tiles(dev, M, N, self.split_k, K, trans), False

    def unclamped_share(self) -> float | None:
        """The share of glsl/gemm_coopmat2.comp's workgroups that take its unclamped fast path (a tile
        inside [M, N], its k range whole slices, operand offsets and strides in 16-byte groups): what a
        benchmark row measured. None for the other kernels."""
        if not self.coopmat2:
            return None
        M, N, K, t = self.M, self.N, self.K, self.tiles
        k_split = self.push[12]
        if not t.unclamped or any(v % 8 for v in self.push[3:7]):
            return 0.0
        whole = sum((min(K, z * k_split + k_split) - z * k_split) % t.bk == 0 for z in range(self.split_k))
        return (M // t.bm) * (N // t.bn) * whole / (self.grid[0] * self.grid[1] * self.split_k)

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
        return self._ops(self.push)

    def _ops(self, push) -> list:
        main = super().op(*push)
        return [main] if self.reduce is None else [main, self.reduce.op()]

    def ops_k_at(self, k0: int) -> list:
        """`ops()` with the K rows of A and B moved down by k0 (A stored [K,M], B [K,N]: a weight gradient
        over the rows [k0, k0 + K) of a longer window, the layer wavefront's chunk); the buffers must
        hold those rows (the constructor checked rows [0, K))."""
        if not self.trans_a or self.trans_b:
            raise ValueError("ops_k_at needs A stored [K,M] (trans_a) and B stored [K,N]")
        p = list(self.push)
        p[3], p[5] = p[3] + int(k0) * p[4], p[5] + int(k0) * p[6]  # offset += k0 * leading dimension
        return self._ops(p)


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
        return self.ops_at(0)

    def ops_at(self, row0: int) -> list:
        """`ops()` with A's rows moved down by row0: the sums over rows [row0, row0 + M) of a longer
        matrix (the layer wavefront's bias gradients, chunk by chunk), added into out."""
        p = list(self.push)
        p[2] += int(row0) * p[3]
        first = super().op(*p)
        return [first] if self.second is None else [first, self.second.op()]


class _ColSumPass(Kernel):
    """Second pass of a row-split ColSum: out[N] += sum over the S partial rows, in order."""

    shader = "colsum"

    def __init__(self, dev, work, out, S, N, spec, cols):
        self.push = (S, N, 0, N, out[1], S, 1)
        super().__init__(dev, [work, out[0]], [cols, 1], spec=spec, push=self.push)

    def op(self):
        return super().op(*self.push)
