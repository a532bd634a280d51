"""One decode step with the recurrent and input products on float16 operands: the twin of the
tensor-core decode step (glsl/decode_layer_coop.comp, catchat/vk/program/decoder.py's "coop").

The model is the one `model.model_forward_backward` runs at T = 1 without dropout, from the same
pieces (embedding, `gru_layer_forward`, residual + RMSNorm, head); what differs is where the GPU
rounds: h_old and W_hh to float16 for gh (`recurrent="fp16"`), and for layers above the first the
layer below's (x + h) * g and W_ih to float16 for gi, whose norm scale rstd multiplies the product
after (gi = (W_ih ((x + h) g)) rstd, the same function as W_ih (RMSNorm(x + h) g)). Layer 0's input
side is table0 = E W_ih0^T in the arithmetic dtype, as the GPU's float32 table; the head is float32.
"""

from __future__ import annotations

import numpy as np

from catchat.data import vocab
from catchat.model import ModelSpec, head_name
from catchat.model.reference.gru import gru_layer_forward
from catchat.model.reference.layers import embedding_forward, gemm, head_forward, residual_rmsnorm_forward
from catchat.model.reference.model import dropout_scales


def decode_step_half(params: dict, spec: ModelSpec, tok: np.ndarray, h: np.ndarray):
    """tok [B] token ids (within the vocabulary), h [L, B, H] -> (logits [B, V], h_new [L, B, H]). A <bos>
    token starts its stream from a zero state."""
    dt = h.dtype
    p = {k: v.astype(dt) for k, v in params.items()}
    tokens = np.asarray(tok, np.intp)[None]  # [1, B]
    resets = (tokens == vocab.BOS).astype(np.uint32)
    row_scale, hid_scale = dropout_scales(spec, tokens.shape[1], 0, 0.0, 0.0, dt)  # sqrt(H) rows, no dropout
    E = p["embedding.weight"]
    x = embedding_forward(E, tokens, row_scale)  # [1, B, H]
    h_new = np.empty_like(h)
    norm = None  # the layer below's residual + RMSNorm cache: y = x + h, rstd, g
    for l in range(spec.layers):
        pre = f"layers.{l}."
        w_ih, b_ih = p[pre + "gru.weight_ih"], p[pre + "gru.bias_ih"]
        if norm is None:  # layer 0: table0's row times sqrt(H)
            gi = embedding_forward(E @ w_ih.T, tokens, row_scale) + b_ih
        else:
            gi = gemm(norm["y"] * norm["g"], w_ih.T, "fp16") * norm["rstd"] + b_ih
        o, _ = gru_layer_forward(x, h[l], resets, w_ih, p[pre + "gru.weight_hh"], b_ih, p[pre + "gru.bias_hh"],
                                 gi=gi, recurrent="fp16")
        h_new[l] = o[0]
        x, norm = residual_rmsnorm_forward(x, o, hid_scale[l], p[pre + "norm.weight"], spec.norm_eps)
    return head_forward(x, p[head_name(spec)])[0], h_new
