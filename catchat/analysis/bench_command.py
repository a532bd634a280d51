"""`catchat bench CONFIG`: measures (catchat/analysis/bench.py, torch_twin.py, tuner.py), prints the
tables on the console (progress on stderr: a transient spinner line at a terminal) and writes the
JSON (--json)."""

from __future__ import annotations

import functools
import gc

from rich.markup import escape

from catchat import config as cfgmod
from catchat import environment
from catchat.analysis import torch_twin
from catchat.analysis.bench import bench_catchat
from catchat.analysis.tuner import tune
from catchat.console import new_table
from catchat.vk import tune as tunecache
from catchat.vk.device import format_bytes
from catchat.vk.kernels import gemm


class _Steps:
    """The long work of `catchat bench` as a transient spinner line (at a terminal only)."""

    def __init__(self, console):
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=self.console, disable=not self.console.is_terminal, transient=True)
        self.task, self.escape = None, escape

    def __enter__(self):
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def step(self, label: str) -> None:
        self.progress.update(self.task, description=self.escape(label))


def run_command(config_path, overrides, *, steps: int, warmup: int, tf: float, compare_torch: bool,
                want_profile: bool, want_tune: bool, json_path, device, console, err_console) -> None:
    """`catchat bench`: measure, print (tables on `console`, progress on `err_console`), write JSON."""
    import json

    from catchat.fsutil import atomic_write_text
    from catchat.vk.device import open_device

    cfg = cfgmod.load(config_path, list(overrides))
    dev = open_device(device)
    m, say = cfg.model, functools.partial(console.print, highlight=False, soft_wrap=True)
    precision = gemm.products(dev, cfg.train.precision)
    say(escape(f"config {config_path}: H={m.hidden} L={m.layers} B={cfg.data.batch_lanes} T={cfg.data.window} "
               f"optimizer={cfg.train.optimizer} precision={precision} on {dev.info.name} "
               f"({dev.info.type}, {dev.info.driver})"))
    res = {"config": str(config_path), "device": dev.info.name, "driver": dev.info.driver,
           "gemm_products": precision,  # how the GEMMs multiplied, the extension named
           "env": environment.settings()}  # the switches that made this run differ from the defaults
    if res["env"]:
        say(escape(f"set here: {environment.settings_text()} (docs/environment.md)"))
    with _Steps(err_console) as progress:
        if want_tune:
            saved = tunecache.snapshot(dev.info)
            res["tune"] = _run_tune(cfg, dev, progress, console, say)
            gc.collect()  # the candidates' kernels and buffers go before the steps are timed
            with tunecache.disabled():
                tables = bench_catchat(cfg, dev, steps, warmup, tf, False, progress=progress)
        c = bench_catchat(cfg, dev, steps, warmup, tf, want_profile, progress=progress)
        if want_tune and not _keep_tuned(res["tune"], tables["step_ms"], c["step_ms"], say):
            tunecache.restore(dev.info, saved)
            c = bench_catchat(cfg, dev, steps, warmup, tf, want_profile, progress=progress) if want_profile else tables
        res["catchat"] = c
        torch_rows = {}
        if compare_torch:
            ok, line = torch_twin.torch_status()
            res["torch_status"] = line
            if ok:
                torch_rows = res["torch"] = _run_torch(cfg, steps, warmup, progress)
    _print_throughput(console, c, torch_rows, tf)
    say(f"step: forward {c['forward_ms']:.1f} ms, backward {c['backward_ms']:.1f} ms, optimizer "
        f"{c['optimizer_ms']:.1f} ms; program built in {c['build_s']:.1f} s")
    if compare_torch and not torch_rows:
        say(escape(f"torch comparison skipped: {res['torch_status']}"))
    for sw in c["sweeps"]:
        mode = (f"one persistent dispatch of {sw['workgroups']} workgroups" if sw["workgroups"]
                else "a dispatch per step")
        why = f" ({sw['residency']})" if sw["residency"] else ""
        kind = "resident tiles" if sw["tiles"][0] == "ResidentTiles" else "tiles"
        say(escape(f"sweep {sw['sweep']}: {sw['shader']}, {kind} {tuple(sw['tiles'][1])}, {mode}{why}"))
    say(escape(recording_line(c["recording"])))
    if c["profile"]:
        print_profile(console, c["profile"], c["step_ms"], c.get("gemm_flop") or {})
    if json_path:
        atomic_write_text(json_path, json.dumps(res, indent=1, default=str) + "\n")
        say(escape(f"wrote {json_path}"))


STEP_MARGIN = 0.01  # tuned tiles are kept unless they make the whole training step this much slower


def _keep_tuned(report: dict, tables_ms: float, tuned_ms: float, say) -> bool:
    """Whether the tuned tiles stay cached: each was the fastest alone, but only the whole step says
    whether they are together (on the H200 they once made v3's fp16 step 47.4 -> 63.2 ms). Records
    both step times in the --tune report and says which way it went."""
    keep = tuned_ms <= tables_ms * (1 + STEP_MARGIN)
    report.update(step_ms_tables=tables_ms, step_ms_tuned=tuned_ms, kept=keep)
    if keep:
        say(f"training step {tuned_ms:.1f} ms with the tuned tiles, {tables_ms:.1f} ms with the tables' choices: kept")
    else:
        say(f"the tuned tiles made the training step slower ({tuned_ms:.1f} ms against {tables_ms:.1f} ms with the "
            f"tables' choices): not kept, the tuning cache is as it was before --tune")
    return keep


