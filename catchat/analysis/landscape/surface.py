"""Surfaces: the grid and circles of (alpha, beta), one layer's surface, and a whole run of the command
(one or two checkpoints, several layers)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from catchat.analysis.landscape.directions import Group, directions
from catchat.analysis.landscape.evaluation import EvalSlice
from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout

DEFAULT_GRID = 11
DEFAULT_RADIUS = 0.5
CIRCLE_POINTS = 8  # K: points on each circle of the flatness figure


def grid(n: int, radius: float) -> np.ndarray:
    """n evenly spaced values in [-radius, radius] (0 is one of them when n is odd)."""
    if n < 2:
        raise UsageError(f"--grid must be at least 2, got {n}", hint="the default is 11 (121 points)")
    if not radius > 0:
        raise UsageError(f"--radius must be > 0, got {radius}", hint="the default is 0.5")
    return np.linspace(-radius, radius, int(n))


def circle(rho: float, k: int = CIRCLE_POINTS) -> np.ndarray:
    """k points (alpha, beta) on the circle of radius rho, starting on the alpha axis. [k, 2]"""
    t = 2 * np.pi * np.arange(k) / k
    pts = np.stack([rho * np.cos(t), rho * np.sin(t)], axis=1)
    pts[np.abs(pts) < 1e-15] = 0.0  # exact zeros, so axis points coincide with grid points
    return pts


def _key(a: float, b: float) -> tuple[float, float]:
    return (round(float(a), 12) + 0.0, round(float(b), 12) + 0.0)


@dataclass
class Surface:
    """One layer's loss surface for one checkpoint. loss[i, j] = L(alphas[i], betas[j])."""

    layer: int
    alphas: np.ndarray  # [N]
    betas: np.ndarray  # [N]
    loss: np.ndarray  # [N, N]
    centre: float  # L(0, 0)
    radius: float  # r
    circle_half: np.ndarray  # [K] losses on the circle of radius r/2
    circle_full: np.ndarray  # [K] losses on the circle of radius r
    evaluations: int = 0  # distinct points evaluated
    seconds: float = 0.0

    @property
    def rise_half(self) -> float:
        return float(np.mean(self.circle_half) - self.centre)

    @property
    def rise_full(self) -> float:
        return float(np.mean(self.circle_full) - self.centre)

    @property
    def tilt_half(self) -> float:
        return tilt(self.circle_half)

    @property
    def tilt_full(self) -> float:
        return tilt(self.circle_full)

    def summary(self, group: str, prefix: str = "") -> str:
        r = self.radius
        return (f"{prefix}layer {self.layer} [{group}]: centre {self.centre:.4f} nats/char · mean rise "
                f"{self.rise_half:+.4f} at r/2 = {r / 2:g}, {self.rise_full:+.4f} at r = {r:g} · "
                f"tilt {self.tilt_full:.4f} at r · grid {self.loss.shape[0]}x{self.loss.shape[1]} "
                f"min {np.nanmin(self.loss):.4f} max {np.nanmax(self.loss):.4f}")


def tilt(values: np.ndarray) -> float:
    """Amplitude of the first harmonic of K equally spaced values round a circle (the linear term)."""
    v = np.asarray(values, np.float64)
    t = 2 * np.pi * np.arange(v.size) / v.size
    return float(2.0 / v.size * abs(np.sum(v * np.exp(1j * t))))


def points_of(alphas: np.ndarray, betas: np.ndarray, radius: float,
              k: int = CIRCLE_POINTS) -> list[tuple[float, float]]:
    """Every distinct (alpha, beta) a surface needs: the centre, the grid, both circles."""
    pts = [(0.0, 0.0)] + [(a, b) for a in alphas for b in betas]
    pts += [tuple(p) for p in circle(radius / 2, k)] + [tuple(p) for p in circle(radius, k)]
    seen, out = set(), []
    for a, b in pts:
        key = _key(a, b)
        if key not in seen:
            seen.add(key)
            out.append((float(a), float(b)))
    return out


