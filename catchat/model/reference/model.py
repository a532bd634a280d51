"""The whole model's numpy twin: forward and backward over one window, the per-timestep path's
inputs under scheduled sampling, and one optimizer step over a list of micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from catchat.model import ModelSpec, ParamLayout, head_name
from catchat.model.reference.gru import force_saves, gru_layer_backward, gru_layer_forward, gru_sweep_backward
from catchat.model.reference.layers import (
    embedding_backward,
    embedding_forward,
    embedding_keep_mask,
    gemm,
    head_backward,
    head_forward,
    hidden_keep_mask,
    residual_rmsnorm_backward,
    residual_rmsnorm_forward,
)
from catchat.model.reference.loss import cross_entropy_forward_backward
from catchat.model.reference.optim import reference_apply_step
from catchat.model.reference.sampling import tf_select
from catchat.rng import step_seed

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


def dropout_scales(spec: ModelSpec, B: int, seed: int, p_emb: float, p_hid: float, dt=np.float64):
    """One micro-batch's dropout (docs/model.md) from its seed (`catchat.rng.step_seed`): the embedding
    rows' scale [V] = sqrt(H) * keep / (1 - p_emb) and each layer's variational scale of its GRU output
    [L, B, H] = keep / (1 - p_hid); p = 0 keeps everything."""
    H = spec.hidden
    row_scale = math.sqrt(H) * _dropout_scale(embedding_keep_mask(seed, spec.vocab_size, p_emb), p_emb, dt)
    hid = np.stack([_dropout_scale(hidden_keep_mask(seed, l, B, H, p_hid), p_hid, dt) for l in range(spec.layers)])
    return row_scale, hid


def model_forward_backward(params, spec: ModelSpec, tokens, targets, resets, h0, n_valid_step,
                           *, smoothing=0.0, p_emb=0.0, p_hid=0.0, seed=0, clamp=None,
                           need_grads=True, precision="fp32", recurrent="fp32", forced=None,
                           loss_scale=1.0, saves="fp32") -> Result:
    """Forward (and backward) of the whole model over one window; docs/model.md, exactly.

    params: name -> array (dtype sets the arithmetic); tokens, targets [T,B]; resets [T,B];
    h0 [L,B,H]; n_valid_step: valid targets of the whole optimizer step; seed: this
    micro-batch's dropout seed (`catchat.rng.step_seed`). precision "fp16": the GEMMs' operands
    rounded to float16 (`gemm`), layer 0's input side through table0 = E W_ih0^T as the GPU does
    (whose float16 operands are E and W_ih0, not the scaled rows x0). recurrent "fp16": the sweeps'
    products h @ W_hh^T and dGh @ W_hh too (the tensor-core sweeps, `coop=True`). forced: per layer
    (h [T,B,H], dgh [T,B,3H], saves [T,B,4H]), the operands the GPU's float16 products multiplied and
    the float16 saves its backward read, in place of the twin's own (`gru_layer_forward`'s forced_h,
    the backward's forced_dgh and cached r, z, n, ghn; dgh and saves may be None): parity of the
    tensor-core sweeps, whose float16 roundings a float32 ulp would flip. saves "fp16": the gates'
    saves rounded to float16 (`gru_layer_forward`; the streamed fp16 sweeps).
    loss_scale: the backward runs on gradients times it and unscales them at the end, as the GPU's
    fp16 step (so float16 roundings of small gradients round what the GPU rounds, not subnormals);
    the clamp applies to the scaled gradient, as the GPU's (a power of two: nothing else changes).
    """
    E = params["embedding.weight"]  # [V,H]
    dt = E.dtype
    V, H, L = spec.vocab_size, spec.hidden, spec.layers
    T, B = tokens.shape
    tokens = tokens.astype(np.intp)
    row_scale, hid_scales = dropout_scales(spec, B, seed, p_emb, p_hid, dt)  # [V], [L,B,H]
    x = embedding_forward(E, tokens, row_scale)  # [T,B,H]
    xs, gcaches, ncaches = [], [], []
    hT = np.empty((L, B, H), dt)  # [L,B,H]
    table0 = precision == "fp16"  # layer 0's input projection as a gather from E W_ih0^T
    for l in range(L):
        pre = f"layers.{l}."
        gi = None
        if l == 0 and table0:  # [T,B,3H]
            gi = embedding_forward(gemm(E, params[pre + "gru.weight_ih"].T, precision), tokens, row_scale)
            gi += params[pre + "gru.bias_ih"]
        h_l, dgh_l, saves_l = (None, None, None) if forced is None else forced[l]
        o, gc = gru_layer_forward(x, h0[l], resets, params[pre + "gru.weight_ih"],
                                  params[pre + "gru.weight_hh"], params[pre + "gru.bias_ih"],
                                  params[pre + "gru.bias_hh"], precision, gi, recurrent, forced_h=h_l,
                                  saves=saves)  # [T,B,H]
        if dgh_l is not None:
            gc["forced_dgh"] = dgh_l
        if saves_l is not None:  # the GPU's r, z, n, ghn as its backward read them
            force_saves(gc, saves_l)
        hT[l] = o[-1]
        xs.append(x)
        x, nc = residual_rmsnorm_forward(x, o, hid_scales[l], params[pre + "norm.weight"], spec.norm_eps)
        gcaches.append(gc)
        ncaches.append(nc)
    W_head = params[head_name(spec)]  # [V,H]
    logits = head_forward(x, W_head, precision)  # [T,B,V]
    loss, dlogits, top1, top5, nv = cross_entropy_forward_backward(logits, targets, n_valid_step,
                                                                   smoothing)
    if not need_grads:
        return Result(loss, logits, None, None, hT, top1, top5, nv, 0)

    grads = {k: np.zeros_like(v) for k, v in params.items()}
    dlogits = dlogits * loss_scale
    clamp = None if clamp is None else clamp * loss_scale
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
    if loss_scale != 1.0:
        grads = {k: g / loss_scale for k, g in grads.items()}
        dh0 = dh0 / loss_scale
    return Result(loss, logits, grads, dh0, hT, top1, top5, nv, hits)


# ---------------------------------------------------------------------------------------------
# Scheduled sampling: the per-timestep path's choice of inputs (docs/model.md)
# ---------------------------------------------------------------------------------------------


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
