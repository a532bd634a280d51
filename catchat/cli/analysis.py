"""Looking at runs and checkpoints: `eval`, `plot`, `landscape`, `inspect`, `scan`, `watch`."""

from __future__ import annotations

import functools

import click
from rich.markup import escape

from catchat.cli import ALLOW_UNVERIFIED_OPTION, DEVICE_OPTION, _warn, cli, console, err_console
from catchat.console import new_table


@cli.command("eval")
@click.argument("checkpoint")
@click.option("--text", "text_file", default=None, type=click.Path(exists=True),
              help="Score this plain-text or JSONL file (read like `corpus build` reads it) instead of a corpus.")
@click.option("--format", "fmt", type=click.Choice(["auto", "text", "jsonl"]), default="auto", show_default=True,
              help="How to read --text (auto: .jsonl/.ndjson are JSONL, other files text; a file that is JSON or "
                   "CSV is refused with how to convert it).")
@click.option("--max-unk-rate", default=None, type=click.FloatRange(0.0, 1.0),
              help="With --text: refuse a text with more <unk> than this (default as corpus build: 0.05).")
@click.option("--corpus", "corpus_path", default=None, help="Corpus to evaluate on (default: the run's).")
@click.option("--split", type=click.Choice(["eval", "train", "all"]), default=None,
              help="Which conversations of the corpus: the held-out split (default), the train split, or all.")
@click.option("--windows", default=0, show_default=True, type=click.IntRange(min=0),
              help="Score only the first N windows of the packed lanes (0 = all).")
@click.option("--lanes", "max_lanes", default=0, type=click.IntRange(min=0),
              help="At most N lanes (default: the checkpoint's data.batch_lanes); the loss does not depend on it.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON object.")
@ALLOW_UNVERIFIED_OPTION
@DEVICE_OPTION
def eval_cmd(checkpoint, text_file, fmt, max_unk_rate, corpus_path, split, windows, max_lanes, as_json,
             allow_unverified, device):
    """Loss (nats/char), bits/char, top-1/top-5 of a checkpoint on a corpus split or a text file (docs/eval.md)."""
    import json

    from catchat.errors import UsageError
    from catchat.inference.evaluate import evaluate_checkpoint, summary_lines
    from catchat.progress import Progress
    from catchat.run import checkpoint as ck
    from catchat.vk.device import open_device

    if text_file is not None and (corpus_path is not None or split is not None):
        raise UsageError("--text scores a file: it takes neither --corpus nor --split",
                         "drop --corpus/--split, or drop --text to score a corpus")
    if text_file is None and (fmt != "auto" or max_unk_rate is not None):
        raise UsageError("--format and --max-unk-rate say how to read --text", "pass --text FILE, or drop them")
    ckpt = ck.load_checkpoint(checkpoint, allow_unverified=allow_unverified, warn=_warn)
    with Progress(err_console, "eval", "windows") as progress:  # stderr: stdout keeps the result (--json)
        res = evaluate_checkpoint(ckpt, open_device(device), text=text_file, fmt=fmt, corpus_path=corpus_path,
                                  split=split or "eval", n_windows=windows, max_lanes=max_lanes,
                                  max_unk_rate=max_unk_rate, progress=progress)
    if as_json:
        click.echo(json.dumps(res, indent=1))
    else:
        for line in summary_lines(res):
            click.echo(line)

@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="Where to write the PNGs (default RUN_DIR/plots).")
def plot(run_dir, out):
    """Summarise a run and write PNG plots of loss, lr, grad norm, throughput and accuracy, and an HTML page of them."""
    from pathlib import Path

    from catchat.analysis.plot import INDEX_HTML, plot_run, summarise_run

    for line in summarise_run(Path(run_dir)):
        console.print(line, highlight=False, markup=False)
    paths = plot_run(Path(run_dir), Path(out) if out else None)
    where = paths[0].parent if paths else Path(out or Path(run_dir) / "plots")
    console.print(f"wrote {len(paths)} plots to {where}: " + " ".join(p.name for p in paths),
                  highlight=False, markup=False)
    if (where / INDEX_HTML).is_file():
        console.print(f"all of them on one page: {where / INDEX_HTML}", highlight=False, markup=False)

# ------------------------------------------------------------------------------ analysis
@cli.command()
@click.argument("checkpoint")
@click.option("--compare", "compare_ckpt", default=None, metavar="CKPT2",
              help="A second checkpoint: its surfaces side by side, drawn with the same directions' seed.")
@click.option("--layer", "layers", multiple=True, type=click.IntRange(min=0),
              help="Layer to map (repeatable; default: every layer).")
@click.option("--group", default="z", show_default=True,
              help="Weights perturbed in each layer: 'z' = update-gate rows of weight_ih and weight_hh; "
                   "'hh:z', 'ih:n', 'hh', 'all', comma-separated (docs/landscape.md).")
@click.option("--grid", "grid_n", default=11, show_default=True, type=click.IntRange(min=2),
              help="N: an N x N grid of (alpha, beta).")
@click.option("--radius", default=0.5, show_default=True, type=click.FloatRange(min=0.0, min_open=True),
              help="r: alpha and beta span [-r, r].")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Directions' seed: the same seed gives the same surface.")
