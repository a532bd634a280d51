"""Vulkan kernels: one module per shader family (`gemm`, `gru`, `norm`, `loss`, ...).

A kernel is built once for fixed buffers and sizes (kp bakes tensors and workgroup counts into
an algorithm) and hands out `kp.OpAlgoDispatch` ops to record into sequences; push constants
are given per dispatch, so one algorithm serves e.g. every timestep of a recurrent sweep.
Buffers that hold several arrays (the flat parameter buffer) are addressed by element offsets
passed as push constants.

Every family module also has `parity_checks(dev) -> list[ParityResult]`: its kernels against
their numpy twins at small sizes. The test suite asserts them and `catchat parity` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from catchat.vk.device import Device, host_view, pack_push
from catchat.vk.shaders import compile_shader


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


class Kernel:
    """One compiled shader bound to fixed tensors, workgroup counts and specialization constants."""

    shader: str = ""

    def __init__(self, dev: Device, tensors, workgroups, spec=(), push=(), defines=None, shader=None):
        self.dev = dev
        self.shader = shader or self.shader
        self.push_words = len(push)
        # what built the pipeline, for tools that rebuild it (tools/shader_stats.py)
        self.defines, self.spec, self.bindings = dict(defines or {}), list(spec), len(tensors)
        self.algo = dev.algorithm(tensors, compile_shader(self.shader, defines), workgroups,
                                  spec_consts=spec, push_consts=pack_push(*push))

    def op(self, *push):
        """A dispatch op with this dispatch's push constants (same count as at construction)."""
        if len(push) != self.push_words:
            raise ValueError(f"{self.shader}: {len(push)} push constants, expected {self.push_words}")
        return self.dev.kp.OpAlgoDispatch(self.algo, pack_push(*push))


@dataclass
class ParityResult:
    """One kernel-vs-numpy comparison: passes when every element is within atol + rtol * |expected|."""

    kernel: str
    shape: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    ok: bool

    def __str__(self) -> str:
        return (f"{self.kernel} [{self.shape}] max_abs={self.max_abs:.2e} max_rel={self.max_rel:.2e} "
                f"(atol={self.atol:g}, rtol={self.rtol:g}) {'ok' if self.ok else 'FAIL'}")


def compare(kernel: str, shape: str, got, expected, atol: float, rtol: float) -> ParityResult:
    """Compare a kernel's output with its numpy twin (float64 maths, NaN anywhere fails)."""
    got = np.asarray(got, dtype=np.float64).ravel()
    exp = np.asarray(expected, dtype=np.float64).ravel()
    if got.shape != exp.shape:
        return ParityResult(kernel, shape, np.inf, np.inf, atol, rtol, False)
    diff = np.abs(got - exp)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(exp), 1e-30)).max()) if diff.size else 0.0
    ok = bool(np.all(np.isfinite(got)) and np.all(diff <= atol + rtol * np.abs(exp)))
    return ParityResult(kernel, shape, max_abs, max_rel, atol, rtol, ok)


def run_ops(dev: Device, upload, ops, download):
    """Upload tensors, record and run ops in one sequence, download tensors; returns host copies."""
    dev.recorded(ops, upload, download).eval()
    return [host_view(t).copy() for t in download]


class Axpby(Kernel):
    """y = a*x + b*y + c over n floats (glsl/axpby.comp): zeroing, scaling, copying, accumulating."""

    shader = "axpby"
    WORKGROUP = 64

    def __init__(self, dev: Device, x, y, n: int):
        self.n = int(n)
        super().__init__(dev, [x, y], [ceil_div(self.n, self.WORKGROUP)], spec=[self.WORKGROUP],
                         push=(self.n, 0.0, 0.0, 0.0))

    def __call__(self, a: float, b: float, c: float = 0.0):
        return self.op(self.n, float(a), float(b), float(c))


def axpby_reference(x: np.ndarray, y: np.ndarray, a: float, b: float, c: float = 0.0) -> np.ndarray:
    """numpy twin of glsl/axpby.comp (float32 arithmetic; a zero coefficient ignores its operand)."""
    r = np.zeros_like(y, dtype=np.float32)
    if a != 0:
        r = np.float32(a) * x
    if b != 0:
        r = r + np.float32(b) * y
    return (r + np.float32(c)).astype(np.float32)


def chained_dispatch_sum(dev: Device, n_elements: int, n_dispatches: int) -> np.ndarray:
    """Ping-pong `dst = src + 1` between two buffers n_dispatches times, all in one sequence.

    Every element must end at exactly n_dispatches; a dispatch that ran before its predecessor's
    writes were visible loses updates (what a missing compute -> compute barrier does on a GPU).
    """
    a, b = dev.tensor(np.zeros(n_elements, np.float32)), dev.tensor(np.zeros(n_elements, np.float32))
    a_to_b, b_to_a = Axpby(dev, a, b, n_elements), Axpby(dev, b, a, n_elements)
    ops = [(a_to_b if i % 2 == 0 else b_to_a)(1.0, 0.0, 1.0) for i in range(n_dispatches)]
    (out,) = run_ops(dev, [a, b], ops, [b if n_dispatches % 2 else a])
    return out


def ordering_check(dev: Device, n_elements: int = 1 << 16, n_dispatches: int = 2000) -> ParityResult:
    """The chained-dispatch ordering test as a parity row (exact: every element must equal n)."""
    out = chained_dispatch_sum(dev, n_elements, n_dispatches)
    return compare("chained dispatches", f"{n_dispatches}x{n_elements}", out,
                   np.full(n_elements, float(n_dispatches)), 0.0, 0.0)


def parity_checks(dev: Device) -> list[ParityResult]:
    """axpby at sizes around its workgroup size."""
    rng = np.random.default_rng(0)
    out = []
    for n in (1, 63, 64, 65, 1000):
        x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        tx, ty = dev.tensor(x), dev.tensor(y)
        (got,) = run_ops(dev, [tx, ty], [Axpby(dev, tx, ty, n)(0.5, 2.0, -1.0)], [ty])
        out.append(compare("axpby", str(n), got, axpby_reference(x, y, 0.5, 2.0, -1.0), 1e-6, 1e-6))
    # zeroing must not read its operands: NaN garbage in fresh memory must not survive 0 * y
    n = 100
    x, y = np.full(n, np.nan, np.float32), np.full(n, np.inf, np.float32)
    tx, ty = dev.tensor(x), dev.tensor(y)
    (got,) = run_ops(dev, [tx, ty], [Axpby(dev, tx, ty, n)(0.0, 0.0, 0.0)], [ty])
    out.append(compare("axpby zero over NaN/Inf", str(n), got, np.zeros(n), 0.0, 0.0))
    return out
