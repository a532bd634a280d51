"""The numpy reference model: the oracle every shader is tested against.

Plain, readable, CPU-only. The contract is docs/model.md; shapes are time-major. Each operation
has a `*_forward` and a `*_backward` side by side (llm.c style). Arithmetic follows the dtype of
the parameters passed in (float32 to compare with the GPU, float64 for finite differences).

Sections: dropout masks (from catchat.rng) / layers / loss / model / scheduled sampling /
optimizers / one training step.

precision "fp16" (train.precision): every product the GPU runs as a GEMM goes through `gemm`,
which rounds both operands to float16 first, as the GPU's GEMMs do; the recurrent products, norms,
loss and optimizer stay in the arithmetic dtype. fp16's loss scale is not modelled: multiplying by a
power of two and dividing again is exact, so the GPU's unscaled gradients match these to tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from catchat import vocab
from catchat.model import ModelSpec, ParamLayout, head_name
from catchat.rng import (
    STREAM_EMBEDDING,
    STREAM_HIDDEN,
    STREAM_TF_COIN,
    STREAM_TF_SAMPLE,
    rng_uniform,
    step_seed,
)

# ---------------------------------------------------------------------------------------------
# GEMM operands at a precision
# ---------------------------------------------------------------------------------------------


def gemm(a: np.ndarray, b: np.ndarray, precision: str = "fp32") -> np.ndarray:
    """a @ b as the GPU's GEMMs take it: at "fp16" each operand rounded to float16 (to nearest
    even), products and sums in the operands' dtype."""
    if precision == "fp32":
        return a @ b
    if precision != "fp16":
        raise ValueError(f"unknown precision {precision!r}")
    return a.astype(np.float16).astype(a.dtype) @ b.astype(np.float16).astype(b.dtype)


# ---------------------------------------------------------------------------------------------
# axpby: y = a*x + b*y + c (zeroing, scaling, copying, accumulating buffers)
# ---------------------------------------------------------------------------------------------


def axpby_reference(x: np.ndarray, y: np.ndarray, a: float, b: float, c: float = 0.0,
                    dtype=np.float32) -> np.ndarray:
    """numpy twin of glsl/axpby.comp in `dtype` arithmetic (float32, or float16 for its HALF variant;
    a zero coefficient ignores its operand)."""
    t = np.dtype(dtype).type
    r = np.zeros_like(y, dtype=t)
    if a != 0:
        r = t(a) * x.astype(t)
    if b != 0:
        r = r + t(b) * y.astype(t)
    return (r + t(c)).astype(t)


# ---------------------------------------------------------------------------------------------
# Dropout masks, drawn from the counter-based RNG shared with GLSL (catchat.rng)
# ---------------------------------------------------------------------------------------------


def _keep(seed: int, stream: int, counter: np.ndarray, p: float) -> np.ndarray:
    # compare in float32 as the shader does: uniform is exact there, so keep is bit-identical
    return rng_uniform(seed, stream, counter) >= np.float32(p)


def embedding_keep_mask(seed: int, V: int, p: float) -> np.ndarray:
    """bool [V]: which embedding rows survive dropout this micro-batch."""
    return _keep(seed, STREAM_EMBEDDING, np.arange(V, dtype=np.uint64), p)  # [V]


def hidden_keep_mask(seed: int, layer: int, B: int, H: int, p: float) -> np.ndarray:
    """bool [B, H]: the variational (whole-window) dropout mask of `layer`'s GRU output."""
    counter = np.arange(B * H, dtype=np.uint64).reshape(B, H)  # b * H + j
    return _keep(seed, STREAM_HIDDEN + layer, counter, p)  # [B, H]


# ---------------------------------------------------------------------------------------------
# Embedding
# ---------------------------------------------------------------------------------------------


def embedding_forward(E: np.ndarray, tokens: np.ndarray, row_scale: np.ndarray) -> np.ndarray:
    """x[t,b] = E[tok[t,b]] * row_scale[tok[t,b]].

    E [V,H]; tokens [T,B] ints; row_scale [V] = sqrt(H) * keep / (1 - p_emb). Returns x [T,B,H].
    """
    return E[tokens] * row_scale[tokens][..., None]  # [T,B,H]


