"""Vulkan kernels: one module per shader family (`gemm`, `gru`, `norm`, `loss`, ...).

A kernel is built once for fixed buffers and sizes (kp bakes tensors and workgroup counts into
an algorithm) and hands out `kp.OpAlgoDispatch` ops to record into sequences; push constants
are given per dispatch, so one algorithm serves e.g. every timestep of a recurrent sweep.
Buffers that hold several arrays (the flat parameter buffer) are addressed by element offsets
passed as push constants.

Their checks against the numpy twins live in catchat/parity/ (a module per family, same name).
"""

from __future__ import annotations

import numpy as np

from catchat.vk.device import Device, check_dispatch, host_view, pack_push
from catchat.vk.shaders import compile_async


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def device_sms(dev: Device) -> int:
    """The GPU's SM count where its driver reports it (VK_NV_shader_sm_builtins), else 0 (and 0
    on a CPU device, which may run one workgroup at a time)."""
    return dev.info.compute_units if dev.info.type != "CPU" else 0


class LazyAlgorithm:
    """A kp algorithm whose SPIR-V compiles on the compile pool from construction (`compile_async`)
    and which is made on first use: a program builds its kernels, every core compiles their shaders
    meanwhile, and the driver makes each pipeline as the program's sequences are recorded. Bad
    bindings or workgroup counts fail at construction; a compile error at first use."""

    def __init__(self, dev: Device, tensors, shader: str, defines, workgroups, spec, push_words):
        self._make = (dev, list(tensors), compile_async(shader, defines), check_dispatch(tensors, workgroups),
                      list(spec), push_words)
        self._algo = None

    def get(self):
        if self._algo is None:
            dev, tensors, spirv, wg, spec, push = self._make
            self._algo = dev.algorithm(tensors, spirv.result(), wg, spec_consts=spec, push_consts=push)
            self._make = None
        return self._algo


class Kernel:
    """One compiled shader bound to fixed tensors, workgroup counts and specialization constants."""

    shader: str = ""

    def __init__(self, dev: Device, tensors, workgroups, spec=(), push=(), defines=None, shader=None):
        self.dev = dev
        self.shader = shader or self.shader
        self.push_words = len(push)
        # what built the pipeline, for tools that rebuild it (tools/shader_stats.py)
        self.defines, self.spec, self.bindings = dict(defines or {}), list(spec), len(tensors)
        self._algo = LazyAlgorithm(dev, tensors, self.shader, defines, workgroups, spec, pack_push(*push))

    @property
    def algo(self):
        """The kp algorithm (made on first use: `LazyAlgorithm`)."""
        return self._algo.get()

    def op(self, *push):
        """A dispatch op with this dispatch's push constants (same count as at construction)."""
        if len(push) != self.push_words:
            raise ValueError(f"{self.shader}: {len(push)} push constants, expected {self.push_words}")
        return self.dev.kp.OpAlgoDispatch(self.algo, pack_push(*push))


def pack_half(values) -> np.ndarray:
    """float16 values two to a uint32 word (the kp tensor of a float16 buffer; an odd count is
    padded with a zero)."""
    h = np.asarray(values, dtype=np.float16).ravel()
    return np.concatenate([h, np.zeros(h.size % 2, np.float16)]).view(np.uint32)


def half_tensor(dev, values, kind: str = "device"):
    """A kp tensor of float16 values (`pack_half`'s uint32 words): a float16 operand's buffer."""
    return dev.tensor(pack_half(values), np.uint32, kind=kind)


def unpack_half(words, n: int) -> np.ndarray:
    """The first n float16 values of uint32 words written by a float16 buffer."""
    return np.ascontiguousarray(words, dtype=np.uint32).view(np.float16)[:n].copy()


def run_ops(dev: Device, upload, ops, download):
    """Upload tensors, record and run ops in one sequence, download tensors; returns host copies."""
    dev.recorded(ops, upload, download).eval()
    return [host_view(t).copy() for t in download]


