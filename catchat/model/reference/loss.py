"""The loss's numpy twin: PyTorch's cross_entropy(label_smoothing=e), pad targets masked.
"""

from __future__ import annotations

import numpy as np

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
