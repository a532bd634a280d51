"""Residual + variational dropout + RMSNorm forward/backward against catchat.model.reference."""

import numpy as np

from catchat.parity import norm as norm_parity
from catchat.vk.kernels import norm


def test_parity(dev):
    results = norm_parity.parity_checks(dev)
    assert len(results) == 6 * len(norm_parity.CASES) == 36  # the case list whole, six checks a case
    assert all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


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


def test_backward_in_chunks_of_rows(dev):
    """The rows dispatch over chunks of the window (the layer wavefront's backward: `rows_op_at`), last one
    shorter, then the reduce: the whole window's dx, do and dg bit for bit; a chunk that does not start on
    a workgroup's rows is refused."""
    import pytest

    from catchat.parity import make_hyper
    from catchat.vk.kernels import run_ops

    T, B, H, g_off = 7, 3, 40, 8
    rng = np.random.default_rng(4)
    x, o, dout = (rng.standard_normal(T * B * H).astype(np.float32) for _ in range(3))
    params = 1.0 + 0.1 * rng.standard_normal(g_off + H).astype(np.float32)
    tx, to, tp, th = dev.tensor(x), dev.tensor(o), dev.tensor(params), dev.tensor(make_hyper(1, p_hid=0.2), np.uint32)
    tout, trs = dev.tensor(T * B * H), dev.tensor(T * B)
    fwd = norm.ResidualRmsNormForward(dev, tx, to, tp, th, tout, trs, T=T, B=B, H=H, layer=1, g_off=g_off)
    run_ops(dev, [tx, to, tp, th], fwd.ops(), [])

    def backward(chunks) -> list:
        td, tdx, tdo, tg = dev.tensor(dout), dev.tensor(T * B * H), dev.tensor(T * B * H), dev.tensor(g_off + H)
        bwd = norm.ResidualRmsNormBackward(dev, tx, to, tp, th, trs, td, tdx, tdo, tg, T=T, B=B, H=H, layer=1,
                                           g_off=g_off, rows_per_wg=3)
        ops = bwd.ops() if chunks is None else [bwd.rows_op_at(3 * t0, 3 * (t1 - t0)) for t0, t1 in chunks] \
            + [bwd.reduce_op()]
        with pytest.raises(ValueError, match="not a chunk"):
            bwd.rows_op_at(4, 6)
        return run_ops(dev, [td, tdx, tdo, tg], ops, [tdx, tdo, tg])

    whole = backward(None)
    for got, want in zip(backward([(4, 7), (2, 4), (0, 2)]), whole):  # from the top chunk down, as the wavefront
        np.testing.assert_array_equal(got, want)
