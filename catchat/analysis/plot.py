"""Plots and a text summary of a run directory (`runs/<name>/`, docs/training.md "Files").

Reads three files, all written by the trainer while it runs (so any of them may be mid-write):
    metrics.csv   a header, then one row per optimizer step:
                  global_step,seqs,cycle,tokens,lr,tf,loss,grad_norm,clipped,valid_tokens,
                  tokens_per_s,step_ms,gradh_clamp_hits,skipped
                  (seqs and tokens are cumulative; loss is empty or nan on a skipped step)
    events.jsonl  one JSON object per line, {"event": "eval" | "resume" | "skipped_step" | ...}
    config.toml   the resolved config (optional here: the clip line and the cooldown mark)

catchat.run.runlog reads both telemetry files (the same reader as `catchat scan`): lines it cannot use
(not valid UTF-8, over-long, wrong cells, wrong-typed event fields) are skipped and named in a
warning line of the summary; a last line cut short (a crash, or read mid-write) is skipped quietly.
Unknown events and columns are ignored.

A resumed run restarts from a checkpoint at step N and logs N+1, N+2, ... again. Whatever the first
attempt logged after N belongs to an abandoned timeline: a metrics row whose step is not above the
previous row's drops every kept row from that step on (so the last row for a step wins), and a
"resume" (or "branch") event at N drops earlier evals and skipped steps after N.

    plot_run(run_dir, out_dir=None) -> [Path]   loss, lr, grad_norm, throughput, accuracy PNGs, and
                                                index.html showing them with the summary and config
    summarise_run(run_dir) -> [str]             a few lines for `catchat plot` to print
    load_run(run_dir) -> Run                    the parsed files (used by both)
    write_html(run_dir, out_dir, pngs) -> Path  the page alone (plot_run calls it)

matplotlib is an optional extra (`pip install 'catchat[plot]'`): imported when plot_run is called,
drawn with the Agg canvas directly (no pyplot, no global backend switch).
"""

from __future__ import annotations

import html
import math
import os
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from catchat.errors import UsageError
from catchat.run.runlog import WRITTEN_COLUMNS, describe_bad, numbers, read_events, read_metrics, read_or_refuse

LN2 = math.log(2.0)
INDEX_HTML = "index.html"


# ----------------------------------------------------------------------------------------------
# reading a run

@dataclass
class Run:
    """A run directory, parsed. `m[col]` is a float array per metrics column, one entry per kept
    step, ascending global_step (a column absent from the file is all nan)."""

    path: Path
    m: dict[str, np.ndarray]
    evals: list[dict] = field(default_factory=list)        # "eval" events, ascending global_step
    resumes: list[int] = field(default_factory=list)       # global_step each resume started from
    skipped_steps: list[int] = field(default_factory=list)  # from metrics `skipped` and events
    clip: float | None = None                              # train.clip (None: no config or 0)
    cooldown_start: int | None = None                      # first cooldown step (None: unknown)
    label_smoothing: float = 0.0
    warnings: list[str] = field(default_factory=list)     # lines of the files that were skipped

    @property
    def steps(self) -> np.ndarray:
        return self.m["global_step"]

    def tokens_at(self, step) -> np.ndarray:
        """Tokens seen after `step` optimizer steps (interpolated from metrics; 0 at step 0)."""
        s, t = self.steps, self.m["tokens"]
        ok = np.isfinite(t)
        return np.interp(step, np.r_[0.0, s[ok]], np.r_[0.0, t[ok]])

    @property
    def has_tokens(self) -> bool:
        return bool(np.isfinite(self.m["tokens"]).any())


