"""Weight statistics of a checkpoint (`catchat inspect`): per tensor, spectral norms, changes.

Pure numpy on the checkpoint's model.safetensors: no Vulkan device, no catchat.vk import.
Every statistic is computed in float64 from the stored float32 values.

    stats = tensor_stats(params)                  # shape, norm, mean, std, min, max, max |x|
    sig = spectral_norms(params, hidden)          # each GRU matrix [3H,H] and its r/z/n blocks [H,H]
    diff = compare(params_a, params_b)            # norm growth and relative change per tensor
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

GATES = ("r", "z", "n")


@dataclass(frozen=True)
class TensorStats:
    """Summary numbers of one tensor (float64 arithmetic)."""

    name: str
    shape: tuple[int, ...]
    size: int
    norm: float  # Frobenius / L2 norm of all elements
    mean: float
    std: float  # population standard deviation (numpy's default, ddof=0)
    min: float
    max: float
    absmax: float  # max |x|
    rms: float  # norm / sqrt(size)


@dataclass(frozen=True)
class SpectralStats:
    """Largest singular value of a GRU weight matrix and of each of its gate blocks."""

    name: str  # layers.{l}.gru.weight_ih / weight_hh
    full: float  # the whole [3H, H] matrix
    r: float  # rows [0, H)
    z: float  # rows [H, 2H)
    n: float  # rows [2H, 3H)

    def block(self, gate: str) -> float:
        return getattr(self, gate)


@dataclass(frozen=True)
class TensorChange:
    """How one tensor moved from checkpoint A to checkpoint B."""

    name: str
    shape: tuple[int, ...]
    norm_a: float
    norm_b: float
    growth: float  # norm_b / norm_a - 1 (nan when norm_a = 0)
    rel_change: float  # ||B - A|| / ||A|| (nan when norm_a = 0)
    cosine: float  # <A, B> / (||A|| ||B||) (nan when either is 0)


def _f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def tensor_stats(params: dict[str, np.ndarray], order: list[str] | None = None) -> list[TensorStats]:
    """Stats of every tensor, in `order` (default: the dict's order)."""
    out = []
    for name in order or list(params):
        a = _f64(params[name])
        flat = a.reshape(-1)
        norm = float(np.linalg.norm(flat))
        out.append(TensorStats(name=name, shape=tuple(int(s) for s in a.shape), size=int(flat.size), norm=norm,
                               mean=float(flat.mean()), std=float(flat.std()), min=float(flat.min()),
                               max=float(flat.max()), absmax=float(np.abs(flat).max()),
                               rms=norm / math.sqrt(flat.size)))
    return out


def is_gru_matrix(name: str) -> bool:
    return name.endswith(".gru.weight_ih") or name.endswith(".gru.weight_hh")


def spectral_norm(W: np.ndarray) -> float:
    """Largest singular value (np.linalg.norm(W, 2))."""
    return float(np.linalg.norm(_f64(W), 2))


def spectral_norms(params: dict[str, np.ndarray], order: list[str] | None = None) -> list[SpectralStats]:
    """Spectral norm of every GRU weight matrix [3H, H] and of its r, z, n blocks [H, H]."""
    out = []
    for name in order or list(params):
        if not is_gru_matrix(name):
            continue
        W = _f64(params[name])
        H = W.shape[0] // 3
        blocks = {g: spectral_norm(W[i * H:(i + 1) * H]) for i, g in enumerate(GATES)}
        out.append(SpectralStats(name=name, full=spectral_norm(W), **blocks))
    return out


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray], order: list[str] | None = None
            ) -> tuple[list[TensorChange], list[str]]:
    """Per-tensor change from A to B for tensors present in both with equal shapes; also returns
    one line per tensor that is only in one of them or whose shape differs."""
    names = order or list(a)
    changes, notes = [], []
    for name in names:
        if name not in b:
            notes.append(f"{name}: only in A")
            continue
        A, B = _f64(a[name]).reshape(-1), _f64(b[name]).reshape(-1)
        if a[name].shape != b[name].shape:
            notes.append(f"{name}: shape {tuple(a[name].shape)} in A, {tuple(b[name].shape)} in B")
            continue
        na, nb = float(np.linalg.norm(A)), float(np.linalg.norm(B))
        nan = float("nan")
        changes.append(TensorChange(
            name=name, shape=tuple(int(s) for s in a[name].shape), norm_a=na, norm_b=nb,
            growth=nb / na - 1 if na > 0 else nan,
            rel_change=float(np.linalg.norm(B - A)) / na if na > 0 else nan,
            cosine=float(A @ B) / (na * nb) if na > 0 and nb > 0 else nan))
    notes += [f"{name}: only in B" for name in b if name not in a]
    return changes, notes