def embedding_backward(dE: np.ndarray, dx: np.ndarray, tokens: np.ndarray, row_scale: np.ndarray):
    """Accumulate into dE [V,H] row by row, tokens in time-major order (deterministic sum).

    dx [T,B,H]; tokens [T,B]; row_scale [V].
    """
    H = dx.shape[-1]
    rows = (dx * row_scale[tokens][..., None]).reshape(-1, H)  # [T*B, H]
    np.add.at(dE, tokens.reshape(-1).astype(np.intp), rows)


# ---------------------------------------------------------------------------------------------
# GRU layer (PyTorch gate order r, z, n), with resets and an optional BPTT gradient clamp
# ---------------------------------------------------------------------------------------------


def _sigmoid(a: np.ndarray) -> np.ndarray:
    # the tanh form never overflows (1 / (1 + exp(-a)) warns for large negative a)
    return 0.5 * (1.0 + np.tanh(0.5 * a))


def gru_layer_forward(x, h0, resets, w_ih, w_hh, b_ih, b_hh, precision="fp32", gi=None, recurrent="fp32",
                      forced_h=None):
    """One GRU layer over a window.

    x [T,B,H]; h0 [B,H] carried state; resets [T,B] (1 = conversation starts at t, the state
    entering t is zero); w_ih, w_hh [3H,H]; b_ih, b_hh [3H]; precision: the input projection's
    (a GEMM); gi [T,B,3H]: the input projection made elsewhere (fp16's layer 0 goes through table0);
    recurrent: the per-step products' h @ W_hh^T and (backward) dGh @ W_hh (fp16: the tensor-core
    sweeps' operands, rounded); forced_h [T,B,H] or None: the h entering each step that the
    product multiplies, in place of the layer's own (parity of the float16 sweeps: the GPU's h, so
    that a float32 ulp between its sums and the twin's cannot flip a float16 rounding and grow
    through the recurrence; the gates keep the twin's own h).
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
    h = h0.astype(dt)  # [B,H]
    for t in range(T):
        h = h * carry[t][:, None]
        gh = gemm(h if forced_h is None else forced_h[t], w_hh.T, recurrent) + b_hh  # [B,3H]
        r[t] = _sigmoid(gi[t, :, :H] + gh[:, :H])
        z[t] = _sigmoid(gi[t, :, H : 2 * H] + gh[:, H : 2 * H])
        ghn[t] = gh[:, 2 * H :]
        n[t] = np.tanh(gi[t, :, 2 * H :] + r[t] * ghn[t])
        hprev[t] = h
        h = (1 - z[t]) * n[t] + z[t] * h
        o[t] = h
    cache = dict(x=x, hprev=hprev, r=r, z=z, n=n, ghn=ghn, carry=carry, w_ih=w_ih, w_hh=w_hh, precision=precision,
                 recurrent=recurrent)
    return o, cache


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


# ---------------------------------------------------------------------------------------------
# Residual + variational dropout + RMSNorm
# ---------------------------------------------------------------------------------------------


def residual_rmsnorm_forward(x, o, hid_scale, g, eps):
    """out = RMSNorm(x + o * hid_scale) * g.

    x, o [T,B,H]; hid_scale [B,H] = keep / (1 - p_hid), the same for every t; g [H].
    Returns out [T,B,H] and the cache.
    """
    y = x + o * hid_scale  # [T,B,H]
    rstd = 1 / np.sqrt((y * y).mean(-1, keepdims=True) + eps)  # [T,B,1]
    return y * rstd * g, dict(y=y, rstd=rstd, hid_scale=hid_scale, g=g)


def residual_rmsnorm_backward(dout, cache):
    """dout [T,B,H] -> dx [T,B,H], do [T,B,H], dg [H]."""
    y, rstd, hid_scale, g = cache["y"], cache["rstd"], cache["hid_scale"], cache["g"]
    yhat = y * rstd  # [T,B,H]
    dg = (dout * yhat).sum((0, 1))  # [H]
    dyhat = dout * g  # [T,B,H]
    dy = rstd * (dyhat - yhat * (dyhat * yhat).mean(-1, keepdims=True))  # [T,B,H]
    return dy, dy * hid_scale, dg


# ---------------------------------------------------------------------------------------------
# Head (no bias; W is embedding.weight when tied)
# ---------------------------------------------------------------------------------------------


def head_forward(x, W, precision="fp32"):
    """x [T,B,H], W [V,H] -> logits [T,B,V]."""
    return gemm(x, W.T, precision)


def head_backward(dlogits, x, W, precision="fp32"):
    """dlogits [T,B,V] -> dx [T,B,H], dW [V,H]."""
    V = W.shape[0]
    dW = gemm(dlogits.reshape(-1, V).T, x.reshape(-1, x.shape[-1]), precision)  # [V,H]
    return gemm(dlogits, W, precision), dW


# ---------------------------------------------------------------------------------------------
# Loss: PyTorch's cross_entropy(label_smoothing=e), pad targets masked
# ---------------------------------------------------------------------------------------------


def cross_entropy_forward_backward(logits, targets, n_valid, smoothing=0.0):
    """Smoothed cross-entropy and its gradient, normalised by the whole step's valid count.

    logits [T,B,V]; targets [T,B] (0 = pad: masked); n_valid: valid targets of the whole
    optimizer step (0 gives loss 0 and zero gradient). Returns (loss_sum / n_valid,
    dlogits [T,B,V], top1_hits, top5_hits, n_valid_here); hits count valid targets whose rank
    (ties broken to the lower index) is < 1 / < 5.
    """
    V = logits.shape[-1]
    e = float(smoothing)
    tgt = targets.astype(np.intp)[..., None]  # [T,B,1]
    valid = targets != 0  # [T,B]
    inv = 1.0 / n_valid if n_valid > 0 else 0.0
    shifted = logits - logits.max(-1, keepdims=True)  # [T,B,V] stable log-softmax
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))  # [T,B,V]
    logp_t = np.take_along_axis(logp, tgt, -1)[..., 0]  # [T,B]
    loss_i = -((1 - e) * logp_t + (e / V) * logp.sum(-1))  # [T,B]
    loss = float(loss_i[valid].sum()) * inv
    dlogits = np.exp(logp) - e / V  # [T,B,V]
    np.put_along_axis(dlogits, tgt, np.take_along_axis(dlogits, tgt, -1) - (1 - e), -1)
    dlogits *= (valid * inv).astype(logits.dtype)[..., None]
    # rank of the target = logits above it + equal logits at a lower index
    lt = np.take_along_axis(logits, tgt, -1)  # [T,B,1]
    lower = np.arange(V) < tgt  # [T,B,V]
    rank = ((logits > lt) | ((logits == lt) & lower)).sum(-1)  # [T,B]
    top1 = int(np.count_nonzero(valid & (rank < 1)))
    top5 = int(np.count_nonzero(valid & (rank < 5)))
    return loss, dlogits, top1, top5, int(np.count_nonzero(valid))


# ---------------------------------------------------------------------------------------------
# The model: forward and backward over one window
# ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    """What one micro-batch's forward/backward produces (grads/dh0 are None without grads)."""

    loss: float  # this micro-batch's share: its loss sum / the step's n_valid
    logits: np.ndarray  # [T,B,V]
    grads: dict[str, np.ndarray] | None  # by parameter name, already divided by n_valid
    dh0: np.ndarray | None  # [L,B,H] gradient on the carried-in state (for checks only)
    hT: np.ndarray  # [L,B,H] state after the last step, carried to the next window
    top1: int
    top5: int
    n_valid: int  # valid targets in this micro-batch
    clamp_hits: int  # BPTT clamp hits summed over layers


