"""Residual + variational dropout + RMSNorm, forward and backward (glsl/rmsnorm.comp), against
catchat.model.reference: odd sizes, partial workgroups, dropout on and off, dg accumulated in place."""

from __future__ import annotations

import numpy as np

from catchat.model import reference as ref
from catchat.parity import ParityResult, compare, make_hyper
from catchat.vk.device import Device
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.norm import ResidualRmsNormBackward, ResidualRmsNormForward

ATOL, RTOL = 2e-6, 1e-5  # float32 rows of O(1) values; dg sums T*B terms (scaled below)


def run_norm(dev: Device, T, B, H, layer, p, seed, wg=None, rpw_f=None, rpw_b=None, rng=None):
    """Run forward + backward once; returns (got dict, expected dict)."""
    rng = rng or np.random.default_rng(0)
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    o = rng.standard_normal((T, B, H)).astype(np.float32)
    g = (1 + 0.3 * rng.standard_normal(H)).astype(np.float32)
    dout = rng.standard_normal((T, B, H)).astype(np.float32)
    g_off = 32  # parameters/gradients at an offset inside flat buffers
    params = np.zeros(g_off + H + 5, np.float32)
    params[g_off:g_off + H] = g
    grads0 = rng.standard_normal(params.size).astype(np.float32)  # dg accumulates onto this
    tx, to, tdo_ = dev.tensor(x), dev.tensor(o), dev.tensor(dout)
    tp, tg = dev.tensor(params), dev.tensor(grads0)
    th = dev.tensor(make_hyper(seed, p_hid=p), np.uint32)
    tout, trstd = dev.tensor(T * B * H), dev.tensor(T * B)
    tdx, tdo = dev.tensor(T * B * H), dev.tensor(T * B * H)
    fwd = ResidualRmsNormForward(dev, tx, to, tp, th, tout, trstd, T=T, B=B, H=H, layer=layer,
                                 g_off=g_off, wg=wg, rows_per_wg=rpw_f)
    bwd = ResidualRmsNormBackward(dev, tx, to, tp, th, trstd, tdo_, tdx, tdo, tg, T=T, B=B, H=H,
                                  layer=layer, g_off=g_off, wg=wg, rows_per_wg=rpw_b)
    got_out, got_rstd, got_dx, got_do, got_g = run_ops(
        dev, [tx, to, tdo_, tp, tg, th], fwd.ops() + bwd.ops(), [tout, trstd, tdx, tdo, tg])
    hid_scale = (ref.hidden_keep_mask(seed, layer, B, H, p) / (1.0 - p)).astype(np.float32)  # [B,H]
    e_out, cache = ref.residual_rmsnorm_forward(x, o, hid_scale, g, np.float32(1e-6))
    e_dx, e_do, e_dg = ref.residual_rmsnorm_backward(dout, cache)
    gsl = np.s_[g_off:g_off + H]
    got = dict(out=got_out, rstd=got_rstd, dx=got_dx, do=got_do, dg=got_g[gsl] - grads0[gsl],
               grads_rest=np.delete(got_g, gsl))
    exp = dict(out=e_out, rstd=cache["rstd"], dx=e_dx, do=e_do, dg=e_dg,
               grads_rest=np.delete(grads0, gsl))
    return got, exp


CASES = [  # (T, B, H, layer, p, wg, rows_per_wg forward, rows_per_wg backward)
    (1, 1, 1, 0, 0.0, None, None, None),
    (5, 3, 7, 1, 0.3, None, None, 4),  # 15 rows, 4 per workgroup: a partial last workgroup
    (9, 4, 33, 2, 0.1, None, 5, None),
    (6, 5, 64, 0, 0.5, None, None, 7),
    (3, 2, 300, 1, 0.25, 128, 2, 4),  # 3 columns per thread, the last one partial
    (40, 5, 33, 1, 0.2, None, None, 3),  # 67 partials of dg: the reduce's 16-load runs and their tail
]


def parity_checks(dev: Device) -> list[ParityResult]:
    """Forward (out, rstd) and backward (dx, do, dg += ) against reference, odd sizes, dropout on/off."""
    out = []
    for T, B, H, layer, p, wg, rf, rb in CASES:
        got, exp = run_norm(dev, T, B, H, layer, p, seed=1000 + T, wg=wg, rpw_f=rf, rpw_b=rb)
        shape = f"T={T} B={B} H={H} l={layer} p={p}" + (f" wg={wg}" if wg else "")
        for k in ("out", "rstd", "dx", "do"):
            out.append(compare(f"rmsnorm.{k}", shape, got[k], exp[k], ATOL, RTOL))
        out.append(compare("rmsnorm.dg", shape, got["dg"], exp["dg"], ATOL * 2 * np.sqrt(T * B), RTOL))
        out.append(compare("rmsnorm.grads_untouched", shape, got["grads_rest"], exp["grads_rest"], 0.0, 0.0))
    return out
