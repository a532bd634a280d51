"""The optimizer's numpy twins on flat arrays in ParamLayout order, updated in place: gradient norm,
clipping, AdamW and NAdam, the spectral bound, and the update half of a step.
"""

from __future__ import annotations

import math

import numpy as np

from catchat.model import ParamLayout

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
# The update half of a step: skip guard, clip, optimizer, spectral projection
# ---------------------------------------------------------------------------------------------


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