def _read_metrics(path: Path, warnings: list[str]) -> dict[str, np.ndarray]:
    """metrics.csv as a float array per column, one entry per step of the kept timeline."""
    hint = "wait for the run's first optimizer step, or pass a run directory (runs/<name>/)"
    if not path.is_file():
        raise UsageError(f"no metrics in {path} yet", hint=hint)
    log = read_or_refuse(path, read_metrics)
    if not log.header:
        raise UsageError(f"{path} line {log.bad[0][0]}: {log.bad[0][1]}",
                         hint="metrics.csv is written by catchat's trainer; is this a run directory?")
    if log.n_bad:
        warnings.append(f"warning: {path.name}: {describe_bad(log)} skipped")
    rows: list[dict] = []
    for cells in log.rows:
        vals = numbers(cells, log.header)
        while rows and rows[-1]["global_step"] >= vals["global_step"]:  # a rewind (resume): the later wins
            rows.pop()
        rows.append(vals)
    if not rows:
        raise UsageError(f"no metrics in {path} yet" + (f" ({describe_bad(log)})" if log.n_bad else ""), hint=hint)
    # the appended columns (runlog.LATER_COLUMNS) are nan where the file has none (an older catchat)
    return {c: np.array([v.get(c, math.nan) for v in rows], dtype=np.float64) for c in WRITTEN_COLUMNS}


def _read_events(path: Path, warnings: list[str]) -> list[dict]:
    if not path.is_file():
        return []
    log = read_or_refuse(path, read_events)
    if log.n_bad:
        warnings.append(f"warning: {path.name}: {describe_bad(log)} skipped")
    return log.events


