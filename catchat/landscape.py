"""Loss landscapes: the filter-normalised random-direction method (Li et al. 2018), per GRU layer.

For a layer l and a weight group (default `z`: the update-gate rows [H, 2H) of
layers.{l}.gru.weight_ih and weight_hh), two random directions d1, d2 of the group's shape are
drawn (standard normal, seeded by (seed, l)), and each row of a direction (one output unit's
"filter") is scaled to the norm of the same row of the trained weights (an all-zero trained row
gives an all-zero direction row). The loss

    L(alpha, beta) = loss(theta* + alpha d1 + beta d2)

is evaluated on an N x N grid of alpha, beta in [-r, r] and on K points of the circles of radius
r/2 and r, on a fixed evaluation slice, from zero state, with plain cross-entropy (nats/char).
Nothing outside the group moves; biases and norm gains are never perturbed (as Li et al. leave
biases and batch-norm parameters alone).

The flatness figure of a layer is the mean rise of the loss over the centre on each circle:
    rise(rho) = mean_k L(rho cos t_k, rho sin t_k) - L(0, 0),   t_k = 2 pi k / K
Averaging round a circle cancels the linear (gradient) term exactly, so the rise measures
curvature: for a quadratic bowl rise(rho) = rho^2 (h11 + h22) / 4, and rise(r) = 4 rise(r/2).
The linear term is reported apart as the tilt, the amplitude of the first harmonic on the circle
    tilt(rho) = (2 / K) |sum_k L_k exp(i t_k)|     (= rho |grad L| along the plane)
so a centre that is not a minimum of the plane (a model still descending) shows a tilt larger
than its rise. Because directions are scaled to the weights' own row norms, both figures compare
between checkpoints (and between models of other sizes): a flatter minimum has smaller rises.

Evaluation: `GpuEvaluator` keeps ONE forward-only `Program` and replays its recorded eval
sequence for every point (parameters uploaded per point, nothing re-recorded). Grid points cannot
share one dispatch through the lanes dimension: every kernel reads one set of weights for all B
lanes, so batching points would need per-lane weights. `ReferenceEvaluator` runs the float64 numpy
model (catchat.reference) on the same windows: the oracle.

    sl = heldout_slice(corpus, cfg, tokens=2048)            # or text_slice(text, T, B, tokens)
    ev = GpuEvaluator(dev, spec, sl)                         # or ReferenceEvaluator(spec, sl)
    surf = layer_surface(ev, layout, flat, layer=0, group=parse_group("z"), seed=0,
                         alphas=grid(11, 0.5), radius=0.5)
    write_outputs(out_dir, result)                          # PNGs, landscape.npz, landscape.csv
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from catchat import reference as ref
from catchat import vocab
from catchat.errors import UsageError
from catchat.lanes import n_valid as count_valid
from catchat.model import ModelSpec, ParamLayout

GATES = ("r", "z", "n")  # PyTorch's order of the row blocks of weight_ih / weight_hh
MATRICES = {"ih": "weight_ih", "hh": "weight_hh"}
DEFAULT_GROUP = "z"
DEFAULT_GRID = 11
DEFAULT_RADIUS = 0.5
DEFAULT_TOKENS = 1024
CIRCLE_POINTS = 8  # K: points on each circle of the flatness figure
GROUP_HELP = ("comma-separated blocks: 'ih:z', 'hh:n', ... (matrix:gate); a gate alone ('z') means that gate "
              "in both matrices; a matrix alone ('hh') all its gates; 'all' every gate of both")

# ---------------------------------------------------------------------------------------------
# Weight groups and directions
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# The fixed evaluation slice
# ---------------------------------------------------------------------------------------------


@dataclass
class EvalSlice:
    """Windows [(tokens, targets, resets) time-major [T, B] uint32], evaluated in order from zero state
    (the state carries from one window to the next, as in training)."""

    windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    T: int
    B: int
    source: str  # in words, for the summary and the npz

    @property
    def positions(self) -> int:
        return len(self.windows) * self.T * self.B

    @property
    def n_valid(self) -> int:
        return sum(count_valid(tg) for _, tg, _ in self.windows)

    def describe(self) -> str:
        return (f"{self.source}: {len(self.windows)} window(s) of T={self.T} x B={self.B}, "
                f"{self.n_valid:,} scored characters")

    def short(self) -> str:
        """For plot titles: what and how much, without paths."""
        what = "held-out split" if self.source.startswith("held-out") else Path(self.source).name
        return f"{what}, {self.n_valid:,} chars"


def heldout_slice(corpus, cfg, tokens: int = DEFAULT_TOKENS) -> EvalSlice:
    """The held-out split in the run's own lanes (B) and window (T), as `catchat eval` and the
    trainer's evals lay it out: the first ceil(tokens / (B*T)) windows, or, when tokens is less
    than one window, the first ceil(tokens / T) lanes of the first window. Padding is not scored."""
    from catchat.lanes import Lanes

    lanes = Lanes.from_config(corpus, cfg, "eval")
    T, B, tokens = lanes.T, lanes.B, int(tokens)
    n = min(lanes.windows_per_cycle, max(1, math.ceil(tokens / (B * T))))
    b = min(B, max(1, math.ceil(tokens / T)))
    wins = [lanes.window(0, i) for i in range(n)]
    return EvalSlice([(w.tokens[:, :b].copy(), w.targets[:, :b].copy(), w.resets[:, :b].copy()) for w in wins],
                     T, b, f"held-out split of {getattr(corpus, 'path', corpus)}")


def text_slice(text: str, T: int, B: int, tokens: int = DEFAULT_TOKENS, source: str = "text") -> EvalSlice:
    """`text` encoded as one conversation (<bos> text <eos>), its first `tokens` next-character
    predictions cut into up to B contiguous lanes (each lane from zero state) and windows of T."""
    ids = np.concatenate([[vocab.BOS], vocab.encode_ids(text), [vocab.EOS]]).astype(np.uint32)
    P = min(len(ids) - 1, int(tokens))  # predictions: ids[i] -> ids[i + 1]
    if P < 1 or len(ids) <= 2:
        raise UsageError(f"{source} has no text to evaluate on", hint="give a file with some text in it")
    B_eff = max(1, min(int(B), math.ceil(P / T)))
    S = math.ceil(P / B_eff)  # predictions per lane
    W = math.ceil(S / T)
    windows = []
    for w in range(W):
        tok = np.zeros((T, B_eff), np.uint32)
        tgt = np.zeros((T, B_eff), np.uint32)
        rst = np.zeros((T, B_eff), np.uint32)
        if w == 0:
            rst[0, :] = 1  # every lane starts from zero state
        for b in range(B_eff):
            lo = b * S + w * T  # first prediction of this window in lane b
            hi = min(b * S + S, P, lo + T)
            if hi <= lo:
                continue
            tok[: hi - lo, b] = ids[lo:hi]
            tgt[: hi - lo, b] = ids[lo + 1:hi + 1]
        windows.append((tok, tgt, rst))
    return EvalSlice(windows, int(T), B_eff, source)


# ---------------------------------------------------------------------------------------------
# Evaluators: flat float64 parameters -> plain cross-entropy over the slice (nats/char)
# ---------------------------------------------------------------------------------------------


class GpuEvaluator:
    """One forward-only Program at the slice's (T, B); each call uploads the parameters and replays
    the recorded eval sequence over the slice's windows (float32 on the device)."""

    name = "gpu"

    def __init__(self, dev, spec: ModelSpec, data: EvalSlice):
        from catchat.vk.program import Program

        self.spec, self.data = spec, data
        self.prog = Program(dev, spec, data.T, data.B, training=False)

    def __call__(self, flat: np.ndarray) -> float:
        self.prog.set_params(np.asarray(flat, np.float32))
        return self.prog.evaluate_windows(self.data.windows)["loss"]


