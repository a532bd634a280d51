"""One small class per shader family: it owns its algorithm(s) and knows its dispatch sizes.

A kernel is built once for fixed buffers and sizes (kp bakes tensors and workgroup counts into
an algorithm) and hands out `kp.OpAlgoDispatch` ops to record into sequences; push constants
are given per dispatch, so one algorithm serves e.g. every timestep of a recurrent sweep.
"""

from __future__ import annotations

import numpy as np

from catchat.vk.device import Device, pack_push
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
        self.algo = dev.algorithm(tensors, compile_shader(self.shader, defines), workgroups,
                                  spec_consts=spec, push_consts=pack_push(*push))

    def op(self, *push):
        """A dispatch op with this dispatch's push constants (same count as at construction)."""
        if len(push) != self.push_words:
            raise ValueError(f"{self.shader}: {len(push)} push constants, expected {self.push_words}")
        return self.dev.kp.OpAlgoDispatch(self.algo, pack_push(*push))


class Axpby(Kernel):
    """y = a*x + b*y + c over n floats (glsl/axpby.comp)."""

    shader = "axpby"
    WORKGROUP = 64

    def __init__(self, dev: Device, x, y, n: int):
        self.n = int(n)
        super().__init__(dev, [x, y], [ceil_div(self.n, self.WORKGROUP)], spec=[self.WORKGROUP],
                         push=(self.n, 0.0, 0.0, 0.0))

    def __call__(self, a: float, b: float, c: float = 0.0):
        return self.op(self.n, float(a), float(b), float(c))


def axpby_reference(x: np.ndarray, y: np.ndarray, a: float, b: float, c: float = 0.0) -> np.ndarray:
    """numpy twin of glsl/axpby.comp (float32 arithmetic)."""
    return (np.float32(a) * x + np.float32(b) * y + np.float32(c)).astype(np.float32)
