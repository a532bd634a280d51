"""The optimizer step: global gradient norm, clipping + AdamW / NAdam, spectral-norm projection.

Per optimizer step, recorded in this order after the last micro-batch's backward:
    GradNorm()        grads -> stats[ST_GRAD_NORM_SQ]                     (2 dispatches)
    Optimizer()       skip guard, clip, decay, AdamW/NAdam on params, m, v (1 dispatch)
    SpectralProject() power iteration + projection of the GRU gate blocks  (4 dispatches)
Per-step scalars come from the `hyper` words (`optimizer_hyper_words` computes this family's).
This family overwrites its stats words (ST_GRAD_NORM_SQ, ST_SKIPPED, ST_CLIP_SCALE): it needs no
zeroing of its own. The spectral vectors `u` are training state like m and v: checkpoint them.
Shaders: glsl/grad_norm.comp, glsl/optimizer.comp, glsl/spectral.comp.
"""

from __future__ import annotations

import numpy as np

from catchat.model import ParamLayout, reference
from catchat.vk import slots
from catchat.vk.device import Device
from catchat.vk.kernels import Kernel, ceil_div

MAX_GROUPS_X = 65535  # Vulkan's guaranteed minimum of maxComputeWorkGroupCount[0]


def _check_pow2(wg: int) -> int:
    if wg < 1 or wg & (wg - 1):
        raise ValueError(f"workgroup size {wg} must be a power of two (tree reductions)")
    return wg


# ---------------------------------------------------------------------------------------------
# Gradient norm
# ---------------------------------------------------------------------------------------------


class GradNorm(Kernel):
    """stats[ST_GRAD_NORM_SQ] = sum(grads[offset : offset + n]^2) as float32 bits (glsl/grad_norm.comp).

    grads [>= offset + n] float32, stats [ST_WORDS] uint32 (the word is overwritten, not added to).
    Two dispatches: pass 1 writes one partial per workgroup into the kernel's own `partials`
    [n_partials] uint32 buffer (ITEMS vec4 a thread where n and offset are multiples of 4, else ITEMS
    floats); pass 2 (one workgroup) sums them in a fixed order. Float32
    throughout: ITEMS-element runs per thread, shared-memory trees, Kahan over the partials;
    relative error vs. float64 `reference.grad_norm(g)**2` is a few 1e-7 (bound ~25 eps).
    NaN anywhere -> NaN, else Inf anywhere -> +Inf (bit tests, not float tricks). A finite
    gradient above ~1.8e19 overflows the float32 square to +Inf (float64 reference would not):
    such a step is skipped as non-finite.
    """

    shader = "grad_norm"
    WORKGROUP = 256
    ITEMS = 8

    @staticmethod
    def item_elements(n: int, offset: int = 0) -> int:
        """Elements per item of pass 1: 4 (VEC4, one 16-byte load) where n and offset are multiples of 4."""
        return 4 if n % 4 == 0 and offset % 4 == 0 else 1

    @classmethod
    def items_per_thread(cls, n: int, wg: int, items: int | None = None, offset: int = 0) -> int:
        return max(items or cls.ITEMS, ceil_div(n, wg * cls.item_elements(n, offset) * MAX_GROUPS_X))

    @classmethod
    def scratch_words(cls, n: int, wg: int | None = None, items: int | None = None, offset: int = 0) -> int:
        """Words of the per-workgroup partials (the program's memory plan reads this)."""
        wg = wg or cls.WORKGROUP
        return ceil_div(n, wg * cls.item_elements(n, offset) * cls.items_per_thread(n, wg, items, offset))

    def __init__(self, dev: Device, grads, stats, n: int, offset: int = 0, workgroup: int | None = None,
                 items: int | None = None):
        self.n, self.offset = int(n), int(offset)
        if self.n < 1:
            raise ValueError("GradNorm needs n >= 1")
        wg = _check_pow2(workgroup or self.WORKGROUP)
        self.items = self.items_per_thread(self.n, wg, items, self.offset)
        self.n_partials = self.scratch_words(self.n, wg, items, self.offset)
        self.partials = dev.tensor(self.n_partials, np.uint32)  # [n_partials] float bits
        tensors, push = [grads, self.partials, stats], (self.n, self.offset, self.n_partials)
        super().__init__(dev, tensors, [self.n_partials], spec=[wg, self.items], push=push,
                         defines={"VEC4": 1} if self.item_elements(self.n, self.offset) == 4 else None)
        self.final = Kernel(dev, tensors, [1], spec=[wg, self.items], push=push,
                            defines={"GRAD_NORM_FINAL": 1}, shader=self.shader)

    def __call__(self) -> list:
        """The two dispatch ops, to record in this order."""
        push = (self.n, self.offset, self.n_partials)
        return [self.op(*push), self.final.op(*push)]