def _read_config(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return {}                                      # optional: plots just lose two annotations


def _cooldown_start(cfg: dict) -> int | None:
    """First cooldown step, as catchat.run.schedule.phases computes it (None if unknown or no cooldown)."""
    total = cfg.get("train", {}).get("total_steps", 0)
    sched = cfg.get("schedule", {})
    frac, warm_frac = sched.get("cooldown_fraction", 0.0), sched.get("warmup_fraction", 0.0)
    if not isinstance(total, int) or total < 1 or not frac:   # total_steps = 0: planned by cycles
        return None
    warm = min(int(round(warm_frac * total)), total)
    cool = min(int(round(frac * total)), total - warm)
    return total - cool if cool > 0 else None


def load_run(run_dir: Path) -> Run:
    """Parse metrics.csv (required, >= 1 row), events.jsonl and config.toml (both optional)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory", hint="pass a run directory, e.g. runs/tiny")
    warnings: list[str] = []
    m = _read_metrics(run_dir / "metrics.csv", warnings)

    evals: list[dict] = []                             # stacks in log order: a rewind pops what it abandons
    skipped = {int(s) for s, k in zip(m["global_step"], m["skipped"]) if k == 1}
    skipped_events: list[int] = []
    resumes: list[int] = []
    for e in _read_events(run_dir / "events.jsonl", warnings):  # known fields have their types (runlog)
        step = e["global_step"]
        if e["event"] in ("resume", "branch"):
            if e["event"] == "branch":                 # back to the checkpoint at branch_step
                step = max(e["branch_step"], 0)
            else:
                resumes.append(step)
            while evals and evals[-1]["global_step"] > step:
                evals.pop()
            while skipped_events and skipped_events[-1] > step:
                skipped_events.pop()
        elif e["event"] == "eval":
            evals.append(e)
        elif e["event"] == "skipped_step":
            skipped_events.append(step)
    by_step = {e["global_step"]: e for e in evals}     # the last eval for a step wins

    cfg = _read_config(run_dir / "config.toml")
    clip = cfg.get("train", {}).get("clip")
    smoothing = cfg.get("train", {}).get("label_smoothing", 0.0)
    return Run(path=run_dir, m=m, evals=[by_step[s] for s in sorted(by_step)], resumes=sorted(set(resumes)),
               skipped_steps=sorted(skipped | set(skipped_events)),
               clip=float(clip) if isinstance(clip, (int, float)) and clip > 0 else None,
               cooldown_start=_cooldown_start(cfg),
               label_smoothing=float(smoothing) if isinstance(smoothing, (int, float)) else 0.0,
               warnings=warnings)


# ----------------------------------------------------------------------------------------------
# summary

def _last_finite(a: np.ndarray) -> tuple[int, float] | None:
    idx = np.flatnonzero(np.isfinite(a))
    return (int(idx[-1]), float(a[idx[-1]])) if idx.size else None


def summarise_run(run_dir: Path) -> list[str]:
    """A few lines about a run: progress, last train loss, best eval, throughput, skipped steps."""
    run = load_run(run_dir)
    m, n = run.m, len(run.steps)
    last_step = int(run.steps[-1])
    tokens = _last_finite(m["tokens"])
    lines = [f"steps: {last_step:,}" + (f" · tokens: {tokens[1]:,.0f}" if tokens else "")
             + (f" · cycle {m['cycle'][-1]:.0f}" if np.isfinite(m["cycle"][-1]) else "")]

    loss = _last_finite(m["loss"])
    if loss:
        i, v = loss
        lines.append(f"train loss: {v:.4f} nats/char ({v / LN2:.4f} bpc) at step {int(run.steps[i]):,}")
    else:
        lines.append("train loss: none (no finite loss logged)")

    if run.evals:
        best = min(run.evals, key=lambda e: e["loss"] if math.isfinite(e["loss"]) else math.inf)
        bpc = best.get("bpc", best["loss"] / LN2)
        line = f"best eval: {best['loss']:.4f} nats/char ({bpc:.4f} bpc) at step {int(best['global_step']):,}"
        fr = best.get("free_running")
        if isinstance(fr, dict) and isinstance(fr.get("loss"), (int, float)):
            line += f" · free-running {fr['loss']:.4f} nats/char ({fr.get('bpc', fr['loss'] / LN2):.4f} bpc)"
        lines.append(line + f" · {len(run.evals)} evals")
    else:
        lines.append("eval: none yet")

    k = max(1, math.ceil(0.1 * n))
    tail = m["tokens_per_s"][-k:]
    tail = tail[np.isfinite(tail)]
    if tail.size:
        lines.append(f"throughput: {tail.mean():,.0f} tokens/s (mean over the last {k:,} steps)")

    clipped = int(np.nansum(m["clipped"] == 1))
    line = f"skipped steps: {len(run.skipped_steps)}"
    if run.skipped_steps:
        shown = ", ".join(f"{s:,}" for s in run.skipped_steps[:5])
        line += f" ({shown}{', ...' if len(run.skipped_steps) > 5 else ''})"
    line += f" · clipped steps: {clipped:,} ({100.0 * clipped / n:.1f}%)"
    hits = m["gradh_clamp_hits"]
    if np.nansum(hits) > 0:
        line += f" · gradh clamp hits: {np.nansum(hits):,.0f} in {int(np.sum(hits > 0))} steps"
    lines.append(line)
    if run.resumes:
        lines.append("resumed from step " + ", ".join(f"{s:,}" for s in run.resumes))
    return lines + run.warnings


# ----------------------------------------------------------------------------------------------
# plots

def _smooth(y: np.ndarray, w: int) -> np.ndarray:
    """Centred rolling mean over w points, ignoring non-finite values (nan where a window has none)."""
    ok = np.isfinite(y)
    k = np.ones(max(1, min(w, y.size)))                 # np.convolve "same" is as long as the longer
    s = np.convolve(np.where(ok, y, 0.0), k, mode="same")
    c = np.convolve(ok.astype(np.float64), k, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        out = s / c
    out[c == 0] = np.nan
    return out


def _smooth_segments(y: np.ndarray, w: int, steps: np.ndarray, resumes: list[int]) -> np.ndarray:
    """_smooth within each stretch between resumes, so one attempt's speed never blends into the next."""
    cuts = np.searchsorted(steps, resumes, side="right")
    return np.concatenate([_smooth(part, w) for part in np.split(y, cuts) if part.size] or [y])


def _window(n: int) -> int:
    """~1% of the steps, at least 10 points once there are 100 steps."""
    return max(1, n // 100, min(10, n // 10))


def _matplotlib() -> SimpleNamespace:
    """The few matplotlib names the plots use (Agg canvas, no pyplot); a UsageError without it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import EngFormatter, FuncFormatter, PercentFormatter
        from matplotlib.transforms import blended_transform_factory
    except ImportError:
        raise UsageError("matplotlib is not installed", hint="pip install 'catchat[plot]'") from None
    return SimpleNamespace(FigureCanvasAgg=FigureCanvasAgg, Figure=Figure, EngFormatter=EngFormatter,
                           FuncFormatter=FuncFormatter, PercentFormatter=PercentFormatter,
                           blended_transform_factory=blended_transform_factory)


class _Plots:
    """What every plot shares: the run, its x axis (tokens, else steps), the evals' x and free-running
    results, the smoothing window, and the figure, marks, legend and save helpers."""

    def __init__(self, run: Run, out_dir: Path, mpl: SimpleNamespace):
        self.run, self.out_dir, self.mpl = run, out_dir, mpl
        self.m, self.steps, self.name = run.m, run.steps, run.path.name
        self.w = _window(len(self.steps))
        self.written: list[Path] = []
        if run.has_tokens:
            self.x_train, self.x_label, self.to_x = self.m["tokens"], "tokens seen", run.tokens_at
        else:                                           # no tokens column: fall back to steps
            self.x_train, self.x_label = self.steps, "global step (optimizer steps completed)"
            self.to_x = lambda s: s
        self.ex = np.array([e["tokens"] if isinstance(e.get("tokens"), (int, float))
                            else self.to_x(e["global_step"]) for e in run.evals], dtype=np.float64)
        self.fr = [e.get("free_running") for e in run.evals]
        self.fr_i = [i for i, f in enumerate(self.fr)
                     if isinstance(f, dict) and isinstance(f.get("loss"), (int, float))]

    def new(self, title: str, xlabel: str):
        fig = self.mpl.Figure(figsize=(10, 5.2), dpi=110, layout="constrained")
        self.mpl.FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.set_title(f"{self.name}: {title}")
        ax.set_xlabel(xlabel)
        ax.grid(True, which="major", alpha=0.35)
        return fig, ax

    def marks(self, ax, to_x=lambda s: s):
        """Resume points (dotted) and the cooldown start (dash-dot), in the axis' x units."""
        for i, s in enumerate(self.run.resumes):
            ax.axvline(to_x(s), color="0.35", linestyle=":", linewidth=1.3,
                       label="resume" if i == 0 else None)
        c = self.run.cooldown_start
        if c is not None and c <= self.steps[-1]:
            ax.axvline(to_x(c), color="tab:purple", linestyle="-.", linewidth=1.1, alpha=0.8,
                       label=f"cooldown starts (step {c:,})")

    @staticmethod
    def legend(ax, handles=None, labels=None):
        """Below the axes, so it never hides a curve or a marker."""
        if handles is None:
            handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3,
                  frameon=False, fontsize="small")

    def smooth(self, y):
        return _smooth_segments(y, self.w, self.steps, self.run.resumes)

    def save(self, fig, filename: str):
        path = self.out_dir / filename
        tmp = self.out_dir / f".{filename}.tmp"
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)                           # a watcher never sees half a PNG
        self.written.append(path)