class Axpby(Kernel):
    """y = a*x + b*y + c over n floats (glsl/axpby.comp): zeroing, scaling, copying, accumulating; a
    thread per 4 of them where n is a multiple of 4 (VEC4), else per element.
    half: x and y hold n float16 values (`pack_half`) and the arithmetic is float16; only on a
    device with `Device.runs_float16`. hyper_a: (hyper tensor, slot): a is read from that word on
    the device as the dispatch runs (the fp16 program's unscale by 1/S), the call's `a` is ignored."""

    shader = "axpby"
    WORKGROUP = 64
    VEC4_WORKGROUP = 256
    HALF_ATOL = 4e-3  # float16 results against numpy's: two float16 roundings at |y| < 8 (an FMA rounds once)

    def __init__(self, dev: Device, x, y, n: int, half: bool = False, hyper_a=None):
        self.n = int(n)
        if half and not dev.runs_float16:
            raise ValueError(f"{dev.info.name} does not offer float16 arithmetic and 16-bit storage")
        if half and hyper_a is not None:
            raise ValueError("axpby: hyper_a is a float32 variant")
        vec4 = not half and self.n % 4 == 0  # a thread per 4 elements (VEC4)
        tensors, defines = [x, y], {"HALF": 1} if half else {"VEC4": 1} if vec4 else {}
        if hyper_a is not None:
            tensors.append(hyper_a[0])
            defines["HYPER_A"] = int(hyper_a[1])
        wg = self.VEC4_WORKGROUP if vec4 else self.WORKGROUP
        super().__init__(dev, tensors, [ceil_div(self.n // 4 if vec4 else self.n, wg)], spec=[wg],
                         push=(self.n, 0.0, 0.0, 0.0), defines=defines or None)

    def __call__(self, a: float, b: float, c: float = 0.0):
        return self.op(self.n, float(a), float(b), float(c))


class ToHalf(Kernel):
    """y[y_off + i] = float16(x[x_off + i]) for i < n (glsl/to_half.comp, round to nearest even): x
    float32, y uint32 words of float16 pairs (`pack_half`; y_off in halves). block_cols > 0: x is a
    matrix with rows of block_cols (a multiple of 16) and y gets its 16 x 16 blocks
    (`stream.block_halves`' layout; a last band of fewer than 16 rows leaves the rest of its blocks
    as they were). The program's float16 copy of W_hh for the streamed sweeps, the tensor-core decode
    step's weights and shadows; needs `Device.runs_float16`. lo: the lo part of a split copy instead,
    float16(2^11 (x - float16(x))) (x = hi + 2^-11 lo, glsl/include/split_half.glsl; the float32 forward
    on tensor cores)."""

    shader = "to_half"
    WORKGROUP = 256
    MAX_WORKGROUPS = 4096  # grid-stride beyond

    def __init__(self, dev: Device, x, y, n: int, x_off: int = 0, y_off: int = 0, block_cols: int = 0,
                 lo: bool = False):
        if not dev.runs_float16:
            raise ValueError(f"{dev.info.name} does not offer float16 arithmetic and 16-bit storage")
        for what, size, need in (("x", x.size(), x_off + n), ("y", 2 * y.size(), y_off + n)):
            if size < need:
                raise ValueError(f"to_half: {what} holds {size} elements, needs {need}")
        if block_cols and (block_cols % 16 or n % block_cols):
            raise ValueError(f"to_half: blocks of 16 x 16 need rows of a multiple of 16 ({block_cols}) and whole "
                             f"rows ({n} elements)")
        self.push = (int(n), int(x_off), int(y_off), int(block_cols))
        super().__init__(dev, [x, y], [max(1, min(self.MAX_WORKGROUPS, ceil_div(int(n), self.WORKGROUP)))],
                         spec=[self.WORKGROUP], push=self.push, defines={"LO": 1} if lo else None)

    def ops(self) -> list:
        return [self.op(*self.push)]


class FragOrder(Kernel):
    """A blocked float16 copy's 16 x 16 blocks rewritten in their fragments' own order
    (glsl/frag_order.comp): n_blocks blocks of w (uint32 words of float16 pairs) from src_off to dst_off
    (halves, multiples of 256; the same offset, or regions that do not overlap), each block as the
    32 invocations' elements of the B operand that loading it gives (column-major with col, else
    row-major), invocation i's 8 at 8 i, so a consumer loads a fragment with one 16-byte load an
    invocation (include/sweep_frag.glsl's LOAD_B_FRAG). On emulated fragments (no cooperative matrices,
    e.g. lavapipe) fragment order is the operand row-major, as the emulation reads it."""

    shader = "frag_order"
    WORKGROUP = 256  # 8 subgroups of 32
    MAX_WORKGROUPS = 1024  # each subgroup walks blocks beyond

    def __init__(self, dev: Device, w, n_blocks: int, src_off: int, dst_off: int, col: bool):
        from catchat.vk.kernels.gemm_tiles import coopmat_runs, frag_defines

        n, src, dst = int(n_blocks), int(src_off), int(dst_off)
        if src % 256 or dst % 256:
            raise ValueError(f"frag_order: offsets must be multiples of 256 halves (got {src}, {dst})")
        if src != dst and src < dst + 256 * n and dst < src + 256 * n:
            raise ValueError("frag_order: the source and destination overlap without being the same blocks")
        if 2 * w.size() < max(src, dst) + 256 * n:
            raise ValueError(f"frag_order: w holds {2 * w.size()} halves, needs {max(src, dst) + 256 * n}")
        emulate = not coopmat_runs(dev)
        self.push = (n, src, dst)
        defines = {**({"COL": "true"} if col else {}), **({"EMU": 1} if emulate else {}),
                   **frag_defines(dev, emulate)}
        super().__init__(dev, [w], [max(1, min(self.MAX_WORKGROUPS, ceil_div(n, self.WORKGROUP // 32)))],
                         spec=[self.WORKGROUP], push=self.push, defines=defines)

    def ops(self) -> list:
        return [self.op(*self.push)]
