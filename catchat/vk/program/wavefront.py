"""The batched forward pass as a wavefront over the layers (issue 35), and a training step's backward: each by
default where two of its sweeps fit the GPU at once (`forward_default`, `default_chunks`), else with
CATCHAT_WAVEFRONT=N.

The window is cut into N chunks of timesteps. Wave w runs chunk w - l of every layer l that has
one, so layer l's sweep over chunk c runs beside layer l+1's over chunk c-1 instead of after the
whole window of layer l. A wave is three stages, each a group of independent dispatches recorded
side by side (`sequences.side_by_side`, kp patch 0007), the stages ordered by the barrier before
each stage's first dispatch:
  1. the inputs: layer 0's embedding and table0 gather for its chunk, each layer l > 0's input
     projection (a GEMM over the chunk's rows) from x[l], which layer l-1's norm wrote a wave before;
  2. the recurrent sweeps over the chunks' steps (`GruForward.steps_ops`: a persistent dispatch
     each, which continues from the state the chunk before left);
  3. the residual RMSNorms, writing x[l+1] for the next layer's next wave.
No two dispatches of a stage touch the same rows: the layers' chunks differ, and every buffer the
layers share (gi) is written by rows. The head runs over the whole window after the last wave.
The operations are the batched forward's on row blocks, so the results are the layer-by-layer
pass's (up to a GEMM tile's choice for the chunk's rows). Persistent sweeps side by side must fit
on the GPU together to overlap; where they do not, the later ones wait (slower, never wrong):
tools/bench_concurrency.py measures what overlaps.

The backward runs the same way from the top chunk down (`WavefrontBackward`, with float32 saves:
float16 saves keep dGh's n third in one buffer for all layers): after the head's gradients over the
window, wave w runs chunk n-1 - (w - (L-1-l)) of every layer l in three stages: the norms' backward
over the chunk's rows (side by side), the backward sweeps over its steps (side by side,
`GruBackward.steps_ops`), then, one after another, each layer l > 0's input gradient (dx), dW_ih and
db_ih over the chunk's rows, which read the chunk's dGi before the layer below overwrites it in the
shared gi (split-K partials in x[L], whose do rows are dead by then). The rest waits for the window:
the norms' dg reduce (the chunks wrote the whole window's partials), dW_hh and db_hh (from save[l]),
layer 0's bias, table0 and embedding gradients (layer 0 writes gi and dx last). Where the streamed
sweeps sum the bias gradients themselves (BIAS_SUMS), no chunk sums db_ih: both biases' column sums
over the sweep's [B, 6H] follow the window. The chunks start on
the norm's row blocks (`backward_bounds`); dW_ih and db_ih summed chunk by chunk change their
rounding, the rest gives the layer-by-layer bits. CATCHAT_WAVEFRONT_FORWARD=0 (or _BACKWARD=0) runs
that direction layer by layer: at v3's 64 lanes the resident forward fills the GPU, two streamed
sweeps of either direction fit it (so two layers or more stream both: `gru.program_products`).
"""

from __future__ import annotations

from math import gcd
from typing import NamedTuple

from catchat.model import ParamLayout
from catchat.vk.kernels import device_sms
from catchat.vk.kernels.gemm import ColSum, Gemm, gemm_split_k
from catchat.vk.program import sequences as sq
from catchat.vk.program.kernelsets import BackwardKernels, ForwardKernels, build_rows
from catchat.vk.switches import env_count, env_switch

WAVE_ENV = "CATCHAT_WAVEFRONT"  # chunks of the window (unset or 1: the layer-by-layer forward)
WAVE_BACKWARD_ENV = "CATCHAT_WAVEFRONT_BACKWARD"  # 0: the wavefront forward with the layer-by-layer backward
WAVE_FORWARD_ENV = "CATCHAT_WAVEFRONT_FORWARD"  # 0: the layer-by-layer forward with the wavefront backward


