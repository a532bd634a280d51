"""Residual + variational dropout + RMSNorm forward/backward against catchat.model.reference."""

import numpy as np

from catchat.parity import norm as norm_parity
from catchat.vk.kernels import norm


def test_parity(dev):
    results = norm_parity.parity_checks(dev)
    assert results and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def test_wide_rows(dev):
    """H = 2048 (8 columns per thread at 256 threads), the widest hidden size planned."""
    got, exp = norm_parity.run_norm(dev, 2, 2, 2048, 1, 0.2, seed=3)
    for k in ("out", "rstd", "dx", "do"):
        r = norm_parity.compare(k, "H=2048", got[k], exp[k], norm_parity.ATOL, norm_parity.RTOL)
        assert r.ok, str(r)
    r = norm_parity.compare("dg", "H=2048", got["dg"], exp["dg"], 4 * norm_parity.ATOL, norm_parity.RTOL)
    assert r.ok, str(r)


def test_deterministic(dev):
    """Two runs give bitwise-equal outputs and dg (no float atomics)."""
    a, _ = norm_parity.run_norm(dev, 7, 5, 96, 0, 0.1, seed=11, rpw_b=3, rng=np.random.default_rng(5))
    b, _ = norm_parity.run_norm(dev, 7, 5, 96, 0, 0.1, seed=11, rpw_b=3, rng=np.random.default_rng(5))
    for k in a:
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k


def test_dg_accumulates(dev):
    """The reduce adds into grads: recording the backward twice adds dg twice."""
    from catchat.parity import make_hyper
    from catchat.vk.kernels import run_ops

    T, B, H, g_off = 3, 2, 40, 16
    rng = np.random.default_rng(2)
    x, o, dout = (rng.standard_normal(T * B * H).astype(np.float32) for _ in range(3))
    params = np.ones(g_off + H, np.float32)
    tx, to, td, tp = dev.tensor(x), dev.tensor(o), dev.tensor(dout), dev.tensor(params)
    tg, th = dev.tensor(np.zeros(g_off + H, np.float32)), dev.tensor(make_hyper(1), np.uint32)
    tout, trs, tdx, tdo = dev.tensor(T * B * H), dev.tensor(T * B), dev.tensor(T * B * H), dev.tensor(T * B * H)
    fwd = norm.ResidualRmsNormForward(dev, tx, to, tp, th, tout, trs, T=T, B=B, H=H, layer=0, g_off=g_off)
    bwd = norm.ResidualRmsNormBackward(dev, tx, to, tp, th, trs, td, tdx, tdo, tg, T=T, B=B, H=H, layer=0,
                                       g_off=g_off)
    (once,) = run_ops(dev, [tx, to, td, tp, tg, th], fwd.ops() + bwd.ops(), [tg])
    (twice,) = run_ops(dev, [tg], bwd.ops(), [tg])
    assert np.all(once[:g_off] == 0) and np.any(once[g_off:] != 0)
    np.testing.assert_allclose(twice, 2 * once, rtol=1e-6, atol=1e-7)
