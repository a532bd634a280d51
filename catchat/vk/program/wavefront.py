"""The batched forward pass as a wavefront over the layers (issue 35), opt-in: CATCHAT_WAVEFRONT=N.

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
"""

from __future__ import annotations

import os

from catchat.errors import UsageError
from catchat.vk.program import sequences as sq
from catchat.vk.program.kernelsets import ForwardKernels, build_rows

WAVE_ENV = "CATCHAT_WAVEFRONT"  # chunks of the window (unset or 1: the layer-by-layer forward)


def wave_chunks(T: int) -> int:
    """CATCHAT_WAVEFRONT's chunk count for a window of T steps (at most T), 1 when unset."""
    raw = os.environ.get(WAVE_ENV, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{WAVE_ENV}={raw!r} is not a number of chunks",
                         hint="set a whole number >= 2 (chunks of the window), or unset it")
    return min(int(raw), int(T))


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


def batched_forward_ops(dev, layout, b, g, f: ForwardKernels, precision: str) -> list:
    """The batched forward's ops: layer by layer (`sequences.forward_ops`), or as a wavefront of
    CATCHAT_WAVEFRONT chunks."""
    n = wave_chunks(g.T)
    return sq.forward_ops(f) if n < 2 else Wavefront(dev, layout, b, g, precision, n).forward_ops(f)
