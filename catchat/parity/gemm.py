"""Matrix multiply and column sums (glsl/gemm.comp, glsl/colsum.comp) against float64 numpy: every
transpose variant, odd sizes and offsets, split-K, the GPU's tiles, vec4 loads, row-split sums."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from catchat.parity import ParityResult, compare
from catchat.vk.device import Device
from catchat.vk.kernels import ceil_div, half_tensor, run_ops
from catchat.vk.kernels import gemm as kg
from catchat.vk.kernels.gemm import GPU_SMALL_TILE, GPU_SPLIT_K_TILE, GPU_TILE, ColSum, Gemm, coopmat_runs


def gemm_reference(a, b, c, trans_a, trans_b, alpha, beta, bias=None) -> np.ndarray:
    """numpy twin in float64: alpha * op(a) @ op(b) + beta * c (+ bias); a, b, c 2-D arrays."""
    A = a.T if trans_a else a
    B = b.T if trans_b else b
    out = alpha * (A.astype(np.float64) @ B.astype(np.float64))
    if beta != 0.0:
        out += beta * c.astype(np.float64)
    if bias is not None:
        out += bias.astype(np.float64)
    return out


GEMM_SIZES = ((1, 1, 1), (7, 13, 5), (65, 33, 129), (128, 96, 64))
# Relative to max |C|: float32 accumulation over K terms. The tensor cores' GEMM (its own order of
# a fragment's 16 products) measured the same on the H200 (2026-12-02): worst 1.5e-5 absolute at
# max |C| = 50, i.e. 3e-7 of the scale, like gemm.comp's float16-operand rows.
GEMM_RTOL = 1e-5


def _embed(rng, rows: int, cols: int, ld: int, off: int, extra: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """A random [rows, cols] matrix at `off` with leading dimension ld inside a bigger buffer
    filled with sentinels; returns (buffer, the matrix)."""
    buf = np.full(off + rows * ld + extra, 777.0, np.float32)
    mat = rng.standard_normal((rows, cols)).astype(np.float32)
    view = buf[off:off + rows * ld].reshape(rows, ld)
    view[:, :cols] = mat
    return buf, mat


def gemm_case(dev: Device, rng, M, N, K, trans_a, trans_b, beta, with_bias, split_k=1,
              alpha=1.0, tiles=None, vec4=False, half=False, coopmat=False, precision="fp32",
              coopmat2=None, aligned=False, split=False, a_scale=None, c_vec4=False,
              emulate=False) -> ParityResult:
    """One GEMM against float64 numpy, operands at offsets with padded leading dimensions (odd
    ones; with vec4, multiples of 4 so that the kernel reads A and B as vec4s where their
    contiguous extents allow; aligned, multiples of 8: 16-byte groups of halves, which
    glsl/gemm_coopmat2.comp's unclamped fast path needs); also checks that nothing outside C's
    [M,N] window changed.
    half: A and B in float16 (the twin multiplies the same float16 values exactly); precision
    "fp16": float32 A and B that the kernel rounds to float16 (the twin rounds them the same way,
    to nearest even); coopmat: on cooperative matrices (coopmat2 False: glsl/gemm_coopmat.comp's
    subgroup fragments; True: glsl/gemm_coopmat2.comp's workgroup-scope matrices).
    split: float32 operands on tensor cores from float16 splits (`Gemm(split=True)`; emulated fragments
    where the device has no tensor cores); a_scale: A's column k (along K) times a_scale[k], a [K] array
    (operands far outside float16's range, or magnitudes that change from one k-slice to the next).
    c_vec4: C and the bias at offsets and C's leading dimension in multiples of 4 (the tensor-core
    kernel's 16-byte epilogue stores where N is one too); emulate: `Gemm(emulate=True)`."""
    ar, ac = (K, M) if trans_a else (M, K)
    br, bc = (N, K) if trans_b else (K, N)
    q = 8 if aligned else 4 if vec4 else 0  # the leading dimensions' multiple (0: odd ones)
    pad = (lambda n, p: n + p) if not q else (lambda n, p: q * ceil_div(n, q) + q)  # noqa: E731
    a_off, b_off = (8, 16) if q else (5, 17)
    a_buf, a = _embed(rng, ar, ac, pad(ac, 3), a_off)
    if a_scale is not None:  # A's view inside its buffer, scaled along K
        view = a_buf[a_off:a_off + ar * pad(ac, 3)].reshape(ar, pad(ac, 3))[:, :ac]
        view *= (a_scale[:, None] if trans_a else a_scale[None, :]).astype(np.float32)
        a = view.copy()
    b_buf, b = _embed(rng, br, bc, pad(bc, 1), b_off)
    c_off, ldc, bias_off = (12, 4 * ceil_div(N, 4) + 4, 12) if c_vec4 else (9, N + 2, 11)
    c_buf, c = _embed(rng, M, N, ldc, c_off)
    bias_buf = np.full(N + 20, 555.0, np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    if a_scale is not None:  # a bias of the products' size, not one that hides them
        bias *= np.float32(a_scale.max())
    bias_buf[bias_off:bias_off + N] = bias
    if half:
        a_buf, b_buf, a, b = (x.astype(np.float16) for x in (a_buf, b_buf, a, b))
        ta, tb = half_tensor(dev, a_buf), half_tensor(dev, b_buf)
    else:
        ta, tb = dev.tensor(a_buf), dev.tensor(b_buf)
    if precision == "fp16":  # the values the products see
        a, b = a.astype(np.float16), b.astype(np.float16)
    tc, tbias = dev.tensor(c_buf), dev.tensor(bias_buf)
    g = Gemm(dev, (ta, a_off, pad(ac, 3)), (tb, b_off, pad(bc, 1)), (tc, c_off, ldc), M, N, K, trans_a, trans_b,
             alpha=alpha, beta=beta, bias=(tbias, bias_off) if with_bias else None, split_k=split_k, tiles=tiles,
             vec4=vec4, half=half, coopmat=None if split else coopmat, precision=precision, coopmat2=coopmat2,
             split=split, emulate=emulate)
    (got,) = run_ops(dev, [ta, tb, tc, tbias], g.ops(), [tc])
    exp_buf = c_buf.astype(np.float64)
    exp = gemm_reference(a, b, c, trans_a, trans_b, alpha, beta, bias if with_bias else None)
    exp_buf[c_off:c_off + M * ldc].reshape(M, ldc)[:, :N] = exp
    scale = float(np.abs(exp).max()) if exp.size else 1.0
    rounded = precision == "fp16" and not half
    khr = getattr(g.tiles, "api", "nv") == "khr"
    emu = "_emu" * (not coopmat_runs(dev))
    kernel = "_split" + emu if g.split else "_coopmat" * g.coopmat + "2" * g.coopmat2 + emu * (g.coopmat and emulate)
    name = ("gemm" + "_f16" * half + "_rf16" * rounded + kernel + "_khr" * khr
            + "_tA" * trans_a + "_tB" * trans_b + "+bias" * with_bias)
    shape = f"{M}x{N}x{K} alpha={alpha:g} beta={beta:g}" + (f" splitK={g.split_k}" if g.split_k > 1 else "")
    if a_scale is not None:
        shape += f" A scaled {a_scale.min():.0e}..{a_scale.max():.0e} along K"
    if tiles is not None or g.coopmat2:
        t = g.tiles
        shape += f" tiles={t.bm}x{t.bn}" + (f"/{t.tm}x{t.tn}" if hasattr(t, "tm") else f" bk {t.bk}") + (
            f" stages {t.stages}" if hasattr(t, "stages") else "") + (f" threads {t.threads}" if g.coopmat2 else "")
    if g.vec4_a or g.vec4_b:
        shape += " vec4" + ("A" if g.vec4_a else "") + ("B" if g.vec4_b else "")
    if "VEC4_C" in g.defines:
        shape += " vec4C"
    # scaled operands: errors against the output's own scale however small (elsewhere at least 1)
    atol = GEMM_RTOL * (scale if a_scale is not None else max(scale, 1.0))
    return compare(name, shape, got, exp_buf, atol, GEMM_RTOL)


def _float16_cases(dev: Device, rng, half: bool) -> list[ParityResult]:
    """Float16 operands on gemm.comp: stored as float16 (half: HALF, half-word offsets, f16vec4
    loads) or float32 rounded as they are staged (train.precision "fp16": ROUND_HALF on every
    device); every transpose at odd sizes and offsets, float and vec4 loads, split-K (half: also the
    GPU's tiles); then the same operands on the tensor cores where the device has them."""
    kw = dict(half=True) if half else dict(coopmat=False, precision="fp16")
    out = []
    for ta in (False, True):
        for tb in (False, True):
            out.append(gemm_case(dev, rng, 65, 33, 129, ta, tb, 1.0, True, **kw))
            out.append(gemm_case(dev, rng, 68, 36, 132, ta, tb, 0.0, False, vec4=True, **kw))
    out.append(gemm_case(dev, rng, 36, 28, 302, True, False, 1.0, False, split_k=5, vec4=True, **kw))
    if half:
        out.append(gemm_case(dev, rng, 130, 67, 41, False, True, 1.0, True, tiles=GPU_TILE, **kw))
    if coopmat_runs(dev):
        out += _coopmat_cases(dev, rng, half=half) + _coop_pipeline_cases(dev, rng, half=half)
    elif not half and dev.runs_float16:
        out += _coop_emu_cases(dev, rng)
    if kg.coopmat_khr_runs(dev):
        out += _coopmat_khr_cases(dev, rng, half=half)
    if kg.coopmat2_first(dev):  # only where the program runs it (its pipelines take the NVIDIA driver ~1 min)
        out += _coopmat2_cases(dev, rng, half=half)
    return out


def _coopmat_khr_cases(dev: Device, rng, half: bool) -> list[ParityResult]:
    """The subgroup-fragment kernel on VK_KHR_cooperative_matrix (glsl/gemm_coopmat_khr.comp, the same
    source as gemm_coopmat.comp): every transpose at odd sizes, vec4 loads, one and two shared
    buffers, bias, beta, split-K."""
    kw = dict(coopmat=True, coopmat2=False, half=half, precision="fp16")
    khr = [replace(t, api="khr") for t in (kg.COOP_TILE, kg.COOP_SMALL_TILE, kg.CoopTiles(2, 2, 4, 4, 32))]
    out = []
    for ta in (False, True):
        for tb in (False, True):
            out.append(gemm_case(dev, rng, 65, 33, 129, ta, tb, 1.0, True, tiles=khr[1], **kw))
            out.append(gemm_case(dev, rng, 132, 260, 68, ta, tb, 0.0, False, vec4=True, tiles=khr[0], **kw))
    out.append(gemm_case(dev, rng, 130, 67, 41, False, True, 1.0, True, tiles=khr[2], **kw))
    out.append(gemm_case(dev, rng, 36, 28, 302, True, False, 1.0, False, split_k=5, vec4=True, tiles=khr[0], **kw))
    return out


def _coop_pipeline_cases(dev: Device, rng, half: bool) -> list[ParityResult]:
    """The tensor-core kernel's pipelines on the device's extension: two buffers (a loop of two slices
    an iteration), 16-deep slices; odd and even slice counts, a k tail inside a slice, every transpose,
    bias, beta, split-K."""
    kw = dict(coopmat=True, coopmat2=False, half=half, precision="fp16")
    api = kg.coop_api(dev)
    tiles = [replace(t, api=api) for t in (kg.CoopTiles(2, 2, 4, 4, 32, 2), kg.CoopTiles(2, 4, 4, 4, 16, 2),
                                           kg.CoopTiles(4, 2, 2, 4, 32, 2))]
    out = []
    for t in tiles:
        if t.problem(dev, (False, False)) is not None:
            continue
        for ta in (False, True):
            for tb in (False, True):
                out.append(gemm_case(dev, rng, 132, 260, 68, ta, tb, 0.0, False, vec4=True, tiles=t, **kw))
        out.append(gemm_case(dev, rng, 130, 67, 41, False, True, 1.0, True, tiles=t, **kw))
        out.append(gemm_case(dev, rng, 65, 33, 96, False, False, 1.0, True, tiles=t, **kw))
        out.append(gemm_case(dev, rng, 70, 140, 128, True, True, 1.0, False, alpha=-0.5, vec4=True, tiles=t, **kw))
        out.append(gemm_case(dev, rng, 36, 28, 302, True, False, 0.0, False, split_k=5, vec4=True, tiles=t, **kw))
    return out


def _coopmat2_cases(dev: Device, rng, half: bool) -> list[ParityResult]:
    """Workgroup-scope matrices (glsl/gemm_coopmat2.comp): sizes around the tiles and k-slices, every
    transpose with odd offsets and leading dimensions, alpha and beta, bias, both tiles, split-K."""
    kw = dict(coopmat=True, coopmat2=True, half=half, precision="fp16")
    out = []
    for M, N, K in ((1, 1, 1), (65, 33, 129), (130, 260, 70)):
        for ta in (False, True):
            for tb in (False, True):
                out.append(gemm_case(dev, rng, M, N, K, ta, tb, 1.0, True, **kw))
    for t in (kg.COOP2_TILE, kg.COOP2_NARROW_TILE):
        if t.problem(dev) is None:
            for ta in (False, True):
                out.append(gemm_case(dev, rng, 300, 270, 100, ta, not ta, 0.0, False, tiles=t, **kw))
            out.append(gemm_case(dev, rng, 129, 101, 64, False, True, 1.0, True, alpha=-0.5, tiles=t, **kw))
    out.append(gemm_case(dev, rng, 36, 28, 302, True, False, 1.0, False, split_k=5, **kw))
    out.append(gemm_case(dev, rng, 140, 260, 1000, True, False, 0.0, False, split_k=3, **kw))
    # Aligned operands: the grid's inner tiles take the unclamped, unrolled loop (10 k-slices: one
    # unrolled pass of 8, then 2), its last row and column of tiles the clamped one; split-K in whole
    # k-slices, so every split takes the fast path.
    for t in (kg.COOP2_TILE, kg.COOP2_NARROW_TILE, kg.Coop2Tiles(128, 128, 64)):
        if t.problem(dev) is None:
            for ta in (False, True):
                for tb in (False, True):
                    out.append(gemm_case(dev, rng, 2 * t.bm + 44, 2 * t.bn + 8, 10 * t.bk, ta, tb, 1.0, True,
                                         tiles=t, aligned=True, **kw))
            out.append(gemm_case(dev, rng, 2 * t.bm, t.bn, 24 * t.bk, True, False, 0.0, False, split_k=3,
                                 alpha=0.5, tiles=t, aligned=True, **kw))
    return out


def _coopmat_cases(dev: Device, rng, half: bool) -> list[ParityResult]:
    """Tensor cores (float16 operands, or float32 ones rounded): sizes around both tiles and 16-deep
    k, every transpose with float and vec4 loads, both tiles forced, split-K."""
    kw = dict(coopmat=True, coopmat2=False, half=half, precision="fp16")
    out = []
    for M, N, K in ((1, 1, 1), (65, 33, 129), (128, 192, 64)):
        for ta in (False, True):
            for tb in (False, True):
                out.append(gemm_case(dev, rng, M, N, K, ta, tb, 1.0, True, **kw))
    for ta in (False, True):
        for tb in (False, True):
            out.append(gemm_case(dev, rng, 132, 260, 68, ta, tb, 0.0, False, vec4=True, tiles=kg.COOP_TILE, **kw))
    out.append(gemm_case(dev, rng, 130, 67, 41, False, True, 1.0, True, tiles=kg.COOP_SMALL_TILE, **kw))
    out.append(gemm_case(dev, rng, 36, 28, 302, True, False, 0.0, False, split_k=5, vec4=True, **kw))
    # C and the bias aligned (16-byte epilogue stores, as the program's input projections and gradients)
    for ta in (False, True):
        for tb in (False, True):
            out.append(gemm_case(dev, rng, 132, 260, 68, ta, tb, 1.0, True, vec4=True, c_vec4=True,
                                 tiles=kg.COOP_TILE, **kw))
    out.append(gemm_case(dev, rng, 130, 68, 41, False, True, 1.0, True, c_vec4=True, tiles=kg.COOP_SMALL_TILE, **kw))
    # the narrow-output tile and a 64-deep slice (one shared buffer, two barriers per slice): odd and
    # even slice counts, a k tail inside a slice (K = 41, 68, 96, 302 with split-K)
    for single in (kg.COOP_NARROW_TILE, kg.CoopTiles(2, 2, 4, 4, 64, 1)):
        for ta in (False, True):
            for tb in (False, True):
                out.append(gemm_case(dev, rng, 132, 260, 68, ta, tb, 0.0, False, vec4=True, tiles=single, **kw))
        out.append(gemm_case(dev, rng, 130, 67, 41, False, True, 1.0, True, tiles=single, **kw))
        out.append(gemm_case(dev, rng, 65, 33, 96, False, False, 1.0, True, tiles=single, **kw))
        out.append(gemm_case(dev, rng, 36, 28, 302, True, False, 0.0, False, split_k=5, vec4=True, tiles=single, **kw))
    return out


def _coop_emu_cases(dev: Device, rng) -> list[ParityResult]:
    """The tensor-core kernel on emulated fragments (`Gemm(emulate=True)`: a device without tensor cores, the
    tests) with float32 operands rounded as staged: its staging and epilogue (a row of fragments through the
    scratch, quads of C with and without the 16-byte stores) at odd sizes and offsets, every transpose with
    bias and beta, one and two shared buffers, split-K."""
    kw = dict(coopmat=True, coopmat2=False, precision="fp16", emulate=True)
    out = []
    for t in (kg.COOP_SMALL_TILE, kg.CoopTiles(2, 2, 2, 2, 32, 1)):
        out.append(gemm_case(dev, rng, 65, 33, 41, False, True, 1.0, True, tiles=t, **kw))
        out.append(gemm_case(dev, rng, 70, 68, 40, True, False, 1.0, True, vec4=True, c_vec4=True, tiles=t, **kw))
    for ta, tb in ((False, False), (True, True)):
        out.append(gemm_case(dev, rng, 33, 36, 50, ta, tb, 0.0, True, c_vec4=True, tiles=kg.COOP_SMALL_TILE, **kw))
    out.append(gemm_case(dev, rng, 36, 28, 302, True, False, 1.0, False, split_k=5, vec4=True,
                         tiles=kg.COOP_SMALL_TILE, **kw))
    return out


def _split_cases(dev: Device, rng) -> list[ParityResult]:
    """The float32 GEMM from float16 splits (glsl/gemm_coopmat.comp's SPLIT, emulated fragments where there
    are no tensor cores): every transpose at odd sizes with float and vec4 loads, both tiles where they
    fit, bias, alpha, beta, split-K; operands at 1e-30 and 1e30 (outside float16's range: the
    per-workgroup scales), and A's magnitude jumping by 2^60 after the first 16-deep slice and falling
    by 2^60 after it (the scales lowered mid-loop, the accumulators rescaled, the slice split again)."""
    kw = dict(split=True)
    out = []  # six shader variants (every transpose with bias, two with vec4 loads): ~1 min to compile on lavapipe
    for M, N, K in ((1, 1, 1), (65, 33, 129)):
        for ta in (False, True):
            for tb in (False, True):
                out.append(gemm_case(dev, rng, M, N, K, ta, tb, 1.0, True, **kw))
    for ta in (False, True):
        out.append(gemm_case(dev, rng, 68, 36, 132, ta, ta, 0.0, False, vec4=True, **kw))
    for t in (kg.SPLIT_TILE, kg.SPLIT_SMALL_TILE):
        t = replace(t, api=kg.coop_api(dev))
        if t.problem(dev, (False, True), split=True) is None:
            out.append(gemm_case(dev, rng, 130, 140, 70, False, True, 1.0, True, alpha=-0.5, tiles=t, **kw))
            out.append(gemm_case(dev, rng, 130, 140, 70, True, False, 1.0, True, c_vec4=True, tiles=t, **kw))
    out.append(gemm_case(dev, rng, 36, 28, 302, True, True, 1.0, False, split_k=5, vec4=True, **kw))
    k = np.arange(100)
    for scale in (np.full(100, 1e-30), np.full(100, 1e30), np.where(k < 16, 2.0**-30, 2.0**30),
                  np.where(k < 16, 2.0**30, 2.0**-30)):
        for ta in (False, True):
            out.append(gemm_case(dev, rng, 40, 24, 100, ta, ta, 0.0, True, a_scale=scale, **kw))
    return out


def colsum_case(dev: Device, rng, M, N, row_splits=1) -> ParityResult:
    a_buf, a = _embed(rng, M, N, N + 3, 7)
    out = np.full(N + 9, 3.0, np.float32)
    ta, to = dev.tensor(a_buf), dev.tensor(out)
    k = ColSum(dev, (ta, 7, N + 3), (to, 4), M, N, row_splits=row_splits)
    (got,) = run_ops(dev, [ta, to], k.ops(), [to])
    exp = out.astype(np.float64)
    exp[4:4 + N] += a.astype(np.float64).sum(0)
    return compare("colsum", f"{M}x{N} splits={k.splits}", got, exp, 1e-5 * max(1.0, np.sqrt(M)), 1e-5)


def parity_checks(dev: Device) -> list[ParityResult]:
    """Every transpose variant at sizes that do and do not divide the tiles, with and without
    bias, beta 0 and 1, nonzero offsets; split-K; column sums with and without row splits."""
    rng = np.random.default_rng(0)
    out = []
    for M, N, K in GEMM_SIZES:
        for ta in (False, True):
            for tb in (False, True):
                for beta, bias in ((0.0, False), (1.0, True)):
                    out.append(gemm_case(dev, rng, M, N, K, ta, tb, beta, bias))
    out.append(gemm_case(dev, rng, 65, 33, 129, False, True, 0.0, True, alpha=-0.5))
    out.append(gemm_case(dev, rng, 37, 29, 300, True, False, 1.0, False, split_k=4))
    out.append(gemm_case(dev, rng, 7, 13, 40, True, False, 1.0, True, split_k=3))
    # a forward of a few rows split over K (generation's batched step: `short_split_k`): A [M,K], B^T, bias
    out.append(gemm_case(dev, rng, 20, 101, 1030, False, True, 0.0, True, split_k=4, vec4=True))
    for tiles in (GPU_TILE, GPU_SPLIT_K_TILE, GPU_SMALL_TILE):
        out.append(gemm_case(dev, rng, 130, 67, 41, False, True, 1.0, True, tiles=tiles))
    # vec4 loads: every transpose variant with one operand or both aligned (N = 67 leaves
    # non-transposed B on floats), the GPU's tiles, split-K ranges that start on a vec4
    for M, N, K in ((68, 36, 132), (132, 67, 44)):
        for ta in (False, True):
            for tb in (False, True):
                out.append(gemm_case(dev, rng, M, N, K, ta, tb, 1.0, True, vec4=True))
    out.append(gemm_case(dev, rng, 132, 132, 36, False, True, 0.0, False, tiles=GPU_TILE, vec4=True))
    out.append(gemm_case(dev, rng, 36, 28, 302, True, False, 1.0, False, split_k=5, vec4=True))
    out.append(gemm_case(dev, rng, 132, 68, 302, True, False, 1.0, True, split_k=3, tiles=GPU_SPLIT_K_TILE,
                         vec4=True))
    if dev.runs_float16:
        out += _float16_cases(dev, rng, half=True)
    out += _float16_cases(dev, rng, half=False)
    if coopmat_runs(dev) or dev.runs_float16:
        out += _split_cases(dev, rng)
    for M, N, splits in ((1, 1, 1), (7, 13, 1), (300, 37, 1), (300, 37, 7), (1000, 5, 16)):
        out.append(colsum_case(dev, rng, M, N, splits))
    return out
