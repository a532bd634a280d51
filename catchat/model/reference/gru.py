"""The GRU layer's numpy twin (PyTorch gate order r, z, n), with resets and an optional BPTT gradient
clamp: the layer forward and backward, and the backward split as the GPU runs it (the recurrent
sweep, then the weight gradients' GEMMs).
"""

from __future__ import annotations

import numpy as np

from catchat.model.reference.layers import gemm

# ---------------------------------------------------------------------------------------------
# GRU layer (PyTorch gate order r, z, n), with resets and an optional BPTT gradient clamp
# ---------------------------------------------------------------------------------------------


def _sigmoid(a: np.ndarray) -> np.ndarray:
    # the tanh form never overflows (1 / (1 + exp(-a)) warns for large negative a)
    return 0.5 * (1.0 + np.tanh(0.5 * a))


def gru_layer_forward(x, h0, resets, w_ih, w_hh, b_ih, b_hh, precision="fp32", gi=None, recurrent="fp32",
                      forced_h=None, saves="fp32"):
    """One GRU layer over a window.

    x [T,B,H]; h0 [B,H] carried state; resets [T,B] (1 = conversation starts at t, the state
    entering t is zero); w_ih, w_hh [3H,H]; b_ih, b_hh [3H]; precision: the input projection's
    (a GEMM); gi [T,B,3H]: the input projection made elsewhere (fp16's layer 0 goes through table0);
    recurrent: the per-step products' h @ W_hh^T and (backward) dGh @ W_hh (fp16: the tensor-core
    sweeps' operands, rounded); forced_h [T,B,H] or None: the h entering each step that the
    product multiplies, in place of the layer's own (parity of the float16 sweeps: the GPU's h, so
    that a float32 ulp between its sums and the twin's cannot flip a float16 rounding and grow
    through the recurrence; the gates keep the twin's own h); saves "fp16": what the backward reads
    of the gates (r, z, n and W_hn h + b_hn) kept rounded to float16, as the streamed fp16 sweeps
    store them (the step's own arithmetic unrounded).
    Returns o [T,B,H] (o[t] = h after step t) and the cache for the backward pass.
    """
    T, B, _ = x.shape
    H = w_hh.shape[1]
    dt = x.dtype
    carry = 1 - resets.astype(dt)  # [T,B] 0 where the state is reset
    if gi is None:
        gi = gemm(x, w_ih.T, precision) + b_ih  # [T,B,3H] input projections: no recurrence, all steps at once
    o = np.empty((T, B, H), dt)  # [T,B,H]
    hprev = np.empty((T, B, H), dt)  # [T,B,H] state entering step t (after the reset)
    r = np.empty((T, B, H), dt)  # [T,B,H]
    z = np.empty((T, B, H), dt)  # [T,B,H]
    n = np.empty((T, B, H), dt)  # [T,B,H]
    ghn = np.empty((T, B, H), dt)  # [T,B,H] W_hn h + b_hn (kept: r multiplies it)
    kept = (lambda a: a.astype(np.float16).astype(dt)) if saves == "fp16" else (lambda a: a)
    h = h0.astype(dt)  # [B,H]
    for t in range(T):
        h = h * carry[t][:, None]
        gh = gemm(h if forced_h is None else forced_h[t], w_hh.T, recurrent) + b_hh  # [B,3H]
        r_t = _sigmoid(gi[t, :, :H] + gh[:, :H])
        z_t = _sigmoid(gi[t, :, H : 2 * H] + gh[:, H : 2 * H])
        n_t = np.tanh(gi[t, :, 2 * H :] + r_t * gh[:, 2 * H :])
        r[t], z[t], n[t], ghn[t] = kept(r_t), kept(z_t), kept(n_t), kept(gh[:, 2 * H :])
        hprev[t] = h
        h = (1 - z_t) * n_t + z_t * h
        o[t] = h
    cache = dict(x=x, hprev=hprev, r=r, z=z, n=n, ghn=ghn, carry=carry, w_ih=w_ih, w_hh=w_hh, precision=precision,
                 recurrent=recurrent)
    return o, cache


def force_saves(cache, saves) -> None:
    """Put saves [T,B,4H] (r, z, n, ghn, as a GPU's backward read them) in the forward's cache in
    place of the twin's own (parity of the float16 saves)."""
    cache.update(zip(("r", "z", "n", "ghn"), np.split(np.asarray(saves, cache["r"].dtype), 4, axis=2)))


def whole_dgh(dgi, dgh_n):
    """dGh [..., 3H] of a backward that keeps only its n third apart (the float16 saves' sweeps): its
    r and z thirds are dGi's, since r and z take gi + gh and so have one gradient."""
    H = dgh_n.shape[-1]
    return np.concatenate([dgi[..., :2 * H], dgh_n], axis=-1)