def _plot_loss(p: _Plots) -> None:
    """loss.png: loss against tokens, bits per char on the right."""
    run, loss, ex, fr, fr_i = p.run, p.m["loss"], p.ex, p.fr, p.fr_i
    if not (np.isfinite(loss).any() or run.evals):
        return
    fig, ax = p.new("loss", p.x_label)
    tl = "train loss" + (f" (label smoothing {run.label_smoothing:g})" if run.label_smoothing else "")
    ax.plot(p.x_train, loss, color="tab:blue", alpha=0.25, linewidth=0.8, label=f"{tl}, per step")
    ax.plot(p.x_train, p.smooth(loss), color="tab:blue", linewidth=1.8, label=f"{tl}, mean of {p.w} steps")
    if run.evals:
        ax.plot(ex, [e["loss"] for e in run.evals], "o-", color="tab:orange", markersize=5,
                linewidth=1.2, label="eval loss (teacher-forced)")
    if fr_i:
        ax.plot(ex[fr_i], [fr[i]["loss"] for i in fr_i], "s--", color="tab:red", markersize=5,
                linewidth=1.2, label="eval loss (free-running)")
    p.marks(ax, p.to_x)
    ax.set_ylabel("loss (nats per char)")
    ax.secondary_yaxis("right", functions=(lambda v: v / LN2, lambda b: b * LN2)) \
        .set_ylabel("bits per char")
    ax.xaxis.set_major_formatter(p.mpl.EngFormatter())
    p.legend(ax)
    p.save(fig, "loss.png")