def total_norm(params: dict[str, np.ndarray]) -> float:
    """L2 norm of all parameters together."""
    return math.sqrt(sum(float(np.sum(_f64(v) ** 2)) for v in params.values()))


def layout_order(params: dict[str, np.ndarray], state: dict) -> list[str]:
    """Checkpoint (ParamLayout) order when the state's config gives the model; else sorted names."""
    try:
        from catchat import config as cfgmod
        from catchat.model import param_specs

        cfg = cfgmod.from_dict(state["config"], source="state.json")
        names = [p.name for p in param_specs(cfgmod.model_spec(cfg))]
        if set(names) == set(params):
            return names
    except Exception:  # a checkpoint from another version: plain order is fine for statistics
        pass
    return sorted(params)


def report(path, compare_path=None) -> dict:
    """Everything `catchat inspect` shows, as plain data (what --json prints)."""
    from catchat.run import checkpoint as ck

    a = ck.load_checkpoint(path)
    order = layout_order(a.params, a.state)
    out = dict(checkpoint=str(a.path), global_step=a.global_step, model=a.state.get("model", {}),
               parameters=int(sum(v.size for v in a.params.values())), total_norm=total_norm(a.params),
               tensors=[asdict(s) for s in tensor_stats(a.params, order)],
               spectral=[asdict(s) for s in spectral_norms(a.params, order)])
    if compare_path is not None:
        b = ck.load_checkpoint(compare_path)
        changes, notes = compare(a.params, b.params, order)
        spec_b = {s.name: s for s in spectral_norms(b.params, layout_order(b.params, b.state))}
        out["compare"] = dict(checkpoint=str(b.path), global_step=b.global_step, total_norm=total_norm(b.params),
                              changes=[asdict(c) for c in changes], notes=notes,
                              spectral=[asdict(s) for s in spec_b.values()])
    return out


# ---------------------------------------------------------------------------------------------
# `catchat inspect` as text: the report's lines and tables, in print order (the CLI draws them)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]


def _nan_or(fmt: str, v: float) -> str:
    return "n/a" if math.isnan(v) else format(v, fmt)


def inspect_sections(rep: dict) -> list[str | Table]:
    """What `catchat inspect` prints for a `report`: lines (str) and tables, in order."""
    out: list[str | Table] = [
        f"{rep['checkpoint']} · step {rep['global_step']:,} · {rep['parameters']:,} parameters · "
        f"total norm {rep['total_norm']:.4f}",
        Table("weights", ("tensor", "shape", "norm", "rms", "mean", "std", "min", "max"),
              [(s["name"], "x".join(map(str, s["shape"])), f"{s['norm']:.4f}", f"{s['rms']:.4f}",
                f"{s['mean']:+.4f}", f"{s['std']:.4f}", f"{s['min']:+.4f}", f"{s['max']:+.4f}")
               for s in rep["tensors"]])]
    cmp = rep.get("compare")
    other = {s["name"]: s for s in cmp["spectral"]} if cmp else {}

    def sig(s, key):
        b = other.get(s["name"])
        if not b:
            return f"{s[key]:.4f}"
        pct = f"{100 * (b[key] / s[key] - 1):+.1f}%" if s[key] > 0 else "n/a"
        return f"{s[key]:.4f} -> {b[key]:.4f} ({pct})"

    out.append(Table("spectral norms (largest singular value)" + (" A -> B" if cmp else ""),
                     ("GRU matrix", "sigma [3H,H]", "sigma r", "sigma z", "sigma n"),
                     [(s["name"], *(sig(s, k) for k in ("full", "r", "z", "n"))) for s in rep["spectral"]]))
    if not cmp:
        return out
    out.append(f"A = {rep['checkpoint']} (step {rep['global_step']:,}), "
               f"B = {cmp['checkpoint']} (step {cmp['global_step']:,})")
    out.append(Table("change A -> B", ("tensor", "norm A", "norm B", "norm growth", "||B-A|| / ||A||", "cos(A, B)"),
                     [(c["name"], f"{c['norm_a']:.4f}", f"{c['norm_b']:.4f}",
                       "n/a" if math.isnan(c["growth"]) else f"{100 * c['growth']:+.1f}%",
                       _nan_or(".4f", c["rel_change"]), _nan_or(".4f", c["cosine"])) for c in cmp["changes"]]))
    g = cmp["total_norm"] / rep["total_norm"] - 1 if rep["total_norm"] else float("nan")
    out.append(f"total norm {rep['total_norm']:.4f} -> {cmp['total_norm']:.4f} ({100 * g:+.1f}%)")
    out += [f"note: {note}" for note in cmp["notes"]]
    return out
