"""The layers' numpy twins, forward and backward side by side: GEMM operands at a precision, axpby,
the dropout masks (drawn from the counter-based RNG shared with GLSL), the embedding, residual +
variational dropout + RMSNorm, the head.
"""

from __future__ import annotations

import numpy as np

from catchat.rng import STREAM_EMBEDDING, STREAM_HIDDEN, rng_uniform

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