def _plot_lr(p: _Plots) -> None:
    """lr.png: learning rate (and teacher forcing) against steps."""
    m, steps = p.m, p.steps
    if not np.isfinite(m["lr"]).any():
        return
    fig, ax = p.new("learning rate", "global step (optimizer steps completed)")
    ax.plot(steps, m["lr"], color="tab:green", linewidth=1.6, label="learning rate")
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax.set_ylim(bottom=0)
    p.marks(ax)
    handles, labels = ax.get_legend_handles_labels()
    tf = m["tf"]
    if np.isfinite(tf).any() and not np.all(tf[np.isfinite(tf)] == 1.0):
        ax2 = ax.twinx()
        ax2.plot(steps, tf, color="tab:brown", linewidth=1.4, linestyle="--", label="teacher forcing")
        ax2.set_ylabel("teacher forcing (probability of the true previous char)")
        ax2.set_ylim(0, 1.05)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    p.legend(ax, handles, labels)
    p.save(fig, "lr.png")


def _plot_grad_norm(p: _Plots) -> None:
    """grad_norm.png: gradient norm, log scale, with the clip line, skipped steps and fp16's loss scale."""
    run, m, steps = p.run, p.m, p.steps
    g = m["grad_norm"]
    gpos = np.where(np.isfinite(g) & (g > 0), g, np.nan)
    if not (np.isfinite(gpos).any() or run.skipped_steps):
        return
    fig, ax = p.new("gradient norm (before clipping)", "global step (optimizer steps completed)")
    ax.plot(steps, gpos, color="tab:blue", alpha=0.3, linewidth=0.8, label="grad norm, per step")
    sm = np.exp(p.smooth(np.log(gpos)))
    ax.plot(steps, sm, color="tab:blue", linewidth=1.8, label=f"geometric mean of {p.w} steps")
    ax.set_yscale("log")
    plain = p.mpl.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    lo, hi = np.nanmin(gpos, initial=np.inf), np.nanmax(gpos, initial=-np.inf)
    if np.isfinite(lo) and hi / lo < 30:              # under ~1.5 decades: label minor ticks too
        ax.yaxis.set_minor_formatter(plain)
    if run.clip is not None:
        n_clip = int(np.nansum(m["clipped"] == 1))
        ax.axhline(run.clip, color="tab:red", linestyle="--", linewidth=1.2,
                   label=f"clip = {run.clip:g} ({n_clip} steps clipped, "
                         f"{100.0 * n_clip / len(steps):.1f}%)")
    if run.skipped_steps:
        top = p.mpl.blended_transform_factory(ax.transData, ax.transAxes)
        ax.plot(run.skipped_steps, [0.95] * len(run.skipped_steps), "x", color="tab:red",
                markersize=9, markeredgewidth=2, transform=top,
                label=f"skipped step ({len(run.skipped_steps)}: loss or grad not finite)")
    p.marks(ax)
    ax.set_ylabel("global L2 norm of the gradient")
    handles, labels = ax.get_legend_handles_labels()
    scale = m["loss_scale"]
    if np.isfinite(scale).any() and np.nanmax(scale) > 1:  # fp16: the loss scale S the steps ran with
        ax2 = ax.twinx()
        ax2.step(steps, scale, where="post", color="tab:purple", linewidth=1.4, label="fp16 loss scale")
        ax2.set_yscale("log", base=2)
        ax2.set_ylabel("fp16 loss scale (halved on an overflow step)")
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    p.legend(ax, handles, labels)
    p.save(fig, "grad_norm.png")


