"""GEMM and column sums (glsl/gemm.comp, glsl/colsum.comp) against numpy."""

import dataclasses
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from catchat.model import ModelSpec, ParamLayout, init_params
from catchat.parity import compare
from catchat.parity.gemm import gemm_case, parity_checks
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.gemm import (
    GPU_SMALL_TILE,
    GPU_SPLIT_K_TILE,
    GPU_TILE,
    SPLIT_SMALL_TILE,
    SPLIT_TILE,
    ColSum,
    Gemm,
    coop_api,
    coopmat_runs,
)


def test_parity(dev):
    results = parity_checks(dev)
    # the cases counted per kernel: a case list that came out empty or short would pass all() alone
    expected = Counter({"gemm": 4, "gemm+bias": 6, "gemm_tB": 5, "gemm_tB+bias": 11, "gemm_tA": 6, "gemm_tA+bias": 8,
                        "gemm_tA_tB": 4, "gemm_tA_tB+bias": 6, "colsum": 5,
                        # float16 operands (lavapipe has 16-bit storage)
                        "gemm_f16+bias": 1, "gemm_f16": 1, "gemm_f16_tB+bias": 2, "gemm_f16_tB": 1,
                        "gemm_f16_tA+bias": 1, "gemm_f16_tA": 2, "gemm_f16_tA_tB+bias": 1, "gemm_f16_tA_tB": 1,
                        # float32 operands rounded to float16 (train.precision fp16), on every device
                        "gemm_rf16+bias": 1, "gemm_rf16": 1, "gemm_rf16_tB+bias": 1, "gemm_rf16_tB": 1,
                        "gemm_rf16_tA+bias": 1, "gemm_rf16_tA": 2, "gemm_rf16_tA_tB+bias": 1, "gemm_rf16_tA_tB": 1})
    if coopmat_runs(dev):  # tensor cores, for stored and for rounded float16 operands
        for p in ("gemm_f16_coopmat", "gemm_rf16_coopmat"):
            expected.update({p + "+bias": 5, p + "_tB+bias": 7, p + "_tA+bias": 4, p + "_tA_tB+bias": 4,
                             p: 2, p + "_tB": 2, p + "_tA": 4, p + "_tA_tB": 2})
    elif dev.runs_float16:  # the tensor-core kernel on emulated fragments, rounded float32 operands
        p = "gemm_rf16_coopmat_emu"
        expected.update({p + "_tB+bias": 2, p + "_tA+bias": 2, p + "+bias": 1, p + "_tA_tB+bias": 1, p + "_tA": 1})
    # the float32 GEMM from float16 splits: tensor cores, or emulated fragments (lavapipe)
    split = "gemm_split" + ("" if coopmat_runs(dev) else "_emu")
    tiles = sum(replace(t, api=coop_api(dev)).problem(dev, (False, True), split=True) is None
                for t in (SPLIT_TILE, SPLIT_SMALL_TILE))
    expected.update({split + "+bias": 6, split + "_tB+bias": 2 + tiles, split + "_tA+bias": 2 + tiles,
                     split + "_tA_tB+bias": 6, split: 1, split + "_tA_tB": 2})
    assert Counter(r.kernel for r in results) == expected
    assert all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def test_float16_gemm_needs_16_bit_storage_and_counts_halves(dev, rng):
    """half=True on a device without 16-bit storage is refused; a float16 operand's extent is
    checked in halves (two per word of the packed tensor)."""
    from catchat.vk.device import Device
    from catchat.vk.kernels import half_tensor

    words = half_tensor(dev, np.ones(12))  # 12 halves in 6 words
    c = dev.tensor(np.zeros(16, np.float32))
    Gemm(dev, (words, 0, 3), (words, 0, 4), (c, 0, 4), 4, 4, 3, half=True)  # A [4,3], B [3,4]: 12 halves
    with pytest.raises(ValueError, match="exceeds its buffer of 12 elements"):
        Gemm(dev, (words, 0, 4), (words, 0, 4), (c, 0, 4), 4, 4, 4, half=True)
    plain = Device(info=dev.info, manager=dev.manager, kp=dev.kp, features=frozenset())
    with pytest.raises(ValueError, match="16-bit storage"):
        Gemm(plain, (words, 0, 3), (words, 0, 4), (c, 0, 4), 4, 4, 3, half=True)
    no_coop = dataclasses.replace(dev, features=dev.features - {"cooperativeMatrixNV"}, coop_shapes=())
    with pytest.raises(ValueError, match="VK_NV_cooperative_matrix with 16x16x16"):
        Gemm(no_coop, (words, 0, 3), (words, 0, 4), (c, 0, 4), 4, 4, 3, half=True, coopmat=True)