class ReferenceEvaluator:
    """The numpy reference model (float64 by default) over the same windows, from zero state."""

    name = "numpy"

    def __init__(self, spec: ModelSpec, data: EvalSlice, dtype=np.float64):
        self.spec, self.data, self.dtype = spec, data, dtype
        self.layout = ParamLayout(spec)

    def __call__(self, flat: np.ndarray) -> float:
        params = self.layout.unflatten(np.asarray(flat, self.dtype))
        h = np.zeros((self.spec.layers, self.data.B, self.spec.hidden), self.dtype)  # [L,B,H]
        loss_sum, n = 0.0, 0
        for tok, tgt, rst in self.data.windows:
            nv = count_valid(tgt)
            res = ref.model_forward_backward(params, self.spec, tok, tgt, rst, h, nv, need_grads=False)
            loss_sum += res.loss * nv
            n += nv
            h = res.hT
        return loss_sum / n if n else float("nan")


# ---------------------------------------------------------------------------------------------
# Surfaces
# ---------------------------------------------------------------------------------------------


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
            make_evaluator: Callable[[ModelSpec], Callable[[np.ndarray], float]], *, layers: Sequence[int] | None,
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
            ev = evaluators[spec] = make_evaluator(spec)
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


# ---------------------------------------------------------------------------------------------
# Output: landscape.npz, landscape.csv, landscape.txt, PNGs
# ---------------------------------------------------------------------------------------------


