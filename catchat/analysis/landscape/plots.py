"""Contour (and 3-D) PNGs of the rise over the centre, at the same levels in every panel."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from catchat.analysis.landscape.surface import Landscape
from catchat.errors import UsageError


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
