"""Embedding lookup with whole-row dropout, forward and backward (glsl/embedding.comp).

    x0[t,b,:] = E[tok[t,b],:] * scale(tok[t,b]),   scale(v) = sqrt(H) * keep(v) / (1 - p_emb)
    dE[v,:]  += sum over (t,b) with tok[t,b] == v of dx0[t,b,:] * scale(v)   (token order)

keep(v) = rng_uniform(seed, 1, v) >= p_emb with seed = hyper[HP_SEED], p_emb = hyper[HP_P_EMB]
(catchat.model.reference.embedding_keep_mask): the mask changes every micro-batch without re-recording.
Tokens are a uint32 buffer [T*B] in time-major order; rows x0 / dx0 are [T*B, H] contiguous.
"""

from __future__ import annotations

import math

import numpy as np

from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div

MAX_GROUPS = 65535


def _workgroup(dev: Device) -> int:
    return 64 if dev.info.type == "CPU" else 256


def _check(tensor, off: int, n: int, what: str) -> None:
    if off < 0 or off + n > tensor.size():
        raise ValueError(f"embedding {what}: [{n}] at offset {off} exceeds its buffer of {tensor.size()}")


def _sqrt_h(scale_h: int) -> float:
    return float(np.float32(math.sqrt(scale_h)))


class EmbeddingForward(Kernel):
    """x0[T*B, H] = E[tok] * scale(tok) (+ bias) (a thread per output element, or per 4 where H and the
    offsets are multiples of 4; grid-stride).

    tokens: (uint32 tensor, offset) [T*B]; table: (tensor, offset) E [V,H] (in `params`);
    out: (tensor, offset) x0 [T*B,H], overwritten; hyper: the uint32 hyper buffer [HP_WORDS].
    A token >= V gives a zero row (plus the bias). H is the row width; scale_h (default H) the
    hidden size under scale's sqrt: the layer-0 table E @ W_ih0^T [V,3H] gathers as H=3H,
    scale_h=H, bias=(params, b_ih0 offset) into layer 0's gi.
    """

    shader = "embedding"

    def __init__(self, dev: Device, tokens, table, out, hyper, n_rows: int, V: int, H: int,
                 scale_h: int | None = None, bias=None):
        n_rows, V, H = int(n_rows), int(V), int(H)
        _check(tokens[0], tokens[1], n_rows, "tokens")
        _check(table[0], table[1], V * H, "table")
        _check(out[0], out[1], n_rows * H, "output rows")
        if bias is not None:
            _check(bias[0], bias[1], H, "bias")
        self.n_rows, self.V, self.H = n_rows, V, H
        wg = _workgroup(dev)
        # 4 elements a thread (16-byte loads and stores) where every row and offset allows: op_at moves
        # the tokens by rows and the outputs by whole rows, so H % 4 keeps them aligned
        self.vec4 = H % 4 == 0 and all(off % 4 == 0 for off in (table[1], out[1]) + ((bias[1],) if bias else ()))
        groups = min(max(1, ceil_div(n_rows * H, wg * (4 if self.vec4 else 1))), MAX_GROUPS)
        self.push = (n_rows, H, V, tokens[1], table[1], out[1], _sqrt_h(scale_h or H),
                     bias[1] if bias is not None else 0)
        defines = {"FORWARD": 1, **({"HAS_BIAS": 1} if bias is not None else {}), **({"VEC4": 1} if self.vec4 else {})}
        super().__init__(dev, [tokens[0], table[0], out[0], hyper] + ([bias[0]] if bias is not None else []),
                         [groups], spec=[wg], push=self.push, defines=defines)

    def op(self):
        return super().op(*self.push)

    def ops(self) -> list:
        return [self.op()]

    def op_at(self, row: int):
        """The dispatch for n_rows rows starting `row` rows further on, tokens and outputs alike
        (per-timestep path)."""
        p = list(self.push)
        p[3], p[5] = p[3] + int(row), p[5] + int(row) * self.H
        return super().op(*p)


class EmbeddingBackward(Kernel):
    """dE[V,H] += per-row sums of dx0[T*B,H] * scale(v) by token, in token order; no atomics.

    tokens: (uint32 tensor, offset) [T*B]; dout: (tensor, offset) dx0 [T*B,H]; dtable:
    (tensor, offset) dE [V,H] (in `grads`), accumulated; hyper: [HP_WORDS].
    Grid: ceil(H/WG) x V workgroups, each scanning all T*B tokens (see glsl/embedding.comp);
    at T*B = 65536, H = 2048, V = 101 that is 808 workgroups x 256 chunks of token tests.
    """

    shader = "embedding"

    def __init__(self, dev: Device, tokens, dout, dtable, hyper, n_rows: int, V: int, H: int,
                 scale_h: int | None = None):
        n_rows, V, H = int(n_rows), int(V), int(H)
        _check(tokens[0], tokens[1], n_rows, "tokens")
        _check(dout[0], dout[1], n_rows * H, "row gradients")
        _check(dtable[0], dtable[1], V * H, "table gradient")
        self.n_rows, self.V, self.H = n_rows, V, H
        wg = _workgroup(dev)
        grid = [max(1, ceil_div(H, wg)), max(1, V)]
        if max(grid) > MAX_GROUPS:
            raise ValueError(f"embedding backward grid {grid} exceeds {MAX_GROUPS} workgroups")
        self.push = (n_rows, H, V, tokens[1], dtable[1], dout[1], _sqrt_h(scale_h or H), 0)
        super().__init__(dev, [tokens[0], dtable[0], dout[0], hyper], grid, spec=[wg],
                         push=self.push, defines={"BACKWARD": 1})

    def op(self):
        return super().op(*self.push)
