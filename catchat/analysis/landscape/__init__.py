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
model (catchat.model.reference) on the same windows: the oracle.

    sl = heldout_slice(corpus, cfg, tokens=2048)            # or text_slice(text, T, B, tokens)
    ev = GpuEvaluator(dev, layout, sl)                       # or ReferenceEvaluator(spec, sl)
    surf = layer_surface(ev, layout, flat, layer=0, group=parse_group("z"), seed=0,
                         alphas=grid(11, 0.5), radius=0.5)
    write_outputs(out_dir, result)                          # PNGs, landscape.npz, landscape.csv

The modules: directions (weight groups, filter-normalised directions), evaluation (the slice and
the evaluators), surface (grid, circles, Surface, compute), plots (the PNGs), files (npz / csv /
txt written and read back), command (`catchat landscape`: arguments -> Job -> surfaces -> files).
"""

from catchat.analysis.landscape.command import Job, checkpoint_label, prepare
from catchat.analysis.landscape.directions import (
    DEFAULT_GROUP,
    GATES,
    GROUP_HELP,
    MATRICES,
    Group,
    directions,
    filter_normalise,
    parse_group,
)
from catchat.analysis.landscape.evaluation import (
    DEFAULT_TOKENS,
    EvalSlice,
    GpuEvaluator,
    ReferenceEvaluator,
    heldout_slice,
    text_slice,
)
from catchat.analysis.landscape.files import default_out_dir, from_npz, load, write_data, write_outputs
from catchat.analysis.landscape.plots import plot, rise_levels
from catchat.analysis.landscape.surface import (
    CIRCLE_POINTS,
    DEFAULT_GRID,
    DEFAULT_RADIUS,
    CheckpointSurfaces,
    Landscape,
    Surface,
    circle,
    compute,
    evaluations_per_layer,
    grid,
    layer_surface,
    points_of,
    tilt,
)

__all__ = [
    "CIRCLE_POINTS", "DEFAULT_GRID", "DEFAULT_GROUP", "DEFAULT_RADIUS", "DEFAULT_TOKENS", "GATES", "GROUP_HELP",
    "MATRICES", "CheckpointSurfaces", "EvalSlice", "GpuEvaluator", "Group", "Job", "Landscape", "ReferenceEvaluator",
    "Surface", "checkpoint_label", "circle", "compute", "default_out_dir", "directions", "evaluations_per_layer",
    "filter_normalise", "from_npz", "grid", "heldout_slice", "layer_surface", "load", "parse_group", "plot",
    "points_of", "prepare", "rise_levels", "text_slice", "tilt", "write_data", "write_outputs",
]