# ---------------------------------------------------------------------------------------------
# Optimizer step (clip + decoupled weight decay + AdamW / NAdam)
# ---------------------------------------------------------------------------------------------

OPTIMIZERS = ("adamw", "nadam")


def optimizer_hyper_words(kind: str, t: int, lr: float, b1: float, b2: float, eps: float,
                          wd: float, clip: float | None, spectral_bound: float | None = 0.0
                          ) -> dict[int, np.uint32]:
    """The hyper words this family reads for optimizer step t (1-based), as {slot: uint32 word}.

    Bias corrections and NAdam's coefficients are computed in float64 (reference.nadam_coefficients)
    and rounded once to float32. clip None/0 = no clipping; spectral_bound None/0 = off.
    HP_N_VALID is not included: it is the data's count (the integrator's).
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r} (expected one of {OPTIMIZERS})")
    t = int(t)
    if t < 1:
        raise ValueError(f"optimizer step t starts at 1, got {t}")
    mu_t, mu_next, mu_prod = reference.nadam_coefficients(t, b1)
    f = slots.f32_bits
    return {
        slots.HP_LR: f(lr), slots.HP_BETA1: f(b1), slots.HP_BETA2: f(b2), slots.HP_EPS: f(eps),
        slots.HP_WEIGHT_DECAY: f(wd), slots.HP_CLIP: f(clip or 0.0), slots.HP_STEP: np.uint32(t),
        slots.HP_BIAS_CORR1: f(1.0 - b1**t), slots.HP_BIAS_CORR2: f(1.0 - b2**t),
        slots.HP_NADAM_COEF_G: f(lr * (1.0 - mu_t) / (1.0 - mu_prod)),
        slots.HP_NADAM_COEF_M: f(lr * mu_next / (1.0 - mu_prod * mu_next)),
        slots.HP_SPECTRAL_BOUND: f(spectral_bound or 0.0),
    }


def decay_words(layout) -> np.ndarray:
    """The optimizer's decay buffer: uint32 [1 + 2 * (2L + 2)], the number of runs, then each
    [begin, end) of ParamLayout.decay_runs (zero beyond)."""
    runs = layout.decay_runs()
    words = np.zeros(decay_word_count(layout.spec.layers), np.uint32)
    words[0] = len(runs)
    words[1:1 + 2 * len(runs)] = np.asarray(runs, np.uint32).ravel()
    return words


def decay_word_count(layers: int) -> int:
    """Words of the decay buffer: the run count, then room for 2L + 2 runs (decay_runs' bound)."""
    return 1 + 2 * (2 * int(layers) + 2)


class Optimizer(Kernel):
    """One AdamW or NAdam step over n flat parameters, in place (glsl/optimizer.comp, one dispatch).

    params, grads, m, v: float32 [total] in ParamLayout order; decay: uint32 `decay_words(layout)`
    (the runs where weight decay applies); hyper [HP_WORDS] uint32 (optimizer_hyper_words + HP_N_VALID);
    stats [ST_WORDS] uint32, read: ST_GRAD_NORM_SQ (GradNorm must run first), written:
    ST_SKIPPED (1 = step not applied, else 0) and ST_CLIP_SCALE (float bits; 1 when skipped).
    Skipped (n_valid == 0 or non-finite norm): params, m, v untouched. Otherwise
    g = grads * min(1, clip / (norm + 1e-6)), p *= 1 - lr wd mask, then the Adam update;
    grads are only read.
    """

    shader = "optimizer"
    WORKGROUP = 256
    MAX_GROUPS = 8192  # grid-stride beyond WORKGROUP * MAX_GROUPS parameters

    def __init__(self, dev: Device, params, grads, m, v, decay, hyper, stats, total: int,
                 kind: str = "adamw", workgroup: int | None = None, max_groups: int | None = None):
        if kind not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {kind!r} (expected one of {OPTIMIZERS})")
        self.kind, self.n = kind, int(total)
        wg = workgroup or self.WORKGROUP
        groups = max(1, min(ceil_div(self.n, wg), max_groups or self.MAX_GROUPS))
        super().__init__(dev, [params, grads, m, v, decay, hyper, stats], [groups],
                         spec=[wg], push=(self.n,), defines={kind.upper(): 1})

    def __call__(self):
        return self.op(self.n)


# ---------------------------------------------------------------------------------------------
# Spectral-norm projection of the GRU gate blocks
# ---------------------------------------------------------------------------------------------


class SpectralProject(Kernel):
    """One power iteration + projection of all 6 L [H,H] gate blocks (glsl/spectral.comp).

    params: flat float32 [layout.total] (updated in place: a block with sigma > bound is scaled
    by bound / sigma); u: float32 [L,2,3,H] persistent unit vectors (start:
    catchat.model.spectral_u_init; training state, checkpoint it), updated every applied step;
    hyper [HP_WORDS] (HP_SPECTRAL_BOUND, 0 = off), stats [ST_WORDS] (ST_SKIPPED = 1: off).
    Owns `work` float32 [2 * 6L * H + 6L] scratch. Four dispatches, to record in order,
    after Optimizer. Matches reference.spectral_project_model.
    """

    shader = "spectral"
    WORKGROUP = 256
    ROWS = 8  # phase-2 rows per workgroup: shared memory ROWS * WORKGROUP * 4 bytes
    MAX_TILES = 1024

    @staticmethod
    def scratch_words(H: int, L: int) -> int:
        """Words of `work`: two [H] vectors and a norm per W_ih/W_hh gate block (6 per layer)."""
        return 2 * 6 * L * H + 6 * L

    def __init__(self, dev: Device, params, layout: ParamLayout, u, hyper, stats,
                 workgroup: int | None = None, rows: int | None = None, max_tiles: int | None = None):
        spec = layout.spec
        H, L = spec.hidden, spec.layers
        off = layout.offsets
        ih0 = off["layers.0.gru.weight_ih"]
        hh_delta = off["layers.0.gru.weight_hh"] - ih0
        stride = (off["layers.1.gru.weight_ih"] - ih0) if L > 1 else 0
        for l in range(L):  # the shader assumes the layout is affine in l
            if (off[f"layers.{l}.gru.weight_ih"] != ih0 + l * stride
                    or off[f"layers.{l}.gru.weight_hh"] != ih0 + l * stride + hh_delta):
                raise ValueError("SpectralProject: GRU weight offsets are not evenly spaced per layer")
        self.blocks = 6 * L
        wg = _check_pow2(workgroup or self.WORKGROUP)
        rows = max(1, min(rows or self.ROWS, wg, dev.info.max_shared_memory_bytes // (4 * wg)))
        self.tiles = max(1, min(ceil_div(H * H, wg), max_tiles or self.MAX_TILES))
        self.work = dev.tensor(self.scratch_words(H, L), np.float32)
        self.push = (H, self.blocks, ih0, hh_delta, stride, self.tiles)
        tensors = [params, u, self.work, hyper, stats]
        grids = {1: [ceil_div(H, wg), self.blocks], 2: [ceil_div(H, rows), self.blocks],
                 3: [1, self.blocks], 4: [self.tiles, self.blocks]}
        super().__init__(dev, tensors, grids[1], spec=[wg, 1], push=self.push,
                         defines={"SPECTRAL_PHASE": 1})
        self.phases = [self] + [
            Kernel(dev, tensors, grids[p], spec=[wg, rows if p == 2 else 1], push=self.push,
                   defines={"SPECTRAL_PHASE": p}, shader=self.shader) for p in (2, 3, 4)]

    def __call__(self) -> list:
        """The four dispatch ops, to record in this order."""
        return [Kernel.op(k, *self.push) for k in self.phases]
