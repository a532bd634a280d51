"""Residual + variational dropout + RMSNorm, forward and backward (glsl/rmsnorm.comp).

Rows r = t * B + b of H floats, time-major. The hidden dropout scale
hidscale[b,j] = dropout_scale(seed, 16 + layer, b * H + j, p_hid) (seed, p_hid from `hyper`) is
recomputed in both directions, never stored; the backward recomputes y = x + o * hidscale from
the layer input x and GRU output o (both kept for the GEMMs anyway), so only rstd is saved.
"""

from __future__ import annotations

from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div

MAX_WORKGROUPS = 65535  # per dimension (lavapipe's limit; NVIDIA's is larger)


def _row_workgroup(dev: Device, H: int, wg: int | None) -> tuple[int, int]:
    """(threads per workgroup, columns per thread): a power of two in [32, 256] covering H."""
    if wg is None:
        wg = min(256, max(32, 1 << (int(H) - 1).bit_length()))
    wg = min(int(wg), dev.info.max_workgroup_invocations)
    return wg, ceil_div(H, wg)


class ResidualRmsNormForward(Kernel):
    """out = RMSNorm(x + o * hidscale) * g for rows of H floats; saves rstd.

    x, o, out: float32 [T,B,H] at x_off, o_off, out_off; params: g = norm.weight [H] at g_off;
    hyper: uint32 [HP_WORDS] (HP_SEED, HP_P_HID); rstd: float32 [T*B] at rstd_off.
    out may alias x (each element is read, then written, by one thread) but the backward needs x.
    """

    shader = "rmsnorm"

    def __init__(self, dev: Device, x, o, params, hyper, out, rstd, *, T: int, B: int, H: int,
                 layer: int, g_off: int, eps: float = 1e-6, x_off: int = 0, o_off: int = 0,
                 out_off: int = 0, rstd_off: int = 0, wg: int | None = None, rows_per_wg: int | None = None):
        R = int(T) * int(B)
        wg, cols = _row_workgroup(dev, H, wg)
        rpw = rows_per_wg or max(1, ceil_div(R, 32768))
        n_wg = ceil_div(R, rpw)
        if n_wg > MAX_WORKGROUPS:
            raise ValueError(f"{n_wg} workgroups exceed {MAX_WORKGROUPS}: raise rows_per_wg")
        self.push = (R, B, H, layer, rpw, x_off, o_off, g_off, out_off, rstd_off, float(eps))
        super().__init__(dev, [x, o, params, hyper, out, rstd], [n_wg], spec=[wg, cols],
                         push=self.push, defines={"FORWARD": 1})

    def __call__(self):
        return self.op(*self.push)

    def op_at(self, row: int):
        """The dispatch for the rows starting at row `row` (a multiple of B: the lane of row r is
        r mod B), with x, o, out and rstd all moved by that many rows (per-timestep path)."""
        p = list(self.push)
        H = p[2]
        p[5], p[6], p[8], p[9] = p[5] + row * H, p[6] + row * H, p[8] + row * H, p[9] + row
        return self.op(*p)

    def ops(self):
        return [self()]


class ResidualRmsNormBackward:
    """Backward of ResidualRmsNormForward: two dispatches, `ops()` in this order.

    1. rows (BACKWARD): dx = dy, do = dy * hidscale (both WRITTEN, [T,B,H] at dx_off, do_off),
       and per-workgroup partial dg into a private scratch [n_wg, H] (row order inside).
    2. reduce (DG_REDUCE): grads[g_off + j] += sum of the partials in workgroup order.
    Deterministic: no float atomics. Inputs: x, o [T,B,H]; params (g at g_off); hyper;
    rstd [T*B] from the forward; dout [T,B,H] (may alias dx). The integrator then adds the GRU's
    dx into dx (GEMM with beta = 1).
    """

    @staticmethod
    def rows_per_workgroup(R: int, rows_per_wg: int | None = None) -> int:
        return rows_per_wg or max(8, ceil_div(R, 1024))  # <= 1024 partial rows of dg

    @classmethod
    def scratch_words(cls, R: int, H: int, rows_per_wg: int | None = None) -> int:
        """Words of the private dg partials [n_parts, H] (the program's memory plan reads this)."""
        return ceil_div(R, cls.rows_per_workgroup(R, rows_per_wg)) * H

    def __init__(self, dev: Device, x, o, params, hyper, rstd, dout, dx, do, grads, *, T: int, B: int,
                 H: int, layer: int, g_off: int, x_off: int = 0, o_off: int = 0, rstd_off: int = 0,
                 dout_off: int = 0, dx_off: int = 0, do_off: int = 0, wg: int | None = None,
                 rows_per_wg: int | None = None):
        R = int(T) * int(B)
        wg, cols = _row_workgroup(dev, H, wg)
        self.rows_per_wg = rpw = self.rows_per_workgroup(R, rows_per_wg)
        self.n_parts = ceil_div(R, rpw)
        if self.n_parts > MAX_WORKGROUPS:
            raise ValueError(f"{self.n_parts} workgroups exceed {MAX_WORKGROUPS}: raise rows_per_wg")
        self.dgpart = dev.tensor(self.n_parts * H, kind="storage")  # [n_parts, H] scratch
        self.rows_push = (R, B, H, layer, rpw, x_off, o_off, g_off, rstd_off, dout_off, dx_off, do_off, 0)
        self._rows_args = (dev, [x, o, params, hyper, rstd, dout, dx, do, self.dgpart], [wg, cols])
        self.rows = self._rows_kernel(self.n_parts)
        self.reduce_push = (H, self.n_parts, g_off)
        self.reduce = Kernel(dev, [self.dgpart, grads], [ceil_div(H, 64)], spec=[64, 1],
                             push=self.reduce_push, defines={"DG_REDUCE": 1}, shader="rmsnorm")
        self._chunks: dict[int, Kernel] = {}

    def _rows_kernel(self, groups: int) -> Kernel:
        dev, tensors, spec = self._rows_args
        return Kernel(dev, tensors, [groups], spec=spec, push=self.rows_push, defines={"BACKWARD": 1},
                      shader="rmsnorm")

    def ops(self):
        return [self.rows.op(*self.rows_push), self.reduce.op(*self.reduce_push)]

    def rows_op_at(self, row0: int, rows: int):
        """The first dispatch over rows [row0, row0 + rows) alone (the layer wavefront's chunk; row0 a
        multiple of B and of the rows per workgroup): each workgroup writes the whole window's partial of
        its rows, so the chunks' dispatches and then `reduce_op()` give `ops()`'s bits."""
        rpw, R = self.rows_per_wg, self.rows_push[0]
        if row0 % rpw or row0 % self.rows_push[1] or not 0 < rows <= R - row0:
            raise ValueError(f"rows [{row0}, {row0 + rows}) are not a chunk of {R} rows in blocks of {rpw}")
        groups = ceil_div(rows, rpw)
        if groups not in self._chunks:
            self._chunks[groups] = self._rows_kernel(groups)
        p = list(self.rows_push)
        p[0], p[-1] = row0 + rows, row0
        return self._chunks[groups].op(*p)

    def reduce_op(self):
        """The second dispatch: the partials into the norm weight's gradient."""
        return self.reduce.op(*self.reduce_push)