# The default where two backward sweeps fit the GPU at once (`default_chunks`): a training step's backward
# as a wavefront of 4 chunks; the forward stays layer by layer unless CATCHAT_WAVEFRONT is set
# (`forward_chunks`). H100, fp16, one process each (docs/results/2026-12-06-h100-speedrun-fp16-wave*.json,
# -catchat-v3-fp16-wave*.json): configs/speedrun.toml (L = 4) 50.3-51.7 ms a step layer by layer, 47.5-47.8
# with 8 chunks, 46.0-46.4 with 4 (46.2 with the forward layer by layer), 51.0 with 16; v3 38.9-39.1 against
# 35.7 with 4 (35.8 backward only). tools/bench_concurrency.py in the same session: two of v3's 64-workgroup
# backward sweeps side by side take 6.9 ms against 10.9 in order; its 128-workgroup resident forward sweeps
# do not overlap at all; two of its 64-workgroup streamed forward sweeps take 6.7 ms side by side against 12.2 in
# order (-catchat-v3-fp16-concurrency-stream32.json), hence `forward_default` on those.
DEFAULT_CHUNKS = 4


def wave_chunks(T: int, default: int = 1) -> int:
    """CATCHAT_WAVEFRONT's chunk count for a window of T steps (at most T), `default` when unset."""
    chunks = env_count(WAVE_ENV, "set a whole number >= 2 (chunks of the window), or 1 (layer by layer)")
    return min(default if chunks is None else chunks, int(T))


def default_chunks(dev, g, k: BackwardKernels | None) -> int:
    """DEFAULT_CHUNKS for a training program whose backward can run as a wavefront (`waveable`) with each
    sweep on at most half the GPU's SMs (so two run at once); else 1 (layer by layer)."""
    if k is None or not waveable(g, k):
        return 1
    return DEFAULT_CHUNKS if two_at_once(dev, [lay.gru for lay in k.layers]) else 1


def forward_default(dev, g, f: ForwardKernels) -> int:
    """DEFAULT_CHUNKS for a program whose forward sweeps stream with float32 saves ("stream32",
    `gru.program_products`) over two layers or more, each persistent on at most half the GPU's SMs; else 1.
    The resident forward sweeps fill the GPU, so their wavefront gained nothing (docs/benchmarks.md
    "The wavefront by default"). Training and eval programs alike, so a run's evals are the eval program's."""
    return DEFAULT_CHUNKS if g.products == "stream32" and g.L >= 2 and two_at_once(dev, f.gru) else 1


