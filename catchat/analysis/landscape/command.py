"""`catchat landscape`: the command's work, from its arguments to the files; the CLI parses and prints.

    job = prepare(ckpt, layers=[0], group="z", grid_n=11, radius=0.5)   # checkpoints, slice, evaluator
    print("\n".join(job.plan_lines()))
    result = job.run(on_point=bar.advance, on_surface=print)           # a summary line per surface
    out_dir, paths = job.write(result, out=None, warn=print)            # npz, csv, txt, PNGs
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from catchat.analysis.landscape import surface
from catchat.analysis.landscape.directions import DEFAULT_GROUP, Group, parse_group
from catchat.analysis.landscape.evaluation import DEFAULT_TOKENS, EvalSlice, choose_evaluator, choose_slice
from catchat.analysis.landscape.files import default_out_dir, write_data, write_outputs
from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout

Entry = tuple[str, str, int, ModelSpec, dict[str, np.ndarray]]  # (path, label, step, spec, params): for compute


def checkpoint_label(ckpt) -> str:
    """'<run> step N' for a checkpoint inside runs/<run>/checkpoints/, else its directory name."""
    run = ckpt.path.parent.parent.name if ckpt.path.parent.name == "checkpoints" else ckpt.path.name
    return f"{run} step {ckpt.global_step:,}"


@dataclass
class Job:
    """One `catchat landscape`, ready to run: checkpoints loaded and checked, slice cut, evaluator chosen."""

    ckpt_paths: list[Path]
    entries: list[Entry]
    data: EvalSlice
    make_evaluator: Callable[[ParamLayout], Callable[[np.ndarray], float]]
    where: str  # the evaluator, in words
    layers: list[int]  # as given ([]: every layer)
    n_layers: int
    group: Group
    seed: int
    grid_n: int
    radius: float

    @property
    def per_layer(self) -> int:
        return surface.evaluations_per_layer(self.grid_n, self.radius)

    @property
    def total(self) -> int:
        """Evaluations in all (the progress bar's length)."""
        return self.per_layer * self.n_layers * len(self.entries)

    def plan_lines(self) -> list[str]:
        """What will be evaluated, on what, how many times (printed before the work starts)."""
        n = self.grid_n
        return [f"{self.data.describe()}; evaluating on {self.where}",
                f"{len(self.entries)} checkpoint(s) x {self.n_layers} layer(s) x {self.per_layer} points "
                f"({n}x{n} grid + centre + 2 circles of {surface.CIRCLE_POINTS}) = {self.total} evaluations; "
                f"group {self.group.label}, seed {self.seed}"]

    def run(self, on_point: Callable[[], None] | None = None,
            on_surface: Callable[[str], None] | None = None) -> surface.Landscape:
        """Every surface; `on_point` after each evaluation, `on_surface` with each surface's summary line."""
        many = len(self.entries) > 1

        def surface_done(c: surface.CheckpointSurfaces, s: surface.Surface) -> None:
            if on_surface:
                on_surface(s.summary(self.group.label, prefix=f"{c.label}: " if many else "") + f" · {s.seconds:.1f} s")

        return surface.compute(self.entries, self.data, self.make_evaluator, layers=self.layers or None,
                               group=self.group, seed=self.seed, grid_n=self.grid_n, radius=self.radius,
                               on_point=on_point, on_surface=surface_done)

    def write(self, result: surface.Landscape, out: str | Path | None = None, *, surface_3d: bool = True,
              warn: Callable[[str], None] | None = None) -> tuple[Path, list[Path]]:
        """The files, in `out` or `default_out_dir`; without matplotlib only the data files (`warn` says so).
        Returns (the directory, the paths written)."""
        out_dir = Path(out) if out else default_out_dir(self.ckpt_paths)
        try:
            paths = write_outputs(out_dir, result, surface_3d=surface_3d)
        except UsageError as e:
            if "matplotlib" not in e.message:
                raise
            paths = write_data(out_dir, result)
            if warn:
                warn(f"no PNGs: {e.message} (fix: {e.hint})")
        return out_dir, paths


def prepare(checkpoint: str | Path, compare: str | Path | None = None, *, layers: Sequence[int] = (),
            group: str = DEFAULT_GROUP, grid_n: int = surface.DEFAULT_GRID, radius: float = surface.DEFAULT_RADIUS,
            seed: int = 0, tokens: int = DEFAULT_TOKENS, text_file: str | Path | None = None, fmt: str = "auto",
            corpus_path: str | None = None, reference: bool = False, device=None) -> Job:
    """Load the checkpoint (and `compare`) and check its tensors against its config, check `layers`,
    cut the slice (`text_file`, read as `fmt`, else the held-out split of `corpus_path` or the run's
    corpus) and choose the evaluator (the numpy reference with `reference`, else a forward-only program on `device`)."""
    from catchat import config as cfgmod
    from catchat.model import param_specs
    from catchat.run import checkpoint as ck

    grp = parse_group(group)
    ckpts = [ck.load_checkpoint(checkpoint)] + ([ck.load_checkpoint(compare)] if compare else [])
    cfgs, entries = [], []
    for c in ckpts:
        cfg_c = cfgmod.from_dict(c.state["config"], source=str(c.path / ck.STATE_FILE))
        spec = cfgmod.model_spec(cfg_c)
        ck.check_shapes(c.params, {p.name: p.shape for p in param_specs(spec)}, str(c.path))
        cfgs.append(cfg_c)
        entries.append((str(c.path), checkpoint_label(c), c.global_step, spec, c.params))
    max_layers = min(e[3].layers for e in entries)
    for layer in layers:
        if layer >= max_layers:
            raise UsageError(f"--layer {layer}: the model has {max_layers} layers (0..{max_layers - 1})",
                             hint="choose a layer that exists in every checkpoint")
    data = choose_slice(cfgs[0], tokens, text_file, corpus_path, fmt)
    make, where = choose_evaluator(data, reference, device)
    return Job([c.path for c in ckpts], entries, data, make, where, list(layers),
               len(set(layers)) if layers else max_layers, grp, seed, grid_n, radius)
