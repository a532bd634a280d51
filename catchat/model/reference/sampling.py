"""Choosing tokens, the shaders' twins rule for rule: scheduled sampling's input choice (tf_select.comp)
and generation's next-token choice (decode_sample.comp).
"""

from __future__ import annotations

import numpy as np

from catchat.data import vocab
from catchat.rng import STREAM_TF_COIN, STREAM_TF_SAMPLE, rng_uniform

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