def two_at_once(dev, sweeps) -> bool:
    """Whether every sweep is persistent on at most half the GPU's SMs, so two of them run at once."""
    sms = device_sms(dev)
    return bool(sms) and all(0 < s.sweep_workgroups <= sms // 2 for s in sweeps)


def waveable(g, k: BackwardKernels) -> bool:
    """Whether the backward can run as a wavefront at all: float32 saves (float16 saves keep dGh's n third
    in one buffer for all layers), two layers or more, every sweep persistent."""
    return not g.save16 and g.L >= 2 and all(lay.gru.sweep_workgroups for lay in k.layers)


def chunk_bounds(T: int, n: int) -> list[tuple[int, int]]:
    """[t0, t1) of each of n chunks of T steps: equal ones of ceil(T / n), the last what is left."""
    size = -(-T // n)
    return [(t0, min(t0 + size, T)) for t0 in range(0, T, size)]


class Wavefront:
    """The row kernels of a wavefront forward: over a chunk's rows, and over the last chunk's where it
    is shorter (a kernel's row count is fixed; `op_at` moves it along the window)."""

    def __init__(self, dev, layout, b, g, precision: str, n_chunks: int):
        self.dev, self.B, self.bounds = dev, g.B, chunk_bounds(g.T, n_chunks)
        sizes = sorted({t1 - t0 for t0, t1 in self.bounds})
        self.rows = {size: build_rows(dev, layout, b, g, size * g.B, precision, split=False) for size in sizes}

    def _inputs(self, l: int, t0: int, t1: int) -> list[list]:
        r, row = self.rows[t1 - t0], t0 * self.B
        return [[r.embedding.op_at(row)], [r.proj[0].op_at(row)]] if l == 0 else [[r.proj[l].op_at(row)]]

    def forward_ops(self, f: ForwardKernels) -> list:
        """Every wave's three stages, then the head over the window."""
        L, n, ops = len(f.gru), len(self.bounds), []
        for w in range(n + L - 1):
            active = [(l, *self.bounds[w - l]) for l in range(L) if 0 <= w - l < n]
            ops += sq.side_by_side(self.dev, [grp for l, t0, t1 in active for grp in self._inputs(l, t0, t1)])
            ops += sq.side_by_side(self.dev, [f.gru[l].steps_ops(t0, t1) for l, t0, t1 in active])
            ops += sq.side_by_side(self.dev, [[self.rows[t1 - t0].norm[l].op_at(t0 * self.B)]
                                              for l, t0, t1 in active])
        return ops + f.rows.head.ops()


def _direction_on(env: str) -> bool:
    """CATCHAT_WAVEFRONT_FORWARD / _BACKWARD: unset or 1 runs that direction as a wavefront, 0 layer by layer
    (the wavefront of one direction alone: on the GPU, which one's sweeps overlap)."""
    return env_switch(env, "set 0 (layer by layer) or 1, or unset it", True)


def backward_bounds(T: int, n: int, B: int, rows_per_part: int) -> list[tuple[int, int]]:
    """chunk_bounds of the backward: chunks of a whole number of the norm backward's row blocks
    (rows_per_part rows: each chunk starts on one), so at most n of them, maybe fewer."""
    q = rows_per_part // gcd(rows_per_part, B)  # steps per row block boundary
    per_chunk = -(-T // n)  # steps: chunk_bounds' size, rounded up to whole blocks
    size = q * -(-per_chunk // q)
    return [(t0, min(t0 + size, T)) for t0 in range(0, T, size)]


class ChunkGrads(NamedTuple):
    """A layer's gradients over a chunk's rows that read its dGi (the wavefront backward's third stage)."""

    dx: Gemm  # dx += dGi @ W_ih (op_at)
    dw_ih: Gemm  # dW_ih += dGi^T x (ops_k_at; split-K partials in x[L])
    db_ih: ColSum | None  # db_ih += column sums of dGi (ops_at); None where the sweep sums it (after the window)


class WavefrontBackward:
    """The kernels of a wavefront backward over row chunks (the module docstring): per chunk size,
    each layer l > 0's `ChunkGrads`."""

    def __init__(self, dev, layout: ParamLayout, b, g, k: BackwardKernels, precision: str, n_chunks: int):
        self.dev, self.B = dev, g.B
        self.bounds = backward_bounds(g.T, n_chunks, g.B, k.layers[0].norm.rows_per_wg)
        o, H, L = layout.offsets, g.H, g.L
        self.rows: dict[int, list[ChunkGrads | None]] = {}
        for size in sorted({t1 - t0 for t0, t1 in self.bounds}):
            R = size * g.B
            split = min(gemm_split_k(dev, 3 * H, H, R), max(1, g.R // (3 * H)))  # partials in x[L] [T,B,H]
            per_layer = [None]
            for l in range(1, L):
                p = f"layers.{l}."
                per_layer.append(ChunkGrads(
                    Gemm(dev, (b.gi, 0, 3 * H), (b.params, o[p + "gru.weight_ih"], H), (b.dx, 0, H), R, H, 3 * H,
                         beta=1.0, precision=precision),
                    Gemm(dev, (b.gi, 0, 3 * H), (b.x[l], 0, H), (b.grads, o[p + "gru.weight_ih"], H), 3 * H, H, R,
                         trans_a=True, beta=1.0, split_k=split, workspace=b.x[L], precision=precision),
                    None if k.layers[l].gru.bias_sums is not None else
                    ColSum(dev, (b.gi, 0, 3 * H), (b.grads, o[p + "gru.bias_ih"]), R, 3 * H, g.colsum, b.ws_cs)))
            self.rows[size] = per_layer

    def _waves(self, L: int):
        n = len(self.bounds)
        for w in range(n + L - 1):
            yield [(l, *self.bounds[n - 1 - (w - (L - 1 - l))]) for l in range(L - 1, -1, -1)
                   if 0 <= w - (L - 1 - l) < n]

    def backward_ops(self, k: BackwardKernels) -> list:
        """The head's gradients, every wave's three stages, then what waits for the window. With
        `k.overlap_dw_hh` (dW_hh's split-K partials in ws) the dW_hh GEMM of the layer that finished
        in a wave runs beside the next wave's sweeps (it reads save[l] and o[l], which are final)."""
        ops, L, beside = k.head_dx.ops() + k.head_dw.ops(), len(k.layers), set()
        for active in self._waves(L):
            ops += sq.side_by_side(self.dev, [[k.layers[l].norm.rows_op_at(t0 * self.B, (t1 - t0) * self.B)]
                                              for l, t0, t1 in active])
            finished = [l for l in range(L) if l > active[0][0] and l not in beside] if k.overlap_dw_hh else []
            beside.update(finished)
            ops += sq.side_by_side(self.dev, [k.layers[l].gru.steps_ops(t0, t1) for l, t0, t1 in active]
                                   + [k.layers[l].dw_hh.ops() for l in finished])
            for l, t0, t1 in active:
                if l > 0:
                    c, row = self.rows[t1 - t0][l], t0 * self.B
                    ops += [c.dx.op_at(row)] + c.dw_ih.ops_k_at(row) + (c.db_ih.ops_at(row) if c.db_ih else [])
        for l in range(L - 1, -1, -1):
            lay = k.layers[l]
            ops += [lay.norm.reduce_op()] + ([] if l in beside else lay.dw_hh.ops()) + lay.db_hh.ops()
            if l > 0 and lay.gru.bias_sums is not None:  # no chunk summed db_ih: the sweep's sums do
                ops += lay.db_ih.ops()
        t0 = k.table0
        return ops + k.layers[0].db_ih.ops() + k.token_sum_ops() + t0.dw_ih.ops() + t0.demb.ops()


def batched_ops(dev, layout, b, g, f: ForwardKernels, k: BackwardKernels | None, precision: str) -> tuple:
    """The batched forward's ops and the backward's (None for a forward-only program): layer by layer
    (`sequences.forward_ops`, `sequences.backward_ops`), or as wavefronts of CATCHAT_WAVEFRONT chunks (the
    backward's where its saves are float32 and its sweeps persistent, and the chunks at least two)."""
    n, nf = wave_chunks(g.T, default_chunks(dev, g, k)), forward_chunks(dev, g, f)
    fwd = Wavefront(dev, layout, b, g, precision, nf).forward_ops(f) if nf >= 2 else sq.forward_ops(f)
    if k is None:
        return fwd, None
    if not backward_wave(g, k, n):
        return fwd, sq.backward_ops(k, dev)
    return fwd, WavefrontBackward(dev, layout, b, g, k, precision, n).backward_ops(k)


def forward_chunks(dev, g, f: ForwardKernels) -> int:
    """The forward's wavefront chunks: CATCHAT_WAVEFRONT's, else `forward_default`'s; 1 with
    CATCHAT_WAVEFRONT_FORWARD=0."""
    n = wave_chunks(g.T, forward_default(dev, g, f))
    return n if n >= 2 and _direction_on(WAVE_FORWARD_ENV) else 1


def backward_wave(g, k: BackwardKernels, n: int) -> bool:
    """Whether the backward runs as a wavefront of n chunks: `waveable`, CATCHAT_WAVEFRONT_BACKWARD not 0, and
    two chunks or more on the norm's row blocks."""
    if n < 2 or not waveable(g, k):
        return False
    return _direction_on(WAVE_BACKWARD_ENV) and len(backward_bounds(g.T, n, g.B, k.layers[0].norm.rows_per_wg)) > 1


def recording_info(dev, g, f: ForwardKernels, k: BackwardKernels | None) -> dict:
    """How a program's step is recorded beyond its kernels (a run's start event, so that a resume under
    other settings shows in events.jsonl): the wavefront's chunks per direction (1: layer by layer) and
    whether each dW_hh runs beside the sweep below."""
    n, training = wave_chunks(g.T, default_chunks(dev, g, k)), k is not None
    waved = training and backward_wave(g, k, n)
    return dict(wavefront_forward=forward_chunks(dev, g, f),
                wavefront_backward=len(backward_bounds(g.T, n, g.B, k.layers[0].norm.rows_per_wg)) if waved else 1,
                dw_hh_beside=training and any(sq.dw_hh_beside(k, l) for l in range(1, g.L)))