def _plot_throughput(p: _Plots) -> None:
    """throughput.png: training tokens per second against steps."""
    tps, steps = p.m["tokens_per_s"], p.steps
    if not np.isfinite(tps).any():
        return
    fig, ax = p.new("throughput", "global step (optimizer steps completed)")
    ax.plot(steps, tps, color="tab:cyan", alpha=0.35, linewidth=0.8, label="per step")
    ax.plot(steps, p.smooth(tps), color="tab:blue", linewidth=1.8, label=f"mean of {p.w} steps")
    p.marks(ax)
    ax.set_ylabel("tokens per second")
    ax.yaxis.set_major_formatter(p.mpl.EngFormatter())
    ax.set_ylim(bottom=0)
    p.legend(ax)
    p.save(fig, "throughput.png")


def _plot_accuracy(p: _Plots) -> None:
    """accuracy.png: eval top-1 and top-5 accuracy, teacher-forced and free-running."""
    run, ex, fr, fr_i = p.run, p.ex, p.fr, p.fr_i
    acc = [(k, lab) for k, lab in (("top1", "top-1"), ("top5", "top-5"))
           if any(isinstance(e.get(k), (int, float)) for e in run.evals)]
    if not acc:
        return
    fig, ax = p.new("eval next-char accuracy", p.x_label)
    for (k, lab), color in zip(acc, ("tab:orange", "tab:green")):
        ax.plot(ex, [e.get(k, np.nan) for e in run.evals], "o-", color=color, markersize=5,
                label=f"{lab} (teacher-forced)")
        fx = [i for i in fr_i if isinstance(fr[i].get(k), (int, float))]
        if fx:
            ax.plot(ex[fx], [fr[i][k] for i in fx], "s--", color=color, markersize=5, alpha=0.7,
                    label=f"{lab} (free-running)")
    p.marks(ax, p.to_x)
    ax.set_ylabel("accuracy (true next char ranked first / in the top 5)")
    ax.yaxis.set_major_formatter(p.mpl.PercentFormatter(1.0))
    ax.set_ylim(0, 1)
    ax.xaxis.set_major_formatter(p.mpl.EngFormatter())
    p.legend(ax)
    p.save(fig, "accuracy.png")


_PLOTS = (_plot_loss, _plot_lr, _plot_grad_norm, _plot_throughput, _plot_accuracy)   # in this order


