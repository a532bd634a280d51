"""Embedding lookup with whole-row dropout, forward and backward (glsl/embedding.comp).

    x0[t,b,:] = E[tok[t,b],:] * scale(tok[t,b]),   scale(v) = sqrt(H) * keep(v) / (1 - p_emb)
    dE[v,:]  += sum over (t,b) with tok[t,b] == v of dx0[t,b,:] * scale(v)   (token order)

keep(v) = rng_uniform(seed, 1, v) >= p_emb with seed = hyper[HP_SEED], p_emb = hyper[HP_P_EMB]
(catchat.model.reference.embedding_keep_mask): the mask changes every micro-batch without re-recording.
Tokens are a uint32 buffer [T*B] in time-major order; rows x0 / dx0 are [T*B, H] contiguous.

The backward's token sums split the T*B rows into P contiguous parts on a GPU (`token_sum_parts`):
each part's sums go to a private workspace [P,V,H], which a second dispatch adds to dE in part
order. A text's frequent characters (space, 'e': 10-17% of the rows) otherwise leave a few
workgroups walking most of the rows while the rest idle. One part (a CPU device) is a single
dispatch in numpy's order; CATCHAT_TOKEN_SUM_PARTS=N forces N parts (1: the single dispatch).
"""

from __future__ import annotations

import math

import numpy as np

from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div
from catchat.vk.switches import env_count

MAX_GROUPS = 65535
PARTS_ENV = "CATCHAT_TOKEN_SUM_PARTS"  # N: the token sums over N parts of the rows (1: one dispatch)
# Rows of a part on a GPU (`token_sum_parts`). On an H100 (v3, v5 and both sums; text-like tokens, a
# character in 6 a space, and uniform ones): 2,048 was within ~15% of the best of 1,024-8,192 but for
# v5's table0 sum (uniform: 426 us against 375 at 4,096); shorter parts add partials to write and read,
# longer ones leave a frequent character's walk the last to finish.
PART_ROWS = 2048


def _workgroup(dev: Device) -> int:
    return 64 if dev.info.type == "CPU" else 256


def _check(tensor, off: int, n: int, what: str) -> None:
    if off < 0 or off + n > tensor.size():
        raise ValueError(f"embedding {what}: [{n}] at offset {off} exceeds its buffer of {tensor.size()}")


def _sqrt_h(scale_h: int) -> float:
    return float(np.float32(math.sqrt(scale_h)))


def token_sum_parts(dev: Device, n_rows: int, V: int, H: int) -> int:
    """Parts of the backward's n_rows rows (rows of width H, V tokens): CATCHAT_TOKEN_SUM_PARTS where
    set, 1 on a CPU device, else parts of PART_ROWS rows (one below 2 * PART_ROWS), fewer where the
    partials [P,V,H] would pass a quarter of dX's bytes (V > PART_ROWS / 4 = 512). v3 (65,536 rows): 32
    parts, v5 (32,768): 16. `_part_rows` evens them out (none empty)."""
    forced = env_count(PARTS_ENV, "unset it, or set the parts of the embedding's token sums (1: one dispatch)")
    if forced is not None:
        return _part_rows(n_rows, forced)[0]
    if dev.info.type == "CPU":
        return 1
    return _part_rows(n_rows, max(1, min(n_rows // PART_ROWS, n_rows // (4 * max(V, 1)))))[0]


def _part_rows(n_rows: int, parts: int) -> tuple[int, int]:
    """(P, rows of each part but the last) for about `parts` parts of n_rows rows: each non-empty, P at
    most MAX_GROUPS."""
    rows = ceil_div(max(n_rows, 1), min(max(1, int(parts)), MAX_GROUPS))
    return ceil_div(max(n_rows, 1), rows), rows


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
    (tensor, offset) dE [V,H] (in `grads`), accumulated; hyper: [HP_WORDS]; parts: P (default
    `token_sum_parts`). Grid: ceil(H/WG) x V x P workgroups, each testing the tokens of its part of
    the rows (see glsl/embedding.comp). P = 1: one dispatch, dE summed in token order from its old
    value. P > 1: part p's sums into the private workspace `work` [P,V,H], then `_SumParts` adds
    dE + part 0 + part 1 + ... (the program counts `scratch_words` in its memory plan).
    `ops()` gives the dispatches in order; `op()` the single one when P == 1.
    """

    shader = "embedding"

    @staticmethod
    def scratch_words(dev: Device | None, n_rows: int, V: int, H: int) -> int:
        """Words of the private partials [P,V,H] (0 with one part; dev None: as on a CPU device)."""
        parts = 1 if dev is None else token_sum_parts(dev, n_rows, V, H)
        return 0 if parts == 1 else parts * V * H

    def __init__(self, dev: Device, tokens, dout, dtable, hyper, n_rows: int, V: int, H: int,
                 scale_h: int | None = None, parts: int | None = None):
        n_rows, V, H = int(n_rows), int(V), int(H)
        _check(tokens[0], tokens[1], n_rows, "tokens")
        _check(dout[0], dout[1], n_rows * H, "row gradients")
        _check(dtable[0], dtable[1], V * H, "table gradient")
        self.n_rows, self.V, self.H = n_rows, V, H
        self.parts, rows = _part_rows(n_rows, token_sum_parts(dev, n_rows, V, H) if parts is None else parts)
        wg = _workgroup(dev)
        grid = [max(1, ceil_div(H, wg)), max(1, V), self.parts]
        if max(grid) > MAX_GROUPS:
            raise ValueError(f"embedding backward grid {grid} exceeds {MAX_GROUPS} workgroups")
        self.work = self.second = None
        if self.parts == 1:
            out, e_off = dtable  # added into dE
        else:  # each part's sums written to its [V,H] of the workspace
            out, e_off = dev.tensor(self.parts * V * H, kind="storage"), 0
            self.work = out
            self.second = _SumParts(dev, dtable, out, self.parts, V * H, wg)
        self.push = (n_rows, H, V, tokens[1], e_off, dout[1], _sqrt_h(scale_h or H), 0, rows,
                     1 if self.parts == 1 else 0)
        super().__init__(dev, [tokens[0], out, dout[0], hyper], grid, spec=[wg],
                         push=self.push, defines={"BACKWARD": 1})

    def op(self):
        if self.second is not None:
            raise ValueError("these token sums run in parts: record every op of ops() in order")
        return super().op(*self.push)

    def ops(self) -> list:
        first = super().op(*self.push)
        return [first] if self.second is None else [first, self.second.op()]


class _SumParts(Kernel):
    """Second pass of the token sums in parts: dE[n] = dE[n] + part 0 [n] + ... + part P-1 [n], in
    order (a thread per element; grid-stride)."""

    shader = "embedding"

    def __init__(self, dev: Device, dtable, work, parts: int, n: int, wg: int):
        self.push = (n, parts, dtable[1])
        groups = min(max(1, ceil_div(n, wg)), MAX_GROUPS)
        super().__init__(dev, [dtable[0], work], [groups], spec=[wg], push=self.push, defines={"SUM_PARTS": 1})

    def op(self):
        return super().op(*self.push)