@click.option("--tokens", default=1024, show_default=True, type=click.IntRange(min=1),
              help="Size of the fixed evaluation slice: next-character positions (held-out: whole lanes of T).")
@click.option("--text", "text_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Evaluate on this text file (one conversation) instead of the held-out split.")
@click.option("--format", "fmt", type=click.Choice(["auto", "text"]), default="auto", show_default=True,
              help="auto: refuse a --text file that is JSON or CSV (as corpus build does); text: read it anyway.")
@click.option("--corpus", "corpus_path", default=None, help="Corpus whose held-out split is used (default: the run's).")
@click.option("--reference", is_flag=True, help="Evaluate with the numpy model (float64) instead of the GPU.")
@click.option("--out", type=click.Path(file_okay=False),
              help="Output directory (default runs/<run>/landscape/step-N, or CKPT/landscape).")
@click.option("--no-3d", "no_3d", is_flag=True, help="Skip the 3-D surface PNGs.")
@DEVICE_OPTION
def landscape(checkpoint, compare_ckpt, layers, group, grid_n, radius, seed, tokens, text_file, fmt, corpus_path,
              reference, out, no_3d, device):
    """Loss landscape around a checkpoint: filter-normalised random directions (Li et al. 2018), per layer."""
    from catchat.analysis import landscape as land
    from catchat.errors import UsageError
    from catchat.progress import Progress

    if fmt != "auto" and text_file is None:
        raise UsageError("--format says how to read --text", "pass --text FILE, or drop --format")
    job = land.prepare(checkpoint, compare_ckpt, layers=layers, group=group, grid_n=grid_n, radius=radius, seed=seed,
                       tokens=tokens, text_file=text_file, fmt=fmt, corpus_path=corpus_path, reference=reference,
                       device=device)
    say = functools.partial(console.print, highlight=False, markup=False, soft_wrap=True)
    for line in job.plan_lines():
        say(line)
    with Progress(err_console, "landscape", "evaluations") as progress:  # stderr, as eval's and corpus build's
        progress.start(job.total)
        result = job.run(on_point=progress.advance, on_surface=say)
    out_dir, paths = job.write(result, out, surface_3d=not no_3d,
                               warn=lambda m: err_console.print(m, highlight=False, markup=False, soft_wrap=True))
    say(f"wrote {out_dir}: " + " ".join(p.name for p in paths))

@cli.command("inspect")
@click.argument("checkpoint")
@click.option("--compare", "compare_ckpt", default=None, metavar="CKPT2",
              help="Show how every tensor changed from CHECKPOINT to CKPT2.")
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON instead of tables.")
def inspect_cmd(checkpoint, compare_ckpt, as_json):
    """Per-tensor weight statistics and GRU spectral norms of a checkpoint (no Vulkan device needed)."""
    import json
    import math

    from catchat.analysis.weights import Table, inspect_sections, report

    rep = report(checkpoint, compare_ckpt)
    if as_json:
        click.echo(json.dumps(rep, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x))
        return
    for item in inspect_sections(rep):
        if isinstance(item, Table):
            t = new_table(*item.columns, title=item.title)
            for row in item.rows:
                t.add_row(*row)
            console.print(t)
        else:
            console.print(item, highlight=False, markup=False)

# ------------------------------------------------------------------------------ reliability
@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too, not only on defects.")
def scan(run_dir, strict):
    """Scan a run for anomalies: non-finite steps, loss rises, grad-norm spikes, throughput drops, memory
    growth, lr/tf against their formulas, resume signatures. A table; exit 1 on defects (docs/reliability.md)."""
    from pathlib import Path

    from catchat.analysis.scan import FAIL, WARN, scan_run, table_rows

    report = scan_run(Path(run_dir))
    table = new_table("check", "status", "steps", "detail", title=f"scan of {run_dir} ({report.rows} steps)")
    style = {FAIL: "[red]FAIL[/red]", WARN: "[yellow]warn[/yellow]"}
    for check, status, count, detail in table_rows(report):
        table.add_row(check, style.get(status, "[green]ok[/green]"), count, escape(detail))
    console.print(table)
    n_fail, n_warn = len(report.defects), len(report.warnings)
    console.print(f"{n_fail} defect(s), {n_warn} warning(s)", highlight=False)
    if n_fail or (strict and n_warn):
        raise SystemExit(1)


# ------------------------------------------------------------------------------ live
@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--interval", "interval_s", default=2.0, show_default=True, type=click.FloatRange(min=0.05),
              metavar="SECONDS", help="How often to look for new rows and events.")
@click.option("--timeout", "timeout_s", default=None, type=click.FloatRange(min=0.0, min_open=True),
              metavar="SECONDS", help="Give up after this long if the run has not ended (exit 124).")
@click.option("--once", is_flag=True, help="Print the view as it is now and exit 0 (for scripts).")
def watch(run_dir, interval_s, timeout_s, once):
    """Follow a run live from its files: loss curve, latest evals, step/total, tokens/s, ETA, anomalies from
    scan. Exits with the run: 0 at its end event, 1 if it failed or its process is gone (docs/live.md)."""
    from pathlib import Path

    from catchat.analysis.watch import follow

    code = follow(Path(run_dir), console, interval_s=interval_s, timeout_s=timeout_s, once=once)
    if code:
        raise SystemExit(code)
