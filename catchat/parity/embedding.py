"""Embedding lookup with row dropout, forward and backward (glsl/embedding.comp), the layer-0 table
gather/sum, and the token sums in parts (forced P, as a GPU runs them), against catchat.model.reference
(only the row scale is assembled here)."""

from __future__ import annotations

import math

import numpy as np

from catchat.model import reference
from catchat.parity import ParityResult, compare
from catchat.vk.device import Device
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.embedding import EmbeddingBackward, EmbeddingForward
from catchat.vk.slots import HP_P_EMB, HP_SEED, HP_WORDS, f32_bits


def row_scale(seed: int, V: int, H: int, p_emb: float) -> np.ndarray:
    """float32 [V]: sqrt(H) * keep / (1 - p), as reference.model_forward_backward builds it."""
    keep = reference.embedding_keep_mask(seed, V, p_emb)  # [V]
    return math.sqrt(H) * (keep / (1.0 - p_emb)).astype(np.float32)


def hyper_words(seed: int, p_emb: float) -> np.ndarray:
    """A hyper buffer [HP_WORDS] with just the embedding's slots set."""
    hyper = np.zeros(HP_WORDS, np.uint32)
    hyper[HP_SEED] = np.uint32(seed & 0xFFFFFFFF)
    hyper[HP_P_EMB] = f32_bits(p_emb)
    return hyper


def _case(rng, T, B, V, H):
    tokens = rng.integers(0, V, size=(T, B)).astype(np.uint32)  # [T,B]
    if T * B > 3:
        tokens.flat[:3] = 1  # a repeated token
    E = rng.standard_normal((V, H)).astype(np.float32)  # [V,H]
    dx = rng.standard_normal((T, B, H)).astype(np.float32)  # [T,B,H]
    dE0 = rng.standard_normal((V, H)).astype(np.float32)  # [V,H] gradient already there
    return tokens, E, dx, dE0


def run_embedding(dev: Device, tokens, E, dx, dE0, seed: int, p_emb: float, offs=(3, 16, 5)):
    """Run forward and backward once at element offsets `offs` (tokens, table, rows);
    returns (x0 [T*B,H], dE [V,H])."""
    n, (V, H) = tokens.size, E.shape
    ot, oe, ox = offs
    t_tok = dev.tensor(np.concatenate([np.full(ot, 7, np.uint32), tokens.ravel()]), np.uint32)
    t_E = dev.tensor(np.concatenate([np.zeros(oe, np.float32), E.ravel()]))
    t_dE = dev.tensor(np.concatenate([np.zeros(oe, np.float32), dE0.ravel()]))
    t_x = dev.tensor(np.zeros(ox + n * H + 4, np.float32))
    t_dx = dev.tensor(np.concatenate([np.zeros(ox, np.float32), dx.ravel()]))
    t_hyper = dev.tensor(hyper_words(seed, p_emb), np.uint32)
    fwd = EmbeddingForward(dev, (t_tok, ot), (t_E, oe), (t_x, ox), t_hyper, n, V, H)
    bwd = EmbeddingBackward(dev, (t_tok, ot), (t_dx, ox), (t_dE, oe), t_hyper, n, V, H)
    x, dE = run_ops(dev, [t_tok, t_E, t_dE, t_x, t_dx, t_hyper], [fwd.op(), *bwd.ops()], [t_x, t_dE])
    return x[ox:ox + n * H].reshape(n, H), dE[oe:].reshape(V, H)


def parity_checks(dev: Device) -> list[ParityResult]:
    """Forward and backward against catchat.model.reference at sizes around the workgroup size,
    with dropout off and on (p 0.3 drops some of the V rows)."""
    rng = np.random.default_rng(0)
    out = []
    for T, B, V, H, p in ((1, 1, 1, 1, 0.0), (5, 3, 11, 7, 0.0), (9, 7, 11, 67, 0.3),
                          (33, 4, 101, 65, 0.5), (17, 16, 101, 64, 0.1),
                          (50, 6, 3, 12, 0.2)):  # ~21 rows a token in each chunk of the backward
        tokens, E, dx, dE0 = _case(rng, T, B, V, H)
        seed = int(rng.integers(0, 2**32))
        scale = row_scale(seed, V, H, p)
        x, dE = run_embedding(dev, tokens, E, dx, dE0, seed, p)
        exp_x = reference.embedding_forward(E, tokens.astype(np.intp), scale).reshape(-1, H)
        exp_dE = dE0.copy()
        reference.embedding_backward(exp_dE, dx, tokens.astype(np.intp), scale)
        shape = f"T{T} B{B} V{V} H{H} p{p:g}"
        out.append(compare("embedding_forward", shape, x, exp_x, 1e-6, 1e-6))
        # sums of many scaled rows: FMA contraction (GPUs) moves the last bits, so the absolute
        # tolerance follows the largest sum
        out.append(compare("embedding_backward", shape, dE, exp_dE,
                           2e-6 * max(1.0, float(np.abs(exp_dE).max())), 1e-5))
    out += _table_checks(dev, rng)
    out += _parts_checks(dev, rng)
    return out