def test_fp16_precision_picks_tensor_cores_only_where_the_device_has_them(dev):
    """precision "fp16" runs on cooperative matrices where the device offers them and on gemm.comp's
    rounding loads elsewhere; a device without them refuses coopmat=True; unknown precisions are refused."""
    from catchat.vk.device import Device

    a, c = dev.tensor(np.ones(16, np.float32)), dev.tensor(np.zeros(16, np.float32))
    g = Gemm(dev, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, precision="fp16")
    assert g.precision == "fp16" and g.coopmat == coopmat_runs(dev)
    plain = Device(info=dev.info, manager=dev.manager, kp=dev.kp, features=frozenset())
    assert not Gemm(plain, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, precision="fp16").coopmat
    with pytest.raises(ValueError, match="cooperative-matrix GEMM needs"):
        Gemm(plain, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, precision="fp16", coopmat=True)
    with pytest.raises(ValueError, match="GEMM precision 'bf16'"):
        Gemm(dev, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, precision="bf16")
    # tensor cores but too little shared memory for any tile: fp16 falls back to the rounding loads
    from catchat.vk.kernels.gemm import COOP_SHAPE, COOP_SMALL_TILE
    shared = COOP_SMALL_TILE.shared_bytes() - 4  # the smallest tensor-core tile does not fit; gemm.comp's do
    info = dataclasses.replace(dev.info, max_shared_memory_bytes=shared, subgroup_size=32)
    small = dataclasses.replace(dev, info=info, features=dev.features | {"cooperativeMatrixNV"},
                                coop_shapes=(COOP_SHAPE,))
    assert coopmat_runs(small)
    assert not Gemm(small, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, precision="fp16").coopmat
    with pytest.raises(ValueError, match="no cooperative-matrix tile fits"):
        Gemm(small, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, precision="fp16", coopmat=True)


def test_model_shapes_in_flat_buffers(dev, rng):
    """The model's uses with operands inside one flat params / grads buffer (same tensor bound
    to several bindings): G = X W_ih^T + b_ih, dW_ih += dG^T X (split-K), dX = dG W_ih,
    db_ih += colsum(dG)."""
    spec = ModelSpec(vocab_size=11, hidden=9, layers=2)
    layout = ParamLayout(spec)
    flat = layout.flatten(init_params(spec, 3))
    H, n = spec.hidden, 70  # n = T*B rows
    w, b = "layers.1.gru.weight_ih", "layers.1.gru.bias_ih"
    W, bias = layout.view(flat, w), layout.view(flat, b)
    X = rng.standard_normal((n, H)).astype(np.float32)
    dG = rng.standard_normal((n, 3 * H)).astype(np.float32)
    g0 = rng.standard_normal(layout.total).astype(np.float32)
    t_p, t_g, t_x, t_dg = dev.tensor(flat), dev.tensor(g0), dev.tensor(X), dev.tensor(dG)
    t_G, t_dx = dev.tensor(np.zeros((n, 3 * H), np.float32)), dev.tensor(np.zeros((n, H), np.float32))
    ow, ob = layout.offsets[w], layout.offsets[b]
    proj = Gemm(dev, (t_x, 0, H), (t_p, ow, H), (t_G, 0, 3 * H), n, 3 * H, H, trans_b=True,
                bias=(t_p, ob))
    dw = Gemm(dev, (t_dg, 0, 3 * H), (t_x, 0, H), (t_g, ow, H), 3 * H, H, n, trans_a=True,
              beta=1.0, split_k=4)
    dx = Gemm(dev, (t_dg, 0, 3 * H), (t_p, ow, H), (t_dx, 0, H), n, H, 3 * H)
    db = ColSum(dev, (t_dg, 0, 3 * H), (t_g, ob), n, 3 * H)
    assert dw.split_k == 4
    G, g, dX = run_ops(dev, [t_p, t_g, t_x, t_dg], [proj.op(), *dw.ops(), dx.op(), db.op()],
                       [t_G, t_g, t_dx])
    G, dX = G.reshape(n, 3 * H), dX.reshape(n, H)
    exp_g = g0.astype(np.float64)
    layout.view(exp_g, w)[...] += dG.T.astype(np.float64) @ X
    layout.view(exp_g, b)[...] += dG.astype(np.float64).sum(0)
    for name, got, exp in (("proj", G, X.astype(np.float64) @ W.T + bias),
                           ("grads", g, exp_g), ("dx", dX, dG.astype(np.float64) @ W)):
        r = compare(name, "", got, exp, 1e-5 * np.abs(exp).max(), 1e-5)
        assert r.ok, str(r)