def write_data(out_dir: Path, ls: Landscape) -> list[Path]:
    """landscape.npz (arrays + info JSON), landscape.csv (one row per grid point), landscape.txt."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    first = ls.checkpoints[0].surfaces[0]
    stack = lambda f: np.array([[f(s) for s in c.surfaces] for c in ls.checkpoints], np.float64)  # noqa: E731
    arrays = dict(
        alphas=first.alphas, betas=first.betas, layers=np.array(ls.layers, np.int64),
        loss=np.array([[s.loss for s in c.surfaces] for c in ls.checkpoints], np.float64),  # [C,L,N,N]
        centre=stack(lambda s: s.centre), rise_half=stack(lambda s: s.rise_half),
        rise_full=stack(lambda s: s.rise_full), tilt_half=stack(lambda s: s.tilt_half),
        tilt_full=stack(lambda s: s.tilt_full),
        circle_half=np.array([[s.circle_half for s in c.surfaces] for c in ls.checkpoints]),  # [C,L,K]
        circle_full=np.array([[s.circle_full for s in c.surfaces] for c in ls.checkpoints]),
        checkpoints=np.array([c.path for c in ls.checkpoints]), steps=np.array([c.global_step for c in ls.checkpoints]),
        seed=np.array(ls.seed), radius=np.array(ls.radius), group=np.array(ls.group.label),
        info=np.array(json.dumps(ls.info())))
    npz = out_dir / "landscape.npz"
    tmp = out_dir / ".landscape.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, npz)
    path_csv = out_dir / "landscape.csv"
    with open(path_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["checkpoint", "global_step", "layer", "alpha", "beta", "loss"])
        for c in ls.checkpoints:
            for s in c.surfaces:
                for i, a in enumerate(s.alphas):
                    for j, b in enumerate(s.betas):
                        w.writerow([c.path, c.global_step, s.layer, f"{a:.6g}", f"{b:.6g}", f"{s.loss[i, j]:.7f}"])
    txt = out_dir / "landscape.txt"
    txt.write_text("\n".join(ls.summary_lines() + [
        f"group {ls.group.label} · seed {ls.seed} · grid {ls.grid_n}x{ls.grid_n} "
        f"in [-{ls.radius:g}, {ls.radius:g}]^2 · "
        f"{ls.circle_points} points per circle · evaluator {ls.evaluator}", ls.slice_info]) + "\n")
    return [npz, path_csv, txt]


def load(path: str | Path) -> dict:
    """Read a landscape.npz back: its arrays, with `info` decoded from JSON."""
    with np.load(Path(path)) as z:
        out = {k: z[k] for k in z.files}
    out["info"] = json.loads(str(out["info"]))
    return out


def from_npz(path: str | Path) -> Landscape:
    """A Landscape rebuilt from landscape.npz (to draw it again: plot(out_dir, from_npz(p)))."""
    z = load(path)
    info = z["info"]
    cks = []
    for c, meta in enumerate(info["checkpoints"]):
        cs = CheckpointSurfaces(meta["path"], meta["label"], int(meta["global_step"]))
        for k, layer in enumerate(z["layers"].tolist()):
            cs.surfaces.append(Surface(layer=int(layer), alphas=z["alphas"], betas=z["betas"], loss=z["loss"][c, k],
                                       centre=float(z["centre"][c, k]), radius=float(z["radius"]),
                                       circle_half=z["circle_half"][c, k], circle_full=z["circle_full"][c, k]))
        cks.append(cs)
    return Landscape(cks, [int(x) for x in z["layers"]], parse_group(",".join(info["group"].split("+"))),
                     int(info["seed"]), float(info["radius"]), int(info["grid"]), info["evaluator"], info["slice"],
                     int(info["scored_characters"]), int(info["circle_points"]), info.get("slice_short", ""))


def rise_levels(lo: float, hi: float) -> list[float]:
    """Contour levels of the rise over the centre: 0 and a 1-2-5 sequence each way, covering [lo, hi]."""
    seq = [k * 10.0 ** e for e in range(-4, 4) for k in (1, 2, 5)]
    top = max(abs(lo), abs(hi), 1e-12)
    seq = [v for v in seq if v >= top * 2e-3] or [top]
    levels = [0.0]
    for sign, edge in ((1, hi), (-1, lo)):
        if sign * edge <= 0:
            continue
        for v in seq:
            levels.append(sign * v)
            if v >= sign * edge:
                break
    return sorted(levels)


def _band_colours(levels: list[float]):
    """One colour per band: viridis over the bands above the centre, greys below it."""
    from matplotlib import colormaps

    bands = list(zip(levels[:-1], levels[1:]))
    pos = [b for b in bands if b[0] >= 0]
    neg = [b for b in bands if b[1] <= 0]
    vir, grey = colormaps["viridis"], colormaps["Greys"]
    colours = [grey(0.15 + 0.45 * (i + 1) / max(len(neg), 1)) for i in range(len(neg))][::-1]
    colours += [vir(i / max(len(pos) - 1, 1)) for i in range(len(pos))]
    return colours


def plot(out_dir: Path, ls: Landscape, *, surface_3d: bool = True) -> list[Path]:
    """landscape-layer{l}.png per layer (one panel per checkpoint, side by side) and, when
    surface_3d, landscape-layer{l}-3d.png. Filled contours of the rise over the centre, at the same
    1-2-5 levels in every panel, so equal colours mean equal rises."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.colors import BoundaryNorm, ListedColormap
        from matplotlib.figure import Figure
        from matplotlib.patches import Circle
    except ImportError:
        raise UsageError("matplotlib is not installed", hint="pip install 'catchat[plot]'") from None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        path, tmp = out_dir / name, out_dir / f".{name}.tmp"
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
        written.append(path)

    C = len(ls.checkpoints)
    for k, layer in enumerate(ls.layers):
        surfs = [c.surfaces[k] for c in ls.checkpoints]
        rises = [s.loss - s.centre for s in surfs]
        lo = min(float(np.nanmin(r)) for r in rises)
        hi = max(float(np.nanmax(r)) for r in rises)
        levels = rise_levels(lo, hi)
        cmap = ListedColormap(_band_colours(levels))
        norm = BoundaryNorm(levels, cmap.N)
        fig = Figure(figsize=(6.0 * C + 1.0, 6.6), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, C, squeeze=False)[0]
        cf = None
        for ax, c, s, rise in zip(axes, ls.checkpoints, surfs, rises):
            A, B = np.meshgrid(s.alphas, s.betas, indexing="ij")
            cf = ax.contourf(A, B, rise, levels=levels, cmap=cmap, norm=norm)
            cl = ax.contour(A, B, rise, levels=[v for v in levels if v != 0], colors="k", linewidths=0.6, alpha=0.7)
            big = max(abs(lo), abs(hi))
            ax.clabel(cl, [v for v in cl.levels if abs(v) >= 0.02 * big], fmt=lambda v: f"{v:+g}", fontsize=7)
            for rho in (s.radius / 2, s.radius):
                ax.add_patch(Circle((0, 0), rho, fill=False, color="white", linestyle="--", linewidth=1.0))
            ax.plot([0], [0], marker="*", color="red", markersize=12, markeredgecolor="white")
            ax.set_aspect("equal")
            ax.set_xlabel(f"alpha (direction 1, filter-normalised)\n\nmean rise {s.rise_half:+.4f} at r/2 = "
                          f"{s.radius / 2:g}, {s.rise_full:+.4f} at r = {s.radius:g} (dashed circles)\n"
                          f"tilt {s.tilt_full:.4f} at r (the linear part; 0 at a minimum)")
            ax.set_ylabel("beta (direction 2)")
            ax.set_title(f"{c.label}: layer {layer} [{ls.group.label}], centre {s.centre:.4f} nats/char\n"
                         f"seed {ls.seed} · {ls.evaluator} · {ls.slice_short or 'fixed slice'}", fontsize=10)
        cb = fig.colorbar(cf, ax=list(axes), shrink=0.85, ticks=levels)
        cb.ax.set_yticklabels([f"{v:+g}" if v else "0" for v in levels])
        cb.set_label("loss rise over the centre (nats/char); grey: below it")
        save(fig, f"landscape-layer{layer}.png")

        if surface_3d:
            fig = Figure(figsize=(6.0 * C, 5.2), dpi=90, layout="constrained")
            FigureCanvasAgg(fig)
            for i, (c, s, rise) in enumerate(zip(ls.checkpoints, surfs, rises)):
                ax = fig.add_subplot(1, C, i + 1, projection="3d")
                A, B = np.meshgrid(s.alphas, s.betas, indexing="ij")
                ax.plot_surface(A, B, rise, cmap="viridis", vmin=lo, vmax=hi, linewidth=0.2, edgecolor="k",
                                alpha=0.9)
                ax.set_zlim(lo, hi if hi > lo else lo + 1e-6)  # the same scale in every panel
                ax.set_xlabel("alpha")
                ax.set_ylabel("beta")
                ax.set_zlabel("loss - centre (nats/char)")
                ax.set_title(f"{c.label}: layer {layer} [{ls.group.label}]\ncentre {s.centre:.4f} nats/char",
                             fontsize=10)
            save(fig, f"landscape-layer{layer}-3d.png")
    return written


def write_outputs(out_dir: Path, ls: Landscape, *, png: bool = True, surface_3d: bool = True) -> list[Path]:
    """The data files, then (when png) the plots; returns every path written."""
    paths = write_data(out_dir, ls)
    if png:
        paths += plot(out_dir, ls, surface_3d=surface_3d)
    return paths


def default_out_dir(ckpt_paths: Sequence[Path]) -> Path:
    """runs/<run>/landscape/step-N (or step-N-vs-step-M) for a checkpoint inside a run's
    checkpoints/ directory; otherwise CKPT_DIR/landscape."""
    first = Path(ckpt_paths[0])
    name = "-vs-".join(Path(p).name for p in ckpt_paths)
    if first.parent.name == "checkpoints":
        return first.parent.parent / "landscape" / name
    return first / "landscape" if len(ckpt_paths) == 1 else first / "landscape" / name