def _table_checks(dev: Device, rng) -> list[ParityResult]:
    """The layer-0 table use (rows of width 3H scaled with sqrt(H), plus a bias; a token >= V
    gives just the bias), forward and backward, at an odd width."""
    T, B, V, H, p = 6, 5, 11, 7, 0.3
    W = 3 * H
    tokens, table, dg, _ = _case(rng, T, B, V, W)
    tokens[-1, -1] = V  # out of range: zero row, no gradient
    bias = rng.standard_normal(W).astype(np.float32)
    seed = int(rng.integers(0, 2**32))
    t_tok = dev.tensor(tokens.ravel(), np.uint32)
    t_tab, t_bias = dev.tensor(table.ravel()), dev.tensor(np.concatenate([np.zeros(3, np.float32), bias]))
    t_gi, t_dg, t_dtab = dev.tensor(T * B * W), dev.tensor(dg.ravel()), dev.tensor(np.zeros(V * W, np.float32))
    t_hyper = dev.tensor(hyper_words(seed, p), np.uint32)
    fwd = EmbeddingForward(dev, (t_tok, 0), (t_tab, 0), (t_gi, 0), t_hyper, T * B, V, W, scale_h=H, bias=(t_bias, 3))
    bwd = EmbeddingBackward(dev, (t_tok, 0), (t_dg, 0), (t_dtab, 0), t_hyper, T * B, V, W, scale_h=H)
    gi, dtab = run_ops(dev, [t_tok, t_tab, t_bias, t_dg, t_dtab, t_hyper], [fwd.op(), *bwd.ops()], [t_gi, t_dtab])
    scale = np.append(row_scale(seed, V, H, p), 0.0).astype(np.float32)  # [V+1]: the last is the bad token
    tok = tokens.ravel().astype(np.intp)
    exp_gi = np.vstack([table, np.zeros((1, W), np.float32)])[tok] * scale[tok, None] + bias
    exp_dtab = np.zeros((V + 1, W))
    np.add.at(exp_dtab, tok, dg.reshape(-1, W) * scale[tok, None])
    shape = f"T{T} B{B} V{V} width{W} scale_h{H} p{p:g}"
    return [compare("embedding_table_gather", shape, gi.reshape(-1, W), exp_gi, 1e-6, 1e-6),
            compare("embedding_table_sum", shape, dtab.reshape(V, W), exp_dtab[:V], 1e-5, 1e-5)]


def run_token_sums(dev: Device, tokens, dx, dE0, seed: int, p_emb: float, parts: int, scale_h: int | None = None,
                   offs=(3, 16, 5)) -> np.ndarray:
    """The backward alone over `parts` parts of the rows, at element offsets `offs` (tokens, table,
    rows); returns dE [V,width] (dE0 [V,width] plus the sums)."""
    n, (V, W) = tokens.size, dE0.shape
    ot, oe, ox = offs
    t_tok = dev.tensor(np.concatenate([np.full(ot, 7, np.uint32), tokens.ravel()]), np.uint32)
    t_dE = dev.tensor(np.concatenate([np.zeros(oe, np.float32), dE0.ravel()]))
    t_dx = dev.tensor(np.concatenate([np.zeros(ox, np.float32), dx.ravel()]))
    t_hyper = dev.tensor(hyper_words(seed, p_emb), np.uint32)
    bwd = EmbeddingBackward(dev, (t_tok, ot), (t_dx, ox), (t_dE, oe), t_hyper, n, V, W, scale_h=scale_h, parts=parts)
    (dE,) = run_ops(dev, [t_tok, t_dE, t_dx, t_hyper], bwd.ops(), [t_dE])
    return dE[oe:].reshape(V, W)


def _parts_checks(dev: Device, rng) -> list[ParityResult]:
    """The token sums in P parts (forced: a GPU chooses its own P, a CPU device 1) at odd sizes: rows
    not a multiple of P, parts of more than one chunk of tokens (1,365 rows: a GPU's chunk is 1,024),
    more parts than rows (one row each), a few tokens of many rows (long lists of rows a chunk), the
    table's width 3H with scale_h = H, a token >= V (no gradient)."""
    out = []
    for T, B, V, H, W, p, parts in ((37, 5, 101, 67, 67, 0.3, 3), (130, 21, 101, 33, 33, 0.1, 2),
                                    (6, 5, 11, 9, 9, 0.0, 64), (60, 5, 3, 70, 70, 0.2, 4),
                                    (53, 4, 101, 13, 39, 0.3, 5)):
        tokens, _, dx, dE0 = _case(rng, T, B, V, W)
        tokens[-1, -1] = V  # out of range
        seed = int(rng.integers(0, 2**32))
        dE = run_token_sums(dev, tokens, dx, dE0, seed, p, parts, scale_h=H)
        scale = np.append(row_scale(seed, V, H, p), 0.0).astype(np.float32)  # [V+1]: the last is the bad token
        exp = np.vstack([dE0, np.zeros((1, W), np.float32)])
        reference.embedding_backward(exp, dx, tokens.astype(np.intp), scale)
        shape = f"T{T} B{B} V{V} width{W} scale_h{H} p{p:g} parts{min(parts, T * B)}"
        out.append(compare("embedding_backward_parts", shape, dE, exp[:V],
                           2e-6 * max(1.0, float(np.abs(exp).max())), 1e-5))
    return out