def gru_layer_backward(do, dhT, cache, clamp=None):
    """Backward of `gru_layer_forward`.

    do [T,B,H] gradient on the outputs; dhT [B,H] or None: gradient on the final state from
    beyond the window. clamp: None, or c > 0 to clamp elementwise to [-c, c] the gradient that
    step t (t >= 1) sends into h_{t-1}; the hits (elements with |g| > c) are counted. The
    gradient into the carried-in h0 (t = 0) is returned unclamped: truncated BPTT never uses it.
    Returns dx [T,B,H], dh0 [B,H], dw_ih [3H,H], dw_hh [3H,H], db_ih [3H], db_hh [3H], hits.
    """
    x, hprev, w_ih, w_hh = cache["x"], cache["hprev"], cache["w_ih"], cache["w_hh"]
    pr = cache.get("precision", "fp32")
    T, B, H = do.shape
    dx = np.empty_like(x)  # [T,B,H]
    dw_ih = np.zeros_like(w_ih)  # [3H,H]
    dw_hh = np.zeros_like(w_hh)  # [3H,H]
    db_ih = np.zeros(3 * H, do.dtype)  # [3H]
    db_hh = np.zeros(3 * H, do.dtype)  # [3H]
    dh = np.zeros((B, H), do.dtype) if dhT is None else dhT.astype(do.dtype)  # [B,H] into h_t
    hits = 0
    for t in reversed(range(T)):
        dgi, dgh, dh = gru_step_backward(dh + do[t], t, cache)  # [B,3H], [B,3H], [B,H] into h_{t-1}
        dx[t] = gemm(dgi, w_ih, pr)
        dw_ih += gemm(dgi.T, x[t], pr)
        dw_hh += gemm(dgh.T, hprev[t], pr)
        db_ih += dgi.sum(0)
        db_hh += dgh.sum(0)
        dh, h = _bptt_clamp(dh, clamp, t)
        hits += h
    return dx, dh, dw_ih, dw_hh, db_ih, db_hh, hits


def gru_step_backward(dh, t, cache):
    """The gate backward of step t of `gru_layer_forward`.

    dh [B,H]: the total gradient on h_t. Returns dgi, dgh [B,3H], the gradients on the input and
    recurrent projections' pre-activations (r, z, n; r gates W_hn h + b_hn, so the n part of dgh
    is the n part of dgi times r), and the gradient into h_{t-1} [B,H] (none through a reset),
    before any clamp. cache["forced_dgh"] [T,B,3H], where set: the dgh the product multiplies in
    place of the step's own (as `gru_layer_forward`'s forced_h).
    """
    hprev, r, z, n, ghn = (cache[k] for k in ("hprev", "r", "z", "n", "ghn"))
    dn = dh * (1 - z[t])
    dz = dh * (hprev[t] - n[t])
    dan = dn * (1 - n[t] ** 2)  # pre-tanh of n
    daz = dz * z[t] * (1 - z[t])  # pre-sigmoid of z
    dar = dan * ghn[t] * r[t] * (1 - r[t])  # pre-sigmoid of r
    dgi = np.concatenate([dar, daz, dan], axis=1)  # [B,3H]
    dgh = np.concatenate([dar, daz, dan * r[t]], axis=1)  # [B,3H]
    forced = cache.get("forced_dgh")
    dh_prev = dh * z[t] + gemm(dgh if forced is None else forced[t], cache["w_hh"], cache.get("recurrent", "fp32"))
    return dgi, dgh, dh_prev * cache["carry"][t][:, None]


def _bptt_clamp(dh, clamp, t: int):
    """(dh clamped to [-clamp, clamp], elements beyond it) for the gradient step t (t >= 1) sends into
    h_{t-1}; (dh, 0) with no clamp or at t = 0 (dh0 stays unclamped)."""
    if clamp is None or t == 0:
        return dh, 0
    return np.clip(dh, -clamp, clamp), int(np.count_nonzero(np.abs(dh) > clamp))


def gru_sweep_backward(do, cache, clamp=None):
    """What the GPU's backward sweep writes (glsl/gru_backward*.comp, catchat/vk/kernels/gru.py):
    `gru_layer_backward`'s recursion without the weight gradients, which GEMMs form after the sweep
    (`gru_weight_grads`).

    do [T,B,H]; cache from gru_layer_forward. Returns dGi, dGh [T,B,3H], dh0 [B,H], hits.
    """
    T, B, H = do.shape
    dgi, dgh = np.empty((T, B, 3 * H), do.dtype), np.empty((T, B, 3 * H), do.dtype)  # [T,B,3H]
    dh = np.zeros((B, H), do.dtype)  # [B,H]
    hits = 0
    for t in reversed(range(T)):
        dgi[t], dgh[t], dh = gru_step_backward(dh + do[t], t, cache)
        dh, h = _bptt_clamp(dh, clamp, t)
        hits += h
    return dgi, dgh, dh, hits


def gru_weight_grads(dgi, dgh, x, hprev, w_ih):
    """What the post-sweep GEMMs compute from the sweep's dGi, dGh [T,B,3H], the layer input x and
    hprev [T,B,H]: dx [T,B,H], dW_ih, dW_hh [3H,H], db_ih, db_hh [3H] (numpy, any dtype)."""
    H = x.shape[-1]
    dgi2, dgh2 = dgi.reshape(-1, 3 * H), dgh.reshape(-1, 3 * H)
    return (dgi @ w_ih, dgi2.T @ x.reshape(-1, H), dgh2.T @ hprev.reshape(-1, H), dgi2.sum(0), dgh2.sum(0))