def layer_surface(evaluator: Callable[[np.ndarray], float], layout: ParamLayout, flat: np.ndarray, *,
                  layer: int, group: Group, seed: int, alphas: np.ndarray, radius: float,
                  betas: np.ndarray | None = None, circle_points: int = CIRCLE_POINTS,
                  on_point: Callable[[], None] | None = None) -> Surface:
    """Evaluate layer `layer`'s surface around `flat` (the trained parameters, ParamLayout order)."""
    start = time.perf_counter()
    betas = alphas if betas is None else betas
    centre_flat = np.asarray(flat, np.float64)
    d1, d2 = directions(layout, centre_flat, layer, group, seed)
    values: dict[tuple[float, float], float] = {}
    for a, b in points_of(alphas, betas, radius, circle_points):
        values[_key(a, b)] = float(evaluator(centre_flat + a * d1 + b * d2))
        if on_point:
            on_point()
    look = lambda pts: np.array([values[_key(a, b)] for a, b in pts])  # noqa: E731
    loss = np.array([[values[_key(a, b)] for b in betas] for a in alphas])
    return Surface(layer=layer, alphas=np.asarray(alphas, np.float64), betas=np.asarray(betas, np.float64),
                   loss=loss, centre=values[_key(0.0, 0.0)], radius=float(radius),
                   circle_half=look(circle(radius / 2, circle_points)),
                   circle_full=look(circle(radius, circle_points)),
                   evaluations=len(values), seconds=time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# A whole run of the command: one or two checkpoints, several layers
# ---------------------------------------------------------------------------------------------


@dataclass
class CheckpointSurfaces:
    """The surfaces of one checkpoint (one per layer, in `layers` order)."""

    path: str
    label: str  # e.g. "tiny step 30"
    global_step: int
    surfaces: list[Surface] = field(default_factory=list)


@dataclass
class Landscape:
    """Everything `catchat landscape` computed (what write_outputs writes)."""

    checkpoints: list[CheckpointSurfaces]
    layers: list[int]
    group: Group
    seed: int
    radius: float
    grid_n: int
    evaluator: str  # "gpu" | "numpy"
    slice_info: str
    n_valid: int
    circle_points: int = CIRCLE_POINTS
    slice_short: str = ""

    def summary_lines(self) -> list[str]:
        many = len(self.checkpoints) > 1
        return [s.summary(self.group.label, prefix=f"{c.label}: " if many else "")
                for c in self.checkpoints for s in c.surfaces]

    def info(self) -> dict:
        return dict(format="catchat-landscape", version=1, group=self.group.label, seed=self.seed,
                    radius=self.radius, grid=self.grid_n, layers=self.layers, evaluator=self.evaluator,
                    slice=self.slice_info, slice_short=self.slice_short, scored_characters=self.n_valid,
                    circle_points=self.circle_points,
                    checkpoints=[dict(path=c.path, label=c.label, global_step=c.global_step)
                                 for c in self.checkpoints],
                    method="filter-normalised random directions (Li et al. 2018)")


def compute(checkpoints: Sequence[tuple[str, str, int, ModelSpec, dict[str, np.ndarray]]], data: EvalSlice,
            make_evaluator: Callable[[ParamLayout], Callable[[np.ndarray], float]], *, layers: Sequence[int] | None,
            group: Group, seed: int, grid_n: int = DEFAULT_GRID, radius: float = DEFAULT_RADIUS,
            circle_points: int = CIRCLE_POINTS, on_point: Callable[[], None] | None = None,
            on_surface: Callable[[CheckpointSurfaces, Surface], None] | None = None) -> Landscape:
    """Surfaces of every chosen layer of every checkpoint (path, label, step, spec, params) on
    `data`, with one evaluator per distinct ModelSpec. layers None: all layers of the first."""
    alphas = grid(grid_n, radius)
    first_spec = checkpoints[0][3]
    layers = list(range(first_spec.layers)) if layers is None else sorted(set(int(x) for x in layers))
    evaluators: dict[ModelSpec, Callable] = {}
    out = []
    for path, label, step, spec, params in checkpoints:
        layout = ParamLayout(spec)
        flat = layout.flatten(params, np.float32)
        ev = evaluators.get(spec)
        if ev is None:
            ev = evaluators[spec] = make_evaluator(layout)
        cs = CheckpointSurfaces(path, label, step)
        for layer in layers:
            s = layer_surface(ev, layout, flat, layer=layer, group=group, seed=seed, alphas=alphas, radius=radius,
                              circle_points=circle_points, on_point=on_point)
            cs.surfaces.append(s)
            if on_surface:
                on_surface(cs, s)
        out.append(cs)
    name = next(iter(evaluators.values())).name if evaluators else "?"
    return Landscape(out, layers, group, int(seed), float(radius), int(grid_n), name, data.describe(),
                     data.n_valid, circle_points, data.short())


def evaluations_per_layer(grid_n: int, radius: float, circle_points: int = CIRCLE_POINTS) -> int:
    a = grid(grid_n, radius)
    return len(points_of(a, a, radius, circle_points))
