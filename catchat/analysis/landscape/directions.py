"""Weight groups (row blocks of a layer's GRU matrices) and the filter-normalised random directions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout

GATES = ("r", "z", "n")  # PyTorch's order of the row blocks of weight_ih / weight_hh
MATRICES = {"ih": "weight_ih", "hh": "weight_hh"}
DEFAULT_GROUP = "z"
GROUP_HELP = ("comma-separated blocks: 'ih:z', 'hh:n', ... (matrix:gate); a gate alone ('z') means that gate "
              "in both matrices; a matrix alone ('hh') all its gates; 'all' every gate of both")


@dataclass(frozen=True)
class Group:
    """A set of (matrix, gate) row blocks of one layer's GRU weights, in canonical order."""

    blocks: tuple[tuple[str, str], ...]  # ("ih" | "hh", "r" | "z" | "n")

    @property
    def label(self) -> str:
        return "+".join(f"{m}:{g}" for m, g in self.blocks)

    def rows(self, spec: ModelSpec, layer: int) -> list[tuple[str, slice]]:
        """(tensor name, row slice) of each block, e.g. ('layers.0.gru.weight_hh', slice(H, 2H))."""
        H = spec.hidden
        return [(f"layers.{layer}.gru.{MATRICES[m]}", slice(GATES.index(g) * H, (GATES.index(g) + 1) * H))
                for m, g in self.blocks]


def parse_group(text: str) -> Group:
    """'z' (default), 'hh:z', 'ih:n,hh:n', 'hh', 'all', ... -> Group (see GROUP_HELP)."""
    chosen: set[tuple[str, str]] = set()
    items = [s.strip().lower() for s in str(text).split(",") if s.strip()]
    if not items:
        raise UsageError(f"--group {text!r} names no weights", hint=GROUP_HELP)
    for item in items:
        if item == "all":
            chosen |= {(m, g) for m in MATRICES for g in GATES}
        elif item in MATRICES:
            chosen |= {(item, g) for g in GATES}
        elif item in GATES:
            chosen |= {(m, item) for m in MATRICES}
        else:
            m, sep, g = item.partition(":")
            if not sep or m not in MATRICES or g not in GATES:
                raise UsageError(f"--group: unknown weight block {item!r}", hint=GROUP_HELP)
            chosen.add((m, g))
    order = [(m, g) for m in MATRICES for g in GATES]
    return Group(tuple(b for b in order if b in chosen))


def filter_normalise(direction: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Scale each row of `direction` [rows, cols] to the norm of the same row of `weights`.

    A row whose trained weights are all zero (or whose direction row is zero) becomes zero."""
    d = np.asarray(direction, np.float64)
    w_norm = np.linalg.norm(np.asarray(weights, np.float64), axis=1, keepdims=True)  # [rows,1]
    d_norm = np.linalg.norm(d, axis=1, keepdims=True)  # [rows,1]
    scale = np.divide(w_norm, d_norm, out=np.zeros_like(w_norm), where=(d_norm > 0) & (w_norm > 0))
    return d * scale


def directions(layout: ParamLayout, flat: np.ndarray, layer: int, group: Group, seed: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Two filter-normalised random directions as flat float64 arrays [total], zero outside the group.

    Draws come from np.random.default_rng([seed, layer]): d1's blocks, then d2's, each block a
    standard normal [H, H] in the group's canonical order; they depend only on (seed, layer,
    group, H), so two checkpoints of one architecture get the same raw draws."""
    if not 0 <= layer < layout.spec.layers:
        raise UsageError(f"layer {layer} does not exist (the model has {layout.spec.layers} layers: "
                         f"0..{layout.spec.layers - 1})", hint="choose --layer within range")
    rng = np.random.default_rng([int(seed), int(layer)])
    H = layout.spec.hidden
    out = []
    for _ in range(2):
        d = np.zeros(layout.total, np.float64)  # [total]
        for name, rows in group.rows(layout.spec, layer):
            raw = rng.standard_normal((H, H))
            layout.view(d, name)[rows] = filter_normalise(raw, layout.view(flat, name)[rows])
        out.append(d)
    return out[0], out[1]