def _dropout_scale(keep: np.ndarray, p: float, dt) -> np.ndarray:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return (keep / (1.0 - p)).astype(dt)


def model_forward_backward(params, spec: ModelSpec, tokens, targets, resets, h0, n_valid_step,
                           *, smoothing=0.0, p_emb=0.0, p_hid=0.0, seed=0, clamp=None,
                           need_grads=True, precision="fp32", recurrent="fp32") -> Result:
    """Forward (and backward) of the whole model over one window; docs/model.md, exactly.

    params: name -> array (dtype sets the arithmetic); tokens, targets [T,B]; resets [T,B];
    h0 [L,B,H]; n_valid_step: valid targets of the whole optimizer step; seed: this
    micro-batch's dropout seed (`catchat.rng.step_seed`). precision "fp16": the GEMMs' operands
    rounded to float16 (`gemm`), layer 0's input side through table0 = E W_ih0^T as the GPU does
    (whose float16 operands are E and W_ih0, not the scaled rows x0). recurrent "fp16": the sweeps'
    products h @ W_hh^T and dGh @ W_hh too (the tensor-core sweeps, `coop=True`).
    """
    E = params["embedding.weight"]  # [V,H]
    dt = E.dtype
    V, H, L = spec.vocab_size, spec.hidden, spec.layers
    T, B = tokens.shape
    tokens = tokens.astype(np.intp)
    row_scale = math.sqrt(H) * _dropout_scale(embedding_keep_mask(seed, V, p_emb), p_emb, dt)  # [V]
    x = embedding_forward(E, tokens, row_scale)  # [T,B,H]
    xs, gcaches, ncaches = [], [], []
    hT = np.empty((L, B, H), dt)  # [L,B,H]
    table0 = precision == "fp16"  # layer 0's input projection as a gather from E W_ih0^T
    for l in range(L):
        pre = f"layers.{l}."
        hid_scale = _dropout_scale(hidden_keep_mask(seed, l, B, H, p_hid), p_hid, dt)  # [B,H]
        gi = None
        if l == 0 and table0:  # [T,B,3H]
            gi = embedding_forward(gemm(E, params[pre + "gru.weight_ih"].T, precision), tokens, row_scale)
            gi += params[pre + "gru.bias_ih"]
        o, gc = gru_layer_forward(x, h0[l], resets, params[pre + "gru.weight_ih"],
                                  params[pre + "gru.weight_hh"], params[pre + "gru.bias_ih"],
                                  params[pre + "gru.bias_hh"], precision, gi, recurrent)  # [T,B,H]
        hT[l] = o[-1]
        xs.append(x)
        x, nc = residual_rmsnorm_forward(x, o, hid_scale, params[pre + "norm.weight"], spec.norm_eps)
        gcaches.append(gc)
        ncaches.append(nc)
    W_head = params[head_name(spec)]  # [V,H]
    logits = head_forward(x, W_head, precision)  # [T,B,V]
    loss, dlogits, top1, top5, nv = cross_entropy_forward_backward(logits, targets, n_valid_step,
                                                                   smoothing)
    if not need_grads:
        return Result(loss, logits, None, None, hT, top1, top5, nv, 0)

    grads = {k: np.zeros_like(v) for k, v in params.items()}
    dx, dW = head_backward(dlogits, x, W_head, precision)  # [T,B,H], [V,H]
    grads[head_name(spec)] += dW  # tied: the head's share lands on the embedding
    dh0 = np.empty((L, B, H), dt)  # [L,B,H]
    hits = 0
    for l in reversed(range(L)):
        pre = f"layers.{l}."
        dx_res, do, dg = residual_rmsnorm_backward(dx, ncaches[l])
        if l == 0 and table0:  # the input side through table0: dtable0 = dGi0 summed by token, then two GEMMs
            dgi, dgh, dh0[l], h = gru_sweep_backward(do, gcaches[l], clamp)  # [T,B,3H] x2
            dwh = gemm(dgh.reshape(-1, 3 * H).T, gcaches[l]["hprev"].reshape(-1, H), precision)
            dbi, dbh = dgi.sum((0, 1)), dgh.sum((0, 1))
            dtable0 = np.zeros((V, 3 * H), dt)  # [V,3H]
            embedding_backward(dtable0, dgi, tokens, row_scale)
            dwi = gemm(dtable0.T, E, precision)  # [3H,H]
            grads["embedding.weight"] += gemm(dtable0, params[pre + "gru.weight_ih"], precision)
            dx_gru = 0.0
        else:
            dx_gru, dh0[l], dwi, dwh, dbi, dbh, h = gru_layer_backward(do, None, gcaches[l], clamp)
        grads[pre + "norm.weight"] += dg
        grads[pre + "gru.weight_ih"] += dwi
        grads[pre + "gru.weight_hh"] += dwh
        grads[pre + "gru.bias_ih"] += dbi
        grads[pre + "gru.bias_hh"] += dbh
        hits += h
        dx = dx_res + dx_gru  # residual path + through the GRU's input
    embedding_backward(grads["embedding.weight"], dx, tokens, row_scale)
    return Result(loss, logits, grads, dh0, hT, top1, top5, nv, hits)


