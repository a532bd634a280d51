"""The float32 GEMM on tensor cores from float16 splits (glsl/gemm_coopmat.comp's SPLIT, CATCHAT_GEMM32_SPLIT):
each operand scaled by a power of two per workgroup and split as hi + 2^-11 lo, three products into two
accumulator sets. Lavapipe has no tensor cores, so it runs the kernel on emulated fragments (EMU: sums to
nearest); `catchat parity`'s "gemm_split" rows (tests/kernels/test_gemm.py counts them) cover every
transpose, both tiles, split-K and operands outside float16's range on any device."""

import dataclasses

import numpy as np
import pytest

from catchat.errors import UsageError
from catchat.model import ParamLayout
from catchat.parity import model as model_parity
from catchat.vk.kernels import gemm_tiles, run_ops
from catchat.vk.kernels.gemm import SPLIT_SMALL_TILE, Gemm, split_gemm
from catchat.vk.program import Program


def _product(dev, A, B, **kw) -> np.ndarray:
    M, K = A.shape
    N = B.shape[1]
    ta, tb, tc = dev.tensor(A.ravel()), dev.tensor(B.ravel()), dev.tensor(np.zeros(M * N, np.float32))
    g = Gemm(dev, (ta, 0, K), (tb, 0, N), (tc, 0, N), M, N, K, **kw)
    (got,) = run_ops(dev, [ta, tb, tc], g.ops(), [tc])
    return got.reshape(M, N)


def test_split_gemm_keeps_float32s_precision_where_float16_loses_it(dev):
    """Gradient-sized operands (1e-7: float16 subnormals) multiplied to float32's precision, where their
    float16 product is 1e-2 off (so neither the lo parts nor the scales are idle)."""
    rng = np.random.default_rng(5)
    A = (rng.standard_normal((40, 96)) * 1e-7).astype(np.float32)
    B = rng.standard_normal((96, 24)).astype(np.float32)
    want = A.astype(np.float64) @ B.astype(np.float64)
    scale = np.abs(want).max()
    got = _product(dev, A, B, split=True, tiles=SPLIT_SMALL_TILE)
    as_half = A.astype(np.float16).astype(np.float64) @ B.astype(np.float16).astype(np.float64)
    assert np.abs(got - want).max() < 1e-6 * scale
    assert np.abs(as_half - want).max() > 1e-2 * scale


def test_split_gemm_choice_and_refusals(dev, monkeypatch):
    """Unset: large float32 GEMMs on a GPU with cooperative matrices, never here (lavapipe) nor for a few
    rows or a small product; 1: every float32 GEMM (emulated here); 0: none; anything else is refused.
    A split GEMM refuses float16 operands, precision fp16 and coopmat=False."""
    monkeypatch.delenv(gemm_tiles.ENV_GEMM32_SPLIT, raising=False)
    assert not split_gemm(dev, 32768, 6144, 2048)
    monkeypatch.setattr(gemm_tiles, "coopmat_runs", lambda d: True)
    assert split_gemm(dev, 32768, 6144, 2048) and split_gemm(dev, 8192, 101, 2048)
    assert not split_gemm(dev, 32, 6144, 2048)  # a timestep's rows
    assert not split_gemm(dev, 512, 512, 512)  # 2^27 multiply-adds
    monkeypatch.setenv(gemm_tiles.ENV_GEMM32_SPLIT, "0")
    assert not split_gemm(dev, 32768, 6144, 2048)
    monkeypatch.undo()
    monkeypatch.setenv(gemm_tiles.ENV_GEMM32_SPLIT, "1")
    assert split_gemm(dev, 4, 4, 4)
    a, c = dev.tensor(np.ones(16, np.float32)), dev.tensor(np.zeros(16, np.float32))
    assert Gemm(dev, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4).split
    assert not Gemm(dev, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, precision="fp16").split
    for kw in (dict(precision="fp16"), dict(coopmat=False)):
        with pytest.raises(ValueError, match="split GEMM multiplies float32"):
            Gemm(dev, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, split=True, **kw)
    with pytest.raises(ValueError, match="one shared buffer"):
        Gemm(dev, (a, 0, 4), (a, 0, 4), (c, 0, 4), 4, 4, 4, split=True,
             tiles=dataclasses.replace(SPLIT_SMALL_TILE, stages=2))
    monkeypatch.setenv(gemm_tiles.ENV_GEMM32_SPLIT, "yes")
    with pytest.raises(UsageError, match="CATCHAT_GEMM32_SPLIT"):
        split_gemm(dev, 4, 4, 4)


@pytest.mark.parametrize("wave", ["", "2"])
def test_program_trains_with_split_gemms(dev, monkeypatch, wave):
    """A whole fp32 training step with every GEMM split (input projections, head, weight and input
    gradients, table0's; with a wavefront of 2 chunks also the row blocks of `op_at` and `ops_k_at`) against
    the fp32 twin at the model parity's fp32 tolerances: every check passes."""
    monkeypatch.setenv(gemm_tiles.ENV_GEMM32_SPLIT, "1")
    monkeypatch.setenv("CATCHAT_WAVEFRONT", wave)
    label, spec, T, B, hp = model_parity.MODEL_CASES[0]
    results = model_parity.model_parity(dev, spec, T, B, hp, label=f"{label}, split GEMMs")
    assert len(results) > 10 and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    prog = Program(dev, ParamLayout(spec), T, B)
    rows = prog.fwd.rows
    assert all(g.split for g in rows.proj[1:]) and rows.head.split and prog.fwd.table0.split
    assert all(lay.dx.split and lay.dw_ih.split for lay in prog.bwd.layers[1:])
