"""What `catchat landscape` writes (landscape.npz, landscape.csv, landscape.txt, the PNGs) and reads back."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from catchat.analysis.landscape.directions import parse_group
from catchat.analysis.landscape.plots import plot
from catchat.analysis.landscape.surface import CheckpointSurfaces, Landscape, Surface


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