# ---------------------------------------------------------------------------------------------
# Scheduled sampling: the per-timestep path's choice of inputs (docs/model.md)
# ---------------------------------------------------------------------------------------------


def tf_select(row_tokens, prev_logits, row_resets, seed: int, t: int, tf: float, top_k: int = 0):
    """Inputs of step t for every lane: the data's token, or the model's choice from step t-1.

    row_tokens [B] data tokens at t; prev_logits [B,V] logits of step t-1; row_resets [B].
    The data's token is kept at t == 0, at a reset, and where the coin rng_uniform(seed, 32,
    t*B + b) < tf. Otherwise: the argmax (top_k == 0) or a sample from the top_k largest logits
    (softmax over them, u = rng_uniform(seed, 33, t*B + b)); <pad> and <bos> are never chosen,
    ties go to the lower index. Returns (inputs [B], how many were the model's choice).
    """
    out = np.array(row_tokens, dtype=np.uint32, copy=True)
    if t == 0:
        return out, 0
    B = out.shape[0]
    rows = t * B + np.arange(B)
    coins = rng_uniform(seed, STREAM_TF_COIN, rows)
    fed = 0
    for b in range(B):
        if row_resets[b] or coins[b] < np.float32(tf):
            continue
        lg = np.asarray(prev_logits[b], dtype=np.float32)
        cand = np.arange(2, lg.shape[0])
        order = cand[np.lexsort((cand, -lg[cand]))]  # larger logit first, lower index on ties
        k = min(int(top_k), 16)
        if k == 0:
            out[b] = order[0]
        else:
            top = order[:k]
            w = np.exp(lg[top] - lg[top[0]], dtype=np.float32)
            acc = np.cumsum(w, dtype=np.float32)  # sequential, as the shader sums
            u = rng_uniform(seed, STREAM_TF_SAMPLE, int(rows[b])) * acc[-1]
            out[b] = top[min(int(np.count_nonzero(acc <= u)), k - 1)]
        fed += 1
    return out, fed