def test_split_k_is_deterministic_and_close_to_unsplit(dev, rng):
    M, N, K = 12, 5, 3000  # weight-gradient shape: K = T*B
    a = rng.standard_normal((K, M)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    ta, tb = dev.tensor(a), dev.tensor(b)
    outs = []
    for split in (1, 7, 7):
        tc = dev.tensor(np.ones((M, N), np.float32))
        g = Gemm(dev, (ta, 0, M), (tb, 0, N), (tc, 0, N), M, N, K, trans_a=True, beta=1.0, split_k=split)
        (c,) = run_ops(dev, [ta, tb, tc], g.ops(), [tc])
        outs.append(c.reshape(M, N))
    assert np.array_equal(outs[1], outs[2])
    exp = a.T.astype(np.float64) @ b + 1.0
    for c in outs[:2]:
        assert np.abs(c - exp).max() <= 1e-5 * np.abs(exp).max()


def test_beta_zero_never_reads_c(dev, rng):
    a, b = rng.standard_normal((9, 4)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)
    ta, tb, tc = dev.tensor(a), dev.tensor(b), dev.tensor(np.full((9, 6), np.nan, np.float32))
    (c,) = run_ops(dev, [ta, tb, tc], [Gemm(dev, (ta, 0, 4), (tb, 0, 6), (tc, 0, 6), 9, 6, 4).op()], [tc])
    assert np.allclose(c.reshape(9, 6), a @ b, rtol=1e-5, atol=1e-5)


def test_gpu_tiles_at_odd_sizes(dev, rng):
    """The H200's tile shapes give the same answers here."""
    for tiles in (GPU_TILE, GPU_SPLIT_K_TILE, GPU_SMALL_TILE):
        for ta, tb in ((False, False), (True, True)):
            r = gemm_case(dev, rng, 129, 131, 17, ta, tb, 1.0, True, tiles=tiles)
            assert r.ok, str(r)


def _gemm_out(dev, a, b, M, N, K, trans_a, trans_b, tiles):
    ta, tb, tc = dev.tensor(a), dev.tensor(b), dev.tensor(np.zeros(M * N, np.float32))
    g = Gemm(dev, (ta, 0, M if trans_a else K), (tb, 0, K if trans_b else N), (tc, 0, N), M, N, K,
             trans_a, trans_b, beta=0.0, tiles=tiles, vec4=True)
    (got,) = run_ops(dev, [ta, tb, tc], g.ops(), [tc])
    return got


@pytest.mark.parametrize("wx", [4, 8, 16])
def test_subgroup_layouts_give_the_same_bits(dev, rng, wx):
    """Tiles with wx (a subgroup covering wx x 32 / wx threads of the tile) change which thread owns
    which outputs, never a sum's order: the same bits as the row layout, at odd sizes and transposes."""
    tiles = dataclasses.replace(GPU_TILE, wx=wx)
    assert tiles.problem(dev) is None and tuple(tiles)[-1] == wx
    M, N, K = 132, 136, 36
    for ta, tb in ((False, False), (True, True), (False, True)):
        a = rng.standard_normal(M * K).astype(np.float32)
        b = rng.standard_normal(K * N).astype(np.float32)
        want = _gemm_out(dev, a, b, M, N, K, ta, tb, GPU_TILE)
        np.testing.assert_array_equal(_gemm_out(dev, a, b, M, N, K, ta, tb, tiles), want)
        exp = (a.reshape(K, M).T if ta else a.reshape(M, K)).astype(np.float64) @ (
            b.reshape(N, K).T if tb else b.reshape(K, N)).astype(np.float64)
        np.testing.assert_allclose(want.reshape(M, N), exp, atol=1e-4)


def test_bad_subgroup_layouts_are_refused(dev):
    for wx in (3, 32, 64):  # not a power of two; more columns than the tile's 16 thread columns; past 32
        assert "bad GEMM tiles" in dataclasses.replace(GPU_TILE, wx=wx).problem(dev)


def test_colsum_deterministic_with_row_splits(dev, rng):
    M, N = 4000, 19
    a = (rng.standard_normal((M, N)) * 100).astype(np.float32)
    ta = dev.tensor(a)
    outs = []
    for splits in (1, 9, 9):
        to = dev.tensor(np.zeros(N, np.float32))
        k = ColSum(dev, (ta, 0, N), (to, 0), M, N, row_splits=splits)
        (o,) = run_ops(dev, [ta, to], k.ops(), [to])
        outs.append(o)
    assert np.array_equal(outs[1], outs[2])
    exp = a.astype(np.float64).sum(0)
    for o in outs[:2]:
        assert np.abs(o - exp).max() <= 1e-5 * np.abs(a).sum(0).max()


def test_out_of_range_operands_are_refused(dev):
    t = dev.tensor(np.zeros(100, np.float32))
    with pytest.raises(ValueError, match="gemm A"):
        Gemm(dev, (t, 10, 10), (t, 0, 10), (t, 0, 10), 10, 10, 10)
    with pytest.raises(ValueError, match="leading dimension"):
        Gemm(dev, (t, 0, 5), (t, 0, 10), (t, 0, 10), 5, 10, 10)
    with pytest.raises(ValueError, match="bias"):
        Gemm(dev, (t, 0, 3), (t, 0, 3), (t, 0, 3), 3, 3, 3, bias=(t, 98))
    with pytest.raises(ValueError, match="colsum out"):
        ColSum(dev, (t, 0, 10), (t, 95), 10, 10)
    big = dev.tensor(np.zeros(1000, np.float32))
    g = Gemm(dev, (big, 0, 40), (big, 0, 3), (big, 0, 3), 3, 3, 40, split_k=2)
    with pytest.raises(ValueError, match="ops()"):
        g.op()


def test_split_kernels_share_one_workspace(dev, rng):
    """Two split-K GEMMs and a row-split ColSum recorded in one sequence, one scratch buffer."""
    K = 500
    a, b = rng.standard_normal((K, 6)).astype(np.float32), rng.standard_normal((K, 4)).astype(np.float32)
    ta, tb = dev.tensor(a), dev.tensor(b)
    c1, c2, cs = (dev.tensor(np.zeros(n, np.float32)) for n in (24, 16, 4))
    work = dev.tensor(5 * 36, kind="storage")
    g1 = Gemm(dev, (ta, 0, 6), (tb, 0, 4), (c1, 0, 4), 6, 4, K, trans_a=True, split_k=5, workspace=work)
    g2 = Gemm(dev, (tb, 0, 4), (tb, 0, 4), (c2, 0, 4), 4, 4, K, trans_a=True, split_k=5, workspace=work)
    s = ColSum(dev, (tb, 0, 4), (cs, 0), K, 4, row_splits=9, workspace=work)
    got = run_ops(dev, [ta, tb, c1, c2, cs], [*g1.ops(), *g2.ops(), *s.ops()], [c1, c2, cs])
    exps = (a.T.astype(np.float64) @ b, b.T.astype(np.float64) @ b, b.astype(np.float64).sum(0))
    for g, e in zip(got, exps):
        assert np.abs(g - e.ravel()).max() <= 1e-5 * np.abs(e).max()
    with pytest.raises(ValueError, match="workspace"):
        Gemm(dev, (ta, 0, 6), (tb, 0, 4), (c1, 0, 4), 6, 4, K, trans_a=True, split_k=8, workspace=work)


def test_tensor_core_tiles_by_output_shape(dev):
    """On a described H200 (132 SMs, 48 KiB of shared memory, tensor cores): the big GEMMs take
    COOP_TILE, an output of at most 128 columns with rows enough (the head) the narrow tile, a grid
    that would not fill the GPU the small one; every tile fits 48 KiB at every transpose."""
    from catchat.vk.kernels.gemm import COOP_NARROW_TILE, COOP_SHAPE, COOP_SMALL_TILE, COOP_TILE, coop_tiles

    info = dataclasses.replace(dev.info, name="NVIDIA H200", type="discrete GPU", compute_units=132,
                               max_shared_memory_bytes=48 * 1024, max_workgroup_invocations=1024, subgroup_size=32)
    h200 = dataclasses.replace(dev, info=info, features=dev.features | {"cooperativeMatrixNV"},
                               coop_shapes=(COOP_SHAPE,))
    assert coop_tiles(h200, 32768, 6144) == coop_tiles(h200, 65536, 512) == COOP_TILE  # v5, v3 projections
    assert coop_tiles(h200, 6144, 2048, split_k=1, trans=(True, False)) == COOP_TILE  # v5 weight gradient
    assert coop_tiles(h200, 32768, 101) == coop_tiles(h200, 65536, 101) == COOP_NARROW_TILE  # the heads
    assert coop_tiles(h200, 64, 101) == coop_tiles(h200, 101, 1536) == COOP_SMALL_TILE  # a decode head, table0
    for t in (COOP_TILE, COOP_NARROW_TILE, COOP_SMALL_TILE):
        assert all(t.shared_bytes(a, b) <= 48 * 1024 for a in (False, True) for b in (False, True)), t


@pytest.mark.parametrize("split_k", [1, 2])
def test_weight_gradient_over_chunks_of_rows(dev, split_k):
    """C += A^T B (and colsum(A)) over rows [k0, k0 + K) of a 21-row window (`ops_k_at`: the layer wavefront's weight
    gradients, chunk by chunk from the top down, the last chunk shorter): the sum over the window."""
    from catchat.vk.kernels.gemm import ColSum, Gemm

    R, M, N, pad = 21, 24, 8, 4
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((R, M)).astype(np.float32), rng.standard_normal((R, N)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    ta, tb = dev.tensor(np.concatenate([np.zeros(pad, np.float32), a.ravel()])), dev.tensor(b)
    tc = dev.tensor(c0)
    gemms = {K: Gemm(dev, (ta, pad, M), (tb, 0, N), (tc, 0, N), M, N, K, trans_a=True, beta=1.0, split_k=split_k)
             for K in (8, 5)}
    chunks = ((16, 5), (8, 8), (0, 8))
    ops = [op for k0, K in chunks for op in gemms[K].ops_k_at(k0)]
    tsum = dev.tensor(np.ones(M, np.float32))  # ... and the column sums of A over the same chunks (a bias gradient)
    sums = {K: ColSum(dev, (ta, pad, M), (tsum, 0), K, M, row_splits=split_k) for K in (8, 5)}
    ops += [op for k0, K in chunks for op in sums[K].ops_at(k0)]
    got, got_sum = run_ops(dev, [ta, tb, tc, tsum], ops, [tc, tsum])
    np.testing.assert_allclose(got.reshape(M, N), c0 + a.T.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_sum, 1.0 + a.sum(axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="trans_a"):
        Gemm(dev, (ta, pad, 8), (tb, 0, N), (tc, 0, N), 8, N, 8).ops_k_at(0)


def test_rounding_loads_round_like_numpy_float16(dev, rng):
    """glsl/include/round_half.glsl (gemm.comp's ROUND_HALF) against numpy's
    float32 -> float16 -> float32 on random bit patterns and the edges: ties both ways, float16's
    largest and what rounds past it, subnormals, zeros, inf and NaN. C = A x [1]: each output is its
    rounded A alone, added to the sum's +0 (so a -0 comes out +0 on both sides)."""
    edges = np.array([0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e9, 6.1035156e-05, 6.1e-05,
                      5.9604645e-08, 2.9802322e-08, 8.940697e-08, 1e-10, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
                      np.inf, -np.inf, np.nan], np.float32)
    bits = rng.integers(0, 2 ** 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scaled = (rng.standard_normal(1 << 14) * np.float32(10.0) ** rng.integers(-9, 6, 1 << 14)).astype(np.float32)
    a = np.concatenate([edges, bits, scaled]).astype(np.float32)
    M = a.size
    ta, tb, tc = dev.tensor(a), dev.tensor(np.ones(1, np.float32)), dev.tensor(np.zeros(M, np.float32))
    g = Gemm(dev, (ta, 0, 1), (tb, 0, 1), (tc, 0, 1), M, 1, 1, False, False, beta=0.0, precision="fp16",
             coopmat=False)
    (got,) = run_ops(dev, [ta, tb, tc], g.ops(), [tc])
    with np.errstate(over="ignore", invalid="ignore"):
        want = a.astype(np.float16).astype(np.float32) + np.float32(0.0)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
