"""One decode step with the recurrent and input products on float16 operands: the twin of the
tensor-core decode step (glsl/decode_layer_coop.comp, catchat/vk/program/decoder.py's "coop").

The model is the one `model.model_forward_backward` runs at T = 1 without dropout; what differs is
where the GPU rounds: h_old and W_hh to float16 for gh, and for layers above the first the layer
below's (x + h) * g and W_ih to float16 for gi, whose norm scale rstd multiplies the product after
(gi = (W_ih ((x + h) g)) rstd, the same function as W_ih (RMSNorm(x + h) g)). Layer 0's input side
is table0 = E W_ih0^T in the arithmetic dtype, as the GPU's float32 table; the head is float32.
"""

from __future__ import annotations

import numpy as np

from catchat.data import vocab
from catchat.model import ModelSpec, head_name
from catchat.model.reference.gru import _sigmoid


def _half(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(a.dtype)


def decode_step_half(params: dict, spec: ModelSpec, tok: np.ndarray, h: np.ndarray):
    """tok [B] uint32, h [L, B, H] -> (logits [B, V], h_new [L, B, H]). A <bos> token starts its stream
    from a zero state; a token outside the vocabulary is a zero embedding row."""
    H, V = spec.hidden, spec.vocab_size
    tok = np.asarray(tok, np.int64)
    dt = h.dtype
    E = params["embedding.weight"].astype(dt)
    known = (tok < V)[:, None]
    rows = np.where(known, E[np.minimum(tok, V - 1)], 0.0)
    keep = (tok != vocab.BOS)[:, None].astype(dt)
    sqrt_h = np.sqrt(dt.type(H))
    h_new = np.empty_like(h)
    y = g = None
    for l in range(spec.layers):
        p = {k: params[f"layers.{l}.{k}"].astype(dt) for k in ("gru.weight_ih", "gru.weight_hh", "gru.bias_ih",
                                                                  "gru.bias_hh", "norm.weight")}
        hold = h[l] * keep
        gh = keep * (_half(hold) @ _half(p["gru.weight_hh"]).T) + p["gru.bias_hh"]
        if l == 0:
            x = rows * sqrt_h
            gi = (rows @ p["gru.weight_ih"].T) * sqrt_h + p["gru.bias_ih"]  # table0's row times sqrt(H)
        else:
            rstd = 1 / np.sqrt((y * y).mean(-1, keepdims=True) + spec.norm_eps)
            x = y * rstd * g
            gi = (_half(y * g) @ _half(p["gru.weight_ih"]).T) * rstd + p["gru.bias_ih"]
        r = _sigmoid(gi[:, :H] + gh[:, :H])
        z = _sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
        n = np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
        h_new[l] = (1 - z) * n + z * hold
        y, g = x + h_new[l], p["norm.weight"]
    rstd = 1 / np.sqrt((y * y).mean(-1, keepdims=True) + spec.norm_eps)
    logits = (y * rstd * g) @ params[head_name(spec)].astype(dt).T
    return logits, h_new
