"""The parameter spec: names, shapes, the one flat layout shared by all, and initialisation.

Every consumer (numpy reference, GPU buffers, optimizer moments, checkpoints) sees the same
flat float32 buffer; `ParamLayout` maps each named tensor to its offset in it. Names are
PyTorch's (`torch.nn.GRU` + RMSNorm), so a checkpoint loads there unchanged. See docs/model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALIGN = 16  # floats; every tensor starts on a 64-byte boundary (vec4 loads, storage buffer offsets)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture hyper-parameters (stored in every checkpoint's config)."""

    vocab_size: int = 101  # V
    hidden: int = 64  # H (also the embedding width: every layer is H -> H)
    layers: int = 2  # L
    tie_embeddings: bool = False  # head.weight is embedding.weight
    norm_eps: float = 1e-6  # RMSNorm epsilon


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter tensor: checkpoint name, shape, and whether weight decay applies."""

    name: str
    shape: tuple[int, ...]
    decay: bool


def param_specs(spec: ModelSpec) -> list[ParamSpec]:
    """All parameter tensors of `spec`, in checkpoint (and flat-buffer) order."""
    V, H = spec.vocab_size, spec.hidden
    out = [ParamSpec("embedding.weight", (V, H), True)]
    for l in range(spec.layers):
        p = f"layers.{l}."
        out += [
            ParamSpec(p + "gru.weight_ih", (3 * H, H), True),
            ParamSpec(p + "gru.weight_hh", (3 * H, H), True),
            ParamSpec(p + "gru.bias_ih", (3 * H,), False),
            ParamSpec(p + "gru.bias_hh", (3 * H,), False),
            ParamSpec(p + "norm.weight", (H,), False),
        ]
    if not spec.tie_embeddings:
        out.append(ParamSpec("head.weight", (V, H), True))
    return out


def head_name(spec: ModelSpec) -> str:
    """The parameter the head multiplies by: embedding.weight when tied, else head.weight."""
    return "embedding.weight" if spec.tie_embeddings else "head.weight"


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class ParamLayout:
    """Offsets of every named tensor in one flat buffer (16-float aligned, zero padding)."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.specs: tuple[ParamSpec, ...] = tuple(param_specs(spec))
        self.names: tuple[str, ...] = tuple(s.name for s in self.specs)
        self.shapes: dict[str, tuple[int, ...]] = {s.name: s.shape for s in self.specs}
        self.sizes: dict[str, int] = {s.name: math.prod(s.shape) for s in self.specs}
        self.offsets: dict[str, int] = {}
        at = 0
        for s in self.specs:
            self.offsets[s.name] = at
            at = _align(at + self.sizes[s.name])
        self.total: int = at  # float count, a multiple of ALIGN

    def decay_runs(self) -> list[tuple[int, int]]:
        """[begin, end) ranges of the flat buffer where weight decay applies, touching ones merged:
        at most 2L + 2 (the embedding, each layer's two matrices, the head; fewer where no padding
        separates them)."""
        runs: list[tuple[int, int]] = []
        for s in self.specs:
            if not s.decay:
                continue
            begin, end = self.offsets[s.name], self.offsets[s.name] + self.sizes[s.name]
            if runs and runs[-1][1] == begin:
                runs[-1] = (runs[-1][0], end)
            else:
                runs.append((begin, end))
        return runs

    def decay_mask(self) -> np.ndarray:
        """float32 [total]: 1 where weight decay applies, 0 elsewhere (padding included)."""
        mask = np.zeros(self.total, np.float32)  # [total]
        for begin, end in self.decay_runs():
            mask[begin:end] = 1.0
        return mask

    def flatten(self, tensors: dict[str, np.ndarray], dtype=None) -> np.ndarray:
        """Pack exactly the layout's tensors into a new flat array [total] (padding zero).

        dtype defaults to the tensors' common dtype, so float64 gradients stay float64.
        """
        if set(tensors) != set(self.names):
            missing = sorted(set(self.names) - set(tensors))
            extra = sorted(set(tensors) - set(self.names))
            raise KeyError(f"tensor names do not match the layout: missing {missing}, extra {extra}")
        if dtype is None:
            dtype = np.result_type(*(tensors[n] for n in self.names))
        flat = np.zeros(self.total, dtype)  # [total]
        for n in self.names:
            t = np.asarray(tensors[n])
            if t.shape != self.shapes[n]:
                raise ValueError(f"{n}: shape {t.shape}, layout expects {self.shapes[n]}")
            o = self.offsets[n]
            flat[o : o + self.sizes[n]] = t.reshape(-1)
        return flat

    def view(self, flat: np.ndarray, name: str) -> np.ndarray:
        """The tensor `name` as a shaped view into `flat` (writes go through)."""
        if flat.shape != (self.total,):
            raise ValueError(f"flat buffer has shape {flat.shape}, layout expects ({self.total},)")
        o = self.offsets[name]
        return flat[o : o + self.sizes[name]].reshape(self.shapes[name])

    def unflatten(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """All tensors as shaped views into `flat`, in layout order."""
        return {n: self.view(flat, n) for n in self.names}


def init_params(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """Fresh float32 parameters as in docs/model.md, drawn in checkpoint order from one RNG."""
    rng = np.random.default_rng(seed)
    H = spec.hidden
    k = 1.0 / math.sqrt(H)  # PyTorch's GRU init bound; also the embedding's std
    out: dict[str, np.ndarray] = {}
    for s in param_specs(spec):
        if s.name == "embedding.weight":
            t = rng.normal(0.0, k, s.shape)
        elif s.name.endswith("norm.weight"):
            t = np.ones(s.shape)
        else:  # GRU weights and biases, untied head
            t = rng.uniform(-k, k, s.shape)
        out[s.name] = t.astype(np.float32)
    return out


def spectral_u_init(spec: ModelSpec, dtype=np.float32) -> np.ndarray:
    """The spectral-norm projection's power-iteration vectors at the start of training:
    u [L, 2 (ih, hh), 3 (r, z, n), H], all normalised ones (training state from then on)."""
    H = spec.hidden
    return np.full((spec.layers, 2, 3, H), 1.0 / math.sqrt(H), dtype)