def scheduled_sampling_inputs(params, spec: ModelSpec, tokens, resets, h0, *, tf, top_k=0, seed=0,
                              p_emb=0.0, p_hid=0.0):
    """The inputs the per-timestep path feeds over a window: one timestep at a time, each step's
    input chosen by `tf_select` from the previous step's logits. Returns (inputs [T,B], model-fed
    count). No gradient flows through the choice: training then runs the ordinary forward and
    backward on these inputs (`model_forward_backward`)."""
    T, B = tokens.shape
    fed = np.array(tokens, dtype=np.uint32, copy=True)
    h = h0
    prev = None
    count = 0
    no_targets = np.zeros((1, B), np.uint32)
    for t in range(T):
        if t > 0:
            fed[t], n = tf_select(fed[t], prev, resets[t], seed, t, tf, top_k)
            count += n
        r = model_forward_backward(params, spec, fed[t:t + 1], no_targets, resets[t:t + 1], h, 1,
                                   p_emb=p_emb, p_hid=p_hid, seed=seed, need_grads=False)
        prev, h = r.logits[0], r.hT
    return fed, count


# ---------------------------------------------------------------------------------------------
# Generation: the choice of the next token (glsl/decode_sample.comp's twin, rule for rule)
# ---------------------------------------------------------------------------------------------