def _run_tune(cfg, dev, progress, console, say) -> dict:
    """--tune: measure and cache, print a row per shape; the JSON's "tune"."""
    rows, path = tune(cfg, dev, progress=progress)
    table = new_table("kind", "shape", "tables' choice", "fastest", "us (tables')", "us (fastest)",
                      title=f"tuned on {dev.info.name}")
    for r in rows:  # kinds gemm (glsl/gemm.comp), coop (the tensor-core GEMM, fp16), split (its fp32 mode), gru
        fmt = lambda us: "-" if us is None else f"{us:.1f}"  # noqa: E731
        table.add_row(r.kind, r.key, escape(str(tuple(r.fields(r.table)))) if r.table is not None else "(none fits)",
                      escape(str(tuple(r.fields(r.winner)))) if r.winner is not None else "(one candidate)",
                      fmt(r.micros(r.table)), fmt(r.micros(r.winner)))
    console.print(table)
    say(escape(f"cached {sum(r.winner is not None for r in rows)} choices in {path}"))
    return {"cache": str(path), "rows": [
        dict(kind=r.kind, key=r.key, table=r.fields(r.table), winner=r.fields(r.winner),
             candidates=[r.fields(c) for c in r.candidates], seconds=r.seconds) for r in rows]}


def _run_torch(cfg, steps: int, warmup: int, progress) -> dict:
    """--compare-torch: the PyTorch twin's figures in every mode of TORCH_MODES (a failed mode: its error)."""
    torch_rows = {}
    for mode, label in torch_twin.TORCH_MODES:
        progress.step(f"torch {label}")
        try:
            torch_rows[label] = torch_twin.bench_torch(cfg, steps, warmup, mode)
        except Exception as e:  # noqa: BLE001 (a mode this torch or GPU lacks: say so, run the rest)
            torch_rows[label] = {"error": f"{e.__class__.__name__}: {e}".splitlines()[0]}
    return torch_rows


def recording_line(r: dict) -> str:
    """How the step's dispatches are recorded (wavefront.recording_info), in words: a wavefront's sweeps
    overlap, so --profile's groups, each timed alone, then add up to more than the step."""
    def way(n: int) -> str:
        return "layer by layer" if n <= 1 else f"a wavefront of {n} chunks over the layers"

    beside = "; each layer's dW_hh beside the backward sweep below" if r["dw_hh_beside"] else ""
    return (f"recorded: forward {way(r['wavefront_forward'])}, backward {way(r['wavefront_backward'])}{beside} "
            f"(CATCHAT_WAVEFRONT)")


def _print_throughput(console, c: dict, torch_rows: dict, tf: float) -> None:
    """The table of catchat's row and the PyTorch rows beside it."""
    path_note = f" (per-timestep path, tf={tf:g})" if tf < 1 else ""
    table = new_table("run", "train tok/s", "step ms", "eval tok/s", "memory", "train vs catchat")
    table.add_row(f"catchat{path_note}", f"{c['train_tokens_per_s']:,.0f}", f"{c['step_ms']:.1f}",
                  f"{c['eval_tokens_per_s']:,.0f}", format_bytes(c["device_bytes"]), "1.00x")
    for label, t in torch_rows.items():
        if "error" in t:
            table.add_row(f"torch {label}", "failed", "-", "-", "-", escape(t["error"]))
        else:
            spread = f" ({t['step_ms_min']:.1f}-{t['step_ms_max']:.1f})" if "step_ms_min" in t else ""
            table.add_row(f"torch {label}", f"{t['train_tokens_per_s']:,.0f}", f"{t['step_ms']:.1f}{spread}",
                          f"{t['eval_tokens_per_s']:,.0f}", f"{format_bytes(t['device_bytes'])} (peak)",
                          f"{c['train_tokens_per_s'] / t['train_tokens_per_s']:.2f}x")
    console.print(table)


def print_profile(console, profile: list, step_ms: float, gemm_flop: dict) -> None:
    """--profile's table: each group of the micro-batch and of the optimizer's submit
    (catchat.analysis.bench.profile), with the GEMM groups' TFLOP/s, the totals by kind, the sum beside
    the step's time."""
    table = new_table("group", "ms", "kind", "TFLOP/s", title="where a micro-batch goes (each group timed alone)")

    def rate(flop: float, ms: float) -> str:
        if not (flop and ms > 0):
            return ""
        tflops = flop / ms / 1e9
        return f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}"

    for kind, name, ms in profile:
        table.add_row(name, f"{ms:.2f}", kind, rate(gemm_flop.get(name, 0.0), ms))
    for kind in ("sweep", "gemm", "other", "optimizer"):
        total = sum(ms for k, _, ms in profile if k == kind)
        flop = sum(gemm_flop.values()) if kind == "gemm" else 0.0
        table.add_row(f"{kind} total", f"{total:.2f}", "", rate(flop, total))
    table.add_row("sum of groups", f"{sum(ms for _, _, ms in profile):.2f}", f"step {step_ms:.1f}", "")
    console.print(table)