def plot_run(run_dir: Path, out_dir: Path | None = None, *, html_page: bool = True) -> list[Path]:
    """Write loss.png, lr.png, grad_norm.png, throughput.png and accuracy.png (each only when it has
    data) into out_dir (default run_dir/plots); return the PNG paths written. With html_page (the
    default) also write out_dir/index.html showing them all (see write_html)."""
    mpl = _matplotlib()
    run = load_run(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run.path / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = _Plots(run, out_dir, mpl)
    for draw in _PLOTS:
        draw(plots)
    if html_page:
        write_html(run.path, out_dir, plots.written, run=run)
    return plots.written


# ----------------------------------------------------------------------------------------------
# the HTML page

_CAPTIONS = {
    "loss.png": "Train loss per step and its rolling mean; eval loss (teacher-forced, and free-running when "
                "measured) against tokens seen. Right axis: bits per char.",
    "lr.png": "Learning rate (and teacher forcing when it is not 1) against optimizer steps.",
    "grad_norm.png": "Gradient norm before clipping (log scale), the clip line, skipped steps.",
    "throughput.png": "Training tokens per second.",
    "accuracy.png": "Held-out next-char accuracy: top-1 and top-5.",
}

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1180px;padding:0 1em;color:#222}
h1{margin-bottom:.2em}.path{color:#666;margin-top:0;font-family:monospace}
ul.summary li{font-family:monospace;margin:.15em 0}
figure{margin:1em 0 2em}figure img{max-width:100%;border:1px solid #ddd}
figcaption{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.8em;overflow-x:auto;font-size:.85em}
.marks{color:#555;font-size:.9em}.grid{display:flex;flex-wrap:wrap;gap:1em}.grid figure{flex:1 1 480px}"""


def _rel(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()


def _landscape_sections(run_dir: Path, out_dir: Path) -> list[str]:
    """Any `catchat landscape` outputs under run_dir/landscape/: their summaries and contour PNGs."""
    parts = []
    for d in sorted(p for p in (run_dir / "landscape").glob("*") if p.is_dir()):
        pngs = sorted(d.glob("landscape-layer*.png"), key=lambda p: ("-3d" in p.name, p.name))
        if not pngs:
            continue
        parts.append(f"<h3>{html.escape(d.name)}</h3>")
        txt = d / "landscape.txt"
        if txt.is_file():
            parts.append("<ul class=summary>" + "".join(f"<li>{html.escape(line)}</li>" for line in
                                                       txt.read_text().splitlines() if line.strip()) + "</ul>")
        parts.append("<div class=grid>" + "".join(
            f'<figure><a href="{html.escape(_rel(p, out_dir))}"><img src="{html.escape(_rel(p, out_dir))}" '
            f'alt="{html.escape(p.name)}"></a><figcaption>{html.escape(p.name)}</figcaption></figure>'
            for p in pngs) + "</div>")
    return parts


def write_html(run_dir: Path, out_dir: Path, pngs: list[Path], *, run: Run | None = None) -> Path:
    """out_dir/index.html: the summary lines, every PNG in `pngs` (relative links, so the folder can
    be moved or served as it is), a table of the evals, landscapes found under run_dir/landscape/,
    and the run's config.toml. Self-contained: no scripts, no external files."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    run = run or load_run(run_dir)
    esc = html.escape
    name = run.path.name
    body = [f"<h1>{esc(name)}</h1>", f'<p class=path>{esc(str(run.path.resolve()))}</p>',
            "<h2>Summary</h2>", "<ul class=summary>"
            + "".join(f"<li>{esc(line)}</li>" for line in summarise_run(run_dir)) + "</ul>"]
    marks = []
    if run.resumes:
        marks.append("resumes at step " + ", ".join(f"{s:,}" for s in run.resumes) + " (grey dotted lines)")
    if run.cooldown_start is not None and run.cooldown_start <= run.steps[-1]:  # as the plots mark it
        marks.append(f"cooldown from step {run.cooldown_start:,} (purple dash-dot line)")
    body.append("<h2>Plots</h2>")
    if marks:
        body.append(f"<p class=marks>Marked on every plot: {esc('; '.join(marks))}.</p>")
    for p in pngs:
        src = esc(_rel(p, out_dir))
        body.append(f'<figure><a href="{src}"><img src="{src}" alt="{esc(p.stem)}"></a>'
                    f"<figcaption>{esc(_CAPTIONS.get(p.name, p.name))}</figcaption></figure>")
    if run.evals:
        rows = []
        for e in run.evals:
            fr = e.get("free_running") if isinstance(e.get("free_running"), dict) else {}
            cell = lambda v, f: esc(format(v, f)) if isinstance(v, (int, float)) else ""  # noqa: E731
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
                f"{int(e['global_step']):,}", cell(e.get("tokens"), ",.0f"), cell(e["loss"], ".4f"),
                cell(e.get("bpc", e["loss"] / LN2), ".4f"), cell(e.get("top1"), ".1%"), cell(e.get("top5"), ".1%"),
                cell(fr.get("loss"), ".4f"))) + "</tr>")
        body += ["<h2>Evals</h2>", "<table><tr><th>step</th><th>tokens</th><th>loss (nats/char)</th><th>bpc</th>"
                 "<th>top-1</th><th>top-5</th><th>free-running loss</th></tr>" + "".join(rows) + "</table>"]
    land = _landscape_sections(run.path, out_dir)
    if land:
        body += ["<h2>Loss landscapes</h2>"] + land
    cfg = run.path / "config.toml"
    body.append("<h2>Config</h2>")
    if cfg.is_file():
        body.append(f"<p class=path>{esc(str(cfg.name))}</p><pre>{esc(cfg.read_text(errors='replace'))}</pre>")
    else:
        body.append("<p>no config.toml in the run directory</p>")
    from catchat import __version__

    body.append(f"<p class=path>written by catchat {esc(__version__)} (catchat plot) at "
                f"{esc(time.strftime('%Y-%m-%d %H:%M:%S'))}</p>")
    page = ("<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>{esc(name)}: catchat run</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    path, tmp = out_dir / INDEX_HTML, out_dir / f".{INDEX_HTML}.tmp"
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path