def ngram_banned(history, n: int, V: int, stop=()) -> np.ndarray:
    """bool [V]: tokens that would repeat an n-gram of `history` (one stream's generated tokens).

    After the last n-1 tokens, every token that once followed those n-1 tokens is banned; tokens
    in `stop` never are (a stream can always stop). n < 2 bans nothing."""
    out = np.zeros(V, bool)
    h, k = list(history), int(n) - 1
    if n >= 2 and len(h) >= k:
        tail = h[len(h) - k:]
        for q in range(k, len(h)):
            if h[q - k:q] == tail and h[q] < V:
                out[h[q]] = True
    out[[t for t in stop if t < V]] = False
    return out


def sample_choice(logits, uniforms, allowed, *, inv_temp: float, top_k: int = 0, top_p: float = 1.0,
                  greedy: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The next token per row of float32 logits [B,V]; returns (choice int64 [B], margin [B]).

    allowed [B,V] bool (not <pad>, <bos> or n-gram-banned); uniforms [B] float32 (rng.decode_uniforms).
    greedy: the first largest allowed logit. Else z = logit * float32(inv_temp) (rounded as the GPU
    does); the top_k largest z (ties to the lower index); p = exp(z - max); top_p keeps tokens whose
    kept mass ranked before them is < top_p * sum p; then the first v whose running sum of p (index
    order) exceeds u * sum p, or the last kept token. No allowed token (non-finite logits): <eos>.
    margin: how far (relative to sum p) u and top_p were from a boundary that would change the
    choice; the GPU's float32 exp and sums can differ from this float64 twin only where it is ~1e-6
    (greedy choices are exact: margin inf)."""
    lg = np.asarray(logits, np.float32)
    B, V = lg.shape
    choice = np.full(B, vocab.EOS, np.int64)
    margin = np.full(B, np.inf)
    for b in range(B):
        ok = np.asarray(allowed[b], bool) & np.isfinite(lg[b])
        if not ok.any():
            continue
        if greedy:
            m = lg[b][ok].max()
            choice[b] = int(np.flatnonzero(ok & (lg[b] == m))[0])
            continue
        z = (lg[b] * np.float32(inv_temp)).astype(np.float64)
        idx = np.flatnonzero(ok)
        order = idx[np.lexsort((idx, -z[idx]))]  # descending z, ties to the lower index
        rank = np.full(V, V)
        rank[order] = np.arange(order.size)
        kept = ok & ((top_k == 0) | (rank < top_k))
        p = np.where(kept, np.exp(z - z[kept].max()), 0.0)
        edges = []
        if top_p < 1.0:
            total = p.sum()
            before = np.array([p[kept & (rank < rank[v])].sum() for v in range(V)])
            edges += list(np.abs(before[kept] - top_p * total) / total)
            p = np.where(kept & (before < np.float32(top_p) * total), p, 0.0)
        c = np.cumsum(p)
        thr = float(uniforms[b]) * c[-1]
        hit = np.flatnonzero((p > 0) & (c > thr))
        choice[b] = int(hit[0]) if hit.size else int(np.flatnonzero(p > 0)[-1])
        edges += list(np.abs(c[p > 0] - thr) / c[-1])
        margin[b] = min(edges)
    return choice, margin


# ---------------------------------------------------------------------------------------------
# Gradient norm, clipping, optimizers (flat arrays in ParamLayout order, updated in place)
# ---------------------------------------------------------------------------------------------


def grad_norm(flat_g: np.ndarray) -> float:
    """sqrt(sum g^2) over all parameters, accumulated in float64."""
    g = flat_g.astype(np.float64)
    return math.sqrt(float(g @ g))


def clip_scale(norm: float, clip: float | None) -> float:
    """PyTorch's clip_grad_norm_ factor min(1, clip / (norm + 1e-6)); 1 when clip is None/0."""
    if not clip:
        return 1.0
    return min(1.0, clip / (norm + 1e-6))


def _moments(g, m, v, b1, b2):
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * g * g


def adamw_step(p, g, m, v, t, lr, b1, b2, eps, wd, decay_mask):
    """One AdamW step in place (PyTorch semantics; t starts at 1)."""
    p *= 1 - lr * wd * decay_mask  # decoupled decay, only where the mask is 1
    _moments(g, m, v, b1, b2)
    denom = np.sqrt(v / (1 - b2**t)) + eps
    p -= (lr / (1 - b1**t)) * m / denom


MU_PROD_FLOOR = 2.0**-60  # below it 1 - prod == 1.0 in float64: more factors change no coefficient


def nadam_coefficients(t: int, b1: float, psi: float = 0.004) -> tuple[float, float, float]:
    """(mu_t, mu_{t+1}, prod_{i<=t} mu_i) in float64 for NAdam step t (t starts at 1).

    The product is only ever used as 1 - prod and 1 - prod * mu_{t+1}; once it is below
    MU_PROD_FLOOR those are exactly 1.0, so it stops there (a few thousand factors for b1 = 0.9)
    instead of costing O(t) per step: a step 10**7 costs what step 10**4 does."""
    mu = lambda i: b1 * (1.0 - 0.5 * 0.96 ** (np.arange(1, i + 1, dtype=np.float64) * psi))  # noqa: E731
    n = min(t, 4096)
    prod = float(np.prod(mu(n)))
    while n < t and prod >= MU_PROD_FLOOR:
        n = min(t, 2 * n)
        prod = float(np.prod(mu(n)))
    last = b1 * (1.0 - 0.5 * 0.96 ** (np.array([t, t + 1], dtype=np.float64) * psi))
    return float(last[0]), float(last[1]), prod


def nadam_step(p, g, m, v, t, lr, b1, b2, eps, wd, decay_mask, mu_t, mu_next, mu_prod):
    """One NAdam(decoupled_weight_decay=True) step in place; coefficients from nadam_coefficients."""
    p *= 1 - lr * wd * decay_mask
    _moments(g, m, v, b1, b2)
    denom = np.sqrt(v / (1 - b2**t)) + eps
    p -= (lr * (1 - mu_t) / (1 - mu_prod)) * g / denom
    p -= (lr * mu_next / (1 - mu_prod * mu_next)) * m / denom


def _normalise(a: np.ndarray) -> np.ndarray:
    return a / max(float(np.sqrt(a @ a)), 1e-12)  # floor: an all-zero block stays finite


def spectral_project(W_block, u, bound):
    """One power iteration on a [H,H] block with persistent unit vector u [H].

    Returns (W_block', u'): the block scaled by bound / sigma when sigma > bound, and new u.
    """
    v = _normalise(W_block.T @ u)  # [H]
    Wv = W_block @ v  # [H]
    u = _normalise(Wv)
    sigma = float(u @ Wv)
    if sigma > bound:
        W_block = W_block * (bound / sigma)
    return W_block, u


def spectral_project_model(flat, layout: ParamLayout, u, bound):
    """Project every gate block of every weight_ih / weight_hh in `flat`; u updated in place."""
    H = layout.spec.hidden
    for l in range(layout.spec.layers):
        for k, which in enumerate(("weight_ih", "weight_hh")):
            W = layout.view(flat, f"layers.{l}.gru.{which}")  # [3H,H] view
            for gate in range(3):
                rows = slice(gate * H, (gate + 1) * H)
                W[rows], u[l, k, gate] = spectral_project(W[rows], u[l, k, gate], bound)


# ---------------------------------------------------------------------------------------------
# One optimizer step over a list of micro-batches
# ---------------------------------------------------------------------------------------------


def reference_train_step(flat, m, v, layout: ParamLayout, micro_batches, *, global_step,
                         lr, optimizer="adamw", b1=0.9, b2=0.999, eps=1e-8, wd=0.0, clip=1.0,
                         smoothing=0.0, p_emb=0.0, p_hid=0.0, run_seed=0, clamp=None,
                         spectral_bound=None, spectral_u=None, opt_t=None) -> dict:
    """Forward/backward every micro-batch, then clip and apply one optimizer step in place.

    flat, m, v [total]: parameters and moments (ParamLayout order). micro_batches: list of
    (tokens [T,B], targets [T,B], resets [T,B], h0 [L,B,H] or None); None continues from the
    previous micro-batch's hT (zeros for the first). global_step: steps completed before this
    one (it seeds dropout); opt_t: the optimizer's step count, default global_step + 1.
    Gradients are summed and normalised by the step's total valid-target count. The update is
    skipped when that count is 0 or the norm is not finite.
    Returns dict(loss, grad_norm, clipped, skipped, clamp_hits, hT: list of [L,B,H]).
    """
    spec = layout.spec
    params = layout.unflatten(flat)
    n_valid = sum(int(np.count_nonzero(tg)) for _, tg, _, _ in micro_batches)  # host count
    g = np.zeros_like(flat)  # [total]
    loss, hits, hTs = 0.0, 0, []
    h = np.zeros((spec.layers, micro_batches[0][0].shape[1], spec.hidden), flat.dtype)
    for k, (tok, tg, rs, h0) in enumerate(micro_batches):
        h = h if h0 is None else h0
        res = model_forward_backward(params, spec, tok, tg, rs, h, n_valid, smoothing=smoothing,
                                     p_emb=p_emb, p_hid=p_hid, clamp=clamp,
                                     seed=step_seed(run_seed, global_step, k))
        g += layout.flatten(res.grads, flat.dtype)
        loss += res.loss
        hits += res.clamp_hits
        h = res.hT
        hTs.append(res.hT)
    applied = reference_apply_step(flat, g, m, v, layout, n_valid, t=global_step + 1 if opt_t is None else opt_t,
                                   lr=lr, optimizer=optimizer, b1=b1, b2=b2, eps=eps, wd=wd, clip=clip,
                                   spectral_bound=spectral_bound, spectral_u=spectral_u)
    return dict(loss=loss, clamp_hits=hits, hT=hTs, **applied)


def reference_apply_step(flat, g, m, v, layout: ParamLayout, n_valid, *, t, lr, optimizer="adamw", b1=0.9,
                         b2=0.999, eps=1e-8, wd=0.0, clip=1.0, spectral_bound=None, spectral_u=None) -> dict:
    """The update half of a step, in place: skip guard, clip, AdamW/NAdam step t, spectral projection.

    g [total] is the step's gradient already normalised by n_valid (it is scaled here, in place).
    Returns dict(grad_norm, clipped, skipped).
    """
    norm = grad_norm(g)
    out = dict(grad_norm=norm, clipped=False, skipped=True)
    if n_valid == 0 or not math.isfinite(norm):
        return out
    scale = clip_scale(norm, clip)
    g *= scale
    mask = layout.decay_mask().astype(flat.dtype)
    if optimizer == "adamw":
        adamw_step(flat, g, m, v, t, lr, b1, b2, eps, wd, mask)
    elif optimizer == "nadam":
        nadam_step(flat, g, m, v, t, lr, b1, b2, eps, wd, mask, *nadam_coefficients(t, b1))
    else:
        raise ValueError(f"unknown optimizer {optimizer!r} (expected 'adamw' or 'nadam')")
    if spectral_bound is not None:
        if spectral_u is None:
            raise ValueError("spectral_bound needs spectral_u (see catchat.model.spectral_u_init)")
        spectral_project_model(flat, layout, spectral_u, spectral_bound)
    out.update(clipped=scale < 1.0, skipped=False)
    return out
