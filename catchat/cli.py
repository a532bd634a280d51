"""The `catchat` command line. Every user-fixable failure prints one or two lines, never a traceback."""

from __future__ import annotations

import functools
import os
import sys

import click
from rich.markup import escape

from catchat import __version__
from catchat.console import make_console, new_table
from catchat.errors import CatchatError

# At a terminal: its width. Through a pipe or in CI: every line and table row whole (catchat/console.py).
console = make_console()
err_console = make_console(stderr=True)

ALLOW_UNVERIFIED_OPTION = click.option(
    "--allow-unverified", is_flag=True,
    help="Load a checkpoint whose state.json records no sha256 of its files (a warning says so).")
DEVICE_OPTION = click.option("--device", "device", default=None, metavar="INDEX|NAME",
                             help="Vulkan device by index or name substring (env CATCHAT_DEVICE).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="catchat")
def cli():
    """catchat: character-level GRU language models trained on Vulkan compute."""


@cli.command()
def devices():
    """List Vulkan devices with type, driver and the limits catchat sizes kernels by."""
    from catchat.vk.probe import probe_devices

    table = new_table("index", "name", "type", "driver", "Vulkan", "max buffer", "shared mem", "subgroup", "SMs")
    for d in probe_devices():
        table.add_row(str(d.index), d.name, d.type, d.driver, d.api_version,
                      f"{d.max_storage_buffer_bytes / 2**20:.0f} MiB", f"{d.max_shared_memory_bytes // 1024} KiB",
                      str(d.subgroup_size), str(d.compute_units or "-"))
    console.print(table)


@cli.command()
def doctor():
    """Check numpy, the Vulkan loader, kp, glslc, and run a shader on every device against numpy."""
    from catchat.doctor import checks

    failed = False
    for c in checks():
        mark = "[green]ok[/green]  " if c.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {c.what}: {c.detail}", soft_wrap=True)
        if not c.ok:
            failed = True
            if c.fix:
                console.print(f"       fix: {c.fix}")
    if failed:
        raise SystemExit(1)
    console.print("all checks passed")


@cli.command()
@click.option("--summary", is_flag=True, help="One row per kernel family (worst errors) instead of every check.")
@DEVICE_OPTION
def parity(summary, device):
    """Run every kernel and the whole model against numpy on a device; exit 1 on any mismatch."""
    from catchat.parity import summarise, timed_run
    from catchat.vk.device import open_device

    dev = open_device(device)
    console.print(f"device: {dev.info.name} ({dev.info.type}, {dev.info.driver})")
    results, seconds = timed_run(dev)
    if summary:
        table = new_table("group", "checks", "worst max abs err", "worst max rel err", "result")
        for g in summarise(results):
            table.add_row(g["group"], str(g["checks"]), f"{g['max_abs']:.2e}", f"{g['max_rel']:.2e}",
                          "[green]pass[/green]" if g["failed"] == 0 else f"[red]{g['failed']} FAIL[/red]")
    else:
        table = new_table("group", "kernel", "shape", "max abs err", "max rel err", "tolerance", "result")
        for group, r in results:
            table.add_row(group, r.kernel, r.shape, f"{r.max_abs:.2e}", f"{r.max_rel:.2e}",
                          f"{r.atol:g} + {r.rtol:g}*|ref|", "[green]pass[/green]" if r.ok else "[red]FAIL[/red]")
    console.print(table)
    failed = sum(not r.ok for _, r in results)
    console.print(f"{len(results) - failed} passed, {failed} failed in {seconds:.1f} s")
    if failed:
        raise SystemExit(1)


# ------------------------------------------------------------------------------ bench
@cli.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config key.")
@click.option("--steps", default=5, show_default=True, type=click.IntRange(min=1), help="Timed steps (median).")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(min=0), help="Untimed steps first.")
@click.option("--tf", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Teacher forcing < 1 times the per-timestep (scheduled-sampling) path.")
@click.option("--compare-torch", is_flag=True,
              help="Also run the model in PyTorch here: FP32 (TF32 off), TF32, AMP fp16 and AMP bf16 (needs CUDA).")
@click.option("--profile", "want_profile", is_flag=True,
              help="Also time each group of the micro-batch's dispatches (sweeps, GEMMs, the rest).")
@click.option("--tune", "want_tune", is_flag=True,
              help="First measure the tile candidates at the config's shapes and cache the fastest for this device.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the results here.")
@DEVICE_OPTION
def bench(config_path, overrides, steps, warmup, tf, compare_torch, want_profile, want_tune, json_path, device):
    """Training and evaluation throughput of CONFIG on this GPU (docs/benchmarks.md)."""
    from catchat.bench import run_command

    run_command(config_path, overrides, steps=steps, warmup=warmup, tf=tf, compare_torch=compare_torch,
                want_profile=want_profile, want_tune=want_tune, json_path=json_path, device=device,
                console=console, err_console=err_console)


# ------------------------------------------------------------------------------ corpus
@cli.group()
def corpus():
    """Build and inspect token corpora (plain text, JSONL dialogue, built-in Shakespeare)."""


@corpus.command("build")
@click.argument("sources", nargs=-1, required=True)
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--eval-fraction", default=0.05, show_default=True, help="Share of conversations held out.")
@click.option("--max-unk-rate", default=0.05, show_default=True, help="Refuse a source with more <unk> than this.")
@click.option("--delimiter", default="<|endoftext|>", show_default=True,
              help="A line that splits a plain-text file into conversations.")
@click.option("--no-delimiter", is_flag=True, help="One plain-text file is one conversation.")
@click.option("--format", "fmt", type=click.Choice(["auto", "text", "jsonl"]), default="auto", show_default=True)
@click.option("--force", is_flag=True, help="Overwrite an existing corpus directory.")
@click.option("--hold-out", "hold_out", multiple=True, metavar="PLAYS",
              help="Hold out whole plays of `shakespeare` (comma-separated titles, case-insensitive; repeatable): "
                   "every scene of them is eval, none train. `catchat corpus plays` lists the titles.")
def corpus_build(sources, out, eval_fraction, max_unk_rate, delimiter, no_delimiter, fmt, force, hold_out):
    """Encode SOURCES (files, JSONL, or `shakespeare`) into a corpus directory."""
    from catchat import corpus as corpus_mod

    summary = corpus_mod.build(sources, out, eval_fraction=eval_fraction, max_unk_rate=max_unk_rate,
                               delimiter=None if no_delimiter else delimiter, fmt=fmt, force=force,
                               hold_out=", ".join(hold_out) or None)
    for line in summary.lines():
        console.print(line, markup=False, highlight=False)


@corpus.command("plays")
def corpus_plays():
    """List the plays of the built-in corpus (the titles --hold-out and "shakespeare:hold-out=..." take)."""
    from catchat import corpus as corpus_mod

    default = set(corpus_mod.DEFAULT_HOLD_OUT)
    table = new_table("title", "genre", "file", "held out by shakespeare:hold-out")
    for p in corpus_mod.plays():
        table.add_row(p.title, p.genre, p.path.name, "yes" if p.title in default else "")
    console.print(table)


@corpus.command("info")
@click.argument("path")
def corpus_info(path):
    """Summarise a corpus directory (or `shakespeare`)."""
    from catchat import corpus as corpus_mod

    for line in corpus_mod.info(path):
        console.print(line, markup=False, highlight=False)


# ------------------------------------------------------------------------------ train / eval
@cli.command()
@click.argument("config_path", metavar="CONFIG", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a config key.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Where the run lives (default runs/<config name>).")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[CKPT]",
              help="Continue the run in --run-dir (or from the checkpoint given).")
@click.option("--stop-after-steps", type=click.IntRange(min=1), help="Stop after N steps (the schedule is unchanged).")
@click.option("--time-budget", "time_budget", type=click.FloatRange(min=0.0, min_open=True), metavar="SECONDS",
              help="Train for this wall-clock time, start-up included: warmup, stable and cooldown run on elapsed "
                   "time, the last step uses schedule.lr_min, and a checkpoint and an eval end the run within the "
                   "budget. Sets train.time_budget_s and replaces the config's train.total_steps / train.cycles "
                   "(a --set of one of them keeps it as a step cap). A resumed run keeps its remaining budget.")
@ALLOW_UNVERIFIED_OPTION
@click.option("--device", "device", default=None, metavar="INDEX|NAME[,...]",
              help="Vulkan device by index or name substring (env CATCHAT_DEVICE). Under mpiexec: a comma list "
                   "gives rank r's device as entry (local rank mod its length); default: local rank modulo the GPUs.")
@click.option("--distributed", is_flag=True,
              help="Use MPI even when no launcher is seen in the environment (mpiexec is detected by itself).")
def train(config_path, overrides, run_dir, resume, stop_after_steps, time_budget, allow_unverified, device,
          distributed):
    """Train a model from a TOML CONFIG on the Vulkan device (on N ranks: `mpiexec -n N catchat train CONFIG`)."""
    from contextlib import nullcontext
    from pathlib import Path

    from catchat import config as cfgmod
    from catchat import distributed as dist
    from catchat.budget import process_start
    from catchat.progress import TrainReporter
    from catchat.train import Trainer
    from catchat.vk.device import ENV_DEVICE, open_device

    if time_budget is not None:  # first, so that the user's own --set of a step cap comes after and wins
        overrides = (f"train.time_budget_s={time_budget!r}", "train.total_steps=0", "train.cycles=0", *overrides)
    cfg = cfgmod.load(config_path, overrides)
    name = Path(config_path).stem
    run_dir = Path(run_dir or Path("runs") / name)
    comm = dist.init(force=distributed)  # None for a single process: MPI is not even imported
    if comm is None:
        dev = open_device(device)
        console.print(f"device: {dev.info.name}; run: {run_dir}", highlight=False)
    else:
        from catchat.vk.probe import probe_devices

        selector = device if device is not None else os.environ.get(ENV_DEVICE)
        dev = open_device(dist.device_selector(selector, comm.local_rank, probe_devices()))
        where = comm.allgather_obj(f"{comm.host}: {dev.info.name} (device {dev.info.index})", "listing the devices")
        if comm.is_root:
            console.print(f"{comm.size} ranks; run: {run_dir}", highlight=False)
            for r, line in enumerate(where):
                console.print(f"  rank {r}: {line}", highlight=False)
    reporting = TrainReporter(console) if comm is None or comm.is_root else nullcontext(None)
    with reporting as reporter, Trainer(cfg, run_dir, dev, config_name=name, resume=resume, reporter=reporter,
                                        allow_unverified=allow_unverified, clock_origin=process_start(),
                                        comm=comm) as trainer:
        reason = trainer.run(stop_after_steps)
    if comm is not None:
        comm.finish()
    if reason.startswith("interrupted"):
        raise SystemExit(130)


@cli.command("eval")
@click.argument("checkpoint")
@click.option("--text", "text_file", default=None, type=click.Path(exists=True),
              help="Score this plain-text or JSONL file (read like `corpus build` reads it) instead of a corpus.")
@click.option("--format", "fmt", type=click.Choice(["auto", "text", "jsonl"]), default="auto", show_default=True,
              help="How to read --text (auto: .jsonl/.ndjson are JSONL).")
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

    from catchat import checkpoint as ck
    from catchat.errors import UsageError
    from catchat.evaluate import evaluate_checkpoint, summary_lines
    from catchat.vk.device import open_device

    if text_file is not None and (corpus_path is not None or split is not None):
        raise UsageError("--text scores a file: it takes neither --corpus nor --split",
                         "drop --corpus/--split, or drop --text to score a corpus")
    if text_file is None and (fmt != "auto" or max_unk_rate is not None):
        raise UsageError("--format and --max-unk-rate say how to read --text", "pass --text FILE, or drop them")
    ckpt = ck.load_checkpoint(checkpoint, allow_unverified=allow_unverified, warn=_warn)
    res = evaluate_checkpoint(ckpt, open_device(device), text=text_file, fmt=fmt, corpus_path=corpus_path,
                              split=split or "eval", n_windows=windows, max_lanes=max_lanes,
                              max_unk_rate=max_unk_rate)
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

    from catchat.plot import INDEX_HTML, plot_run, summarise_run

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
@click.option("--corpus", "corpus_path", default=None, help="Corpus whose held-out split is used (default: the run's).")
@click.option("--reference", is_flag=True, help="Evaluate with the numpy model (float64) instead of the GPU.")
@click.option("--out", type=click.Path(file_okay=False),
              help="Output directory (default runs/<run>/landscape/step-N, or CKPT/landscape).")
@click.option("--no-3d", "no_3d", is_flag=True, help="Skip the 3-D surface PNGs.")
@DEVICE_OPTION
def landscape(checkpoint, compare_ckpt, layers, group, grid_n, radius, seed, tokens, text_file, corpus_path,
              reference, out, no_3d, device):
    """Loss landscape around a checkpoint: filter-normalised random directions (Li et al. 2018), per layer."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from catchat import landscape as land

    job = land.prepare(checkpoint, compare_ckpt, layers=layers, group=group, grid_n=grid_n, radius=radius, seed=seed,
                       tokens=tokens, text_file=text_file, corpus_path=corpus_path, reference=reference, device=device)
    say = functools.partial(console.print, highlight=False, markup=False, soft_wrap=True)
    for line in job.plan_lines():
        say(line)
    progress = Progress(TextColumn("[bold]landscape"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, disable=not console.is_terminal, transient=True)
    with progress:
        task = progress.add_task("landscape", total=job.total)
        result = job.run(on_point=lambda: progress.advance(task), on_surface=say)
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

    from catchat.weights import Table, inspect_sections, report

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


# ------------------------------------------------------------------------------ generation
def _sampling_options(ngram_default: int, suffix: str = "", who: str = ""):
    """--temperature --top-k --top-p --greedy --ngram-block (with a suffix: one side of a chat),
    handed to the command as one validated `generate.Sampling` argument, `sampling{suffix}`."""
    d = lambda s: s.replace("-", "_")  # noqa: E731
    fields = ("temperature", "top_k", "top_p", "greedy", "ngram_block")
    w = (lambda h: f"{who}: {h[0].lower()}{h[1:]}") if who else (lambda h: h)  # noqa: E731
    opts = [
        click.option(f"--temperature{suffix}", d(f"temperature{suffix}"), default=0.8, show_default=True,
                     type=click.FloatRange(min=0.0), help=w("Softmax temperature (0 = greedy).")),
        click.option(f"--top-k{suffix}", d(f"top_k{suffix}"), default=0, show_default=True,
                     type=click.IntRange(min=0), help=w("Sample among the K most likely characters (0 = off).")),
        click.option(f"--top-p{suffix}", d(f"top_p{suffix}"), default=1.0, show_default=True,
                     type=click.FloatRange(0.0, 1.0, min_open=True),
                     help=w("Nucleus sampling: the smallest set of characters with this mass (1 = off).")),
        click.option(f"--greedy{suffix}", d(f"greedy{suffix}"), is_flag=True,
                     help=w("Always take the most likely character.")),
        click.option(f"--ngram-block{suffix}", d(f"ngram_block{suffix}"), default=ngram_default, show_default=True,
                     type=click.IntRange(min=0), help=w("No N-gram of generated characters repeats (0 = off).")),
    ]

    def deco(f):
        @functools.wraps(f)
        def command(**kwargs):
            from catchat.generate import Sampling

            kwargs[d(f"sampling{suffix}")] = Sampling(**{k: kwargs.pop(f"{k}{d(suffix)}") for k in fields})
            return f(**kwargs)

        for o in reversed(opts):
            command = o(command)
        return command
    return deco


@cli.command()
@click.argument("checkpoint")
@click.option("--prompt", default="", help="Text to continue (after <bos>, and after 'SPEAKER: ' with --speaker).")
@click.option("--speaker", default=None, help="Start the prompt as this speaker's turn: 'SPEAKER: '.")
@click.option("--length", default=300, show_default=True, type=click.IntRange(min=1),
              help="Most characters to generate per sample.")
@_sampling_options(ngram_default=0)
@click.option("--stop-at-turn", is_flag=True, help="Stop at the end of a turn (<turn>) too, not only at <eos>.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Sampling seed: the same seed gives the same text.")
@click.option("--num", default=1, show_default=True, type=click.IntRange(min=1),
              help="Samples generated at once (one batch on the GPU).")
@ALLOW_UNVERIFIED_OPTION
@DEVICE_OPTION
def sample(checkpoint, prompt, speaker, length, sampling, stop_at_turn, seed, num, allow_unverified, device):
    """Generate text from a checkpoint, streaming it as it comes (docs/generation.md)."""
    from catchat import checkpoint as ck
    from catchat import vocab
    from catchat.generate import Generator, check_speaker, prompt_ids
    from catchat.vk.device import open_device

    speaker = check_speaker(speaker) if speaker is not None else None
    ckpt = ck.load_checkpoint(checkpoint, allow_unverified=allow_unverified, warn=_warn)
    gen = Generator.from_checkpoint(open_device(device), ckpt, streams=num)
    text = (f"{speaker}: " if speaker else "") + prompt
    ids = prompt_ids(text)
    unk = int((ids == vocab.UNK).sum())
    if unk:
        click.echo(f"note: {unk} prompt characters are outside {vocab.NAME} and read as <unk>", err=True)
    stops = (vocab.EOS, vocab.TURN) if stop_at_turn else (vocab.EOS,)
    shown = vocab.decode(ids)
    if num == 1:
        click.echo(shown, nl=False)

        def show(rows):  # a chunk of tokens [k, 1] at a time
            text = [int(t) for t in rows[:, 0] if t not in stops and t != vocab.PAD]
            if text:
                click.echo(vocab.decode(text), nl=False)

        gen.generate(ids, length, sampling, seed=seed, stop_at=stops, on_tokens=show)
        click.echo()
        return
    outs, printed = [[] for _ in range(num)], set()

    def emit(b):  # a sample is printed as soon as it is complete
        printed.add(b)
        body = [t for t in outs[b] if t not in stops]
        click.echo(f"--- sample {b + 1}\n{shown}{vocab.decode(body)}")

    def collect(rows):  # a chunk of tokens [k, num] at a time; <pad> after a sample stopped
        for b in range(num):
            if b in printed:
                continue
            for t in rows[:, b].tolist():
                if t == vocab.PAD:
                    break
                outs[b].append(t)
                if t in stops:
                    emit(b)
                    break

    gen.generate(ids, length, sampling, seed=seed, stop_at=stops, on_tokens=collect)
    for b in range(num):
        if b not in printed:
            emit(b)


def _tty_lines(prompt: str):
    """Lines typed at the terminal (with line editing when readline is there), until Ctrl-D."""
    try:
        import readline  # noqa: F401  (input() then has history and editing)
    except ImportError:
        pass
    while True:
        try:
            yield input(prompt)
        except EOFError:
            click.echo()
            return


@cli.command("talk")
@click.argument("checkpoint")
@click.option("--user", default="YOU", show_default=True, help="Your speaker name.")
@click.option("--speaker", default="CATCHAT", show_default=True, help="The model's speaker name.")
@click.option("--length", default=300, show_default=True, type=click.IntRange(min=1),
              help="Most characters per answer.")
@_sampling_options(ngram_default=5)
@click.option("--context", default=800, show_default=True, type=click.IntRange(min=16),
              help="Rolling context in characters (a model trained without carried state: at most data.window).")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Sampling seed: the same lines and seed give the same answers.")
@DEVICE_OPTION
def talk_cmd(checkpoint, user, speaker, length, sampling, context, seed, device):
    """Talk with a checkpoint: you write one speaker's lines, the model answers as another.

    Interactive at a terminal (/help lists the commands); with stdin from a pipe, each input line is
    one turn and each answer one output line."""
    from catchat import checkpoint as ck
    from catchat import talk as talk_mod
    from catchat.errors import UsageError
    from catchat.generate import Generator, check_speaker, checkpoint_config
    from catchat.vk.device import open_device

    user, speaker = check_speaker(user, "--user"), check_speaker(speaker)
    if user == speaker:
        raise UsageError(f"--user and --speaker are both {user!r}", "give the model another name than yours")
    ckpt = ck.load_checkpoint(checkpoint)
    budget, capped = talk_mod.context_budget(checkpoint_config(ckpt), context)
    note = lambda m: click.echo(m, err=True)  # noqa: E731
    if capped:
        note(capped)
    dialogue = talk_mod.Dialogue(Generator.from_checkpoint(open_device(device), ckpt), budget)
    st = talk_mod.TalkState(user=user, speaker=speaker, sampling=sampling, length=length)
    interactive = sys.stdin.isatty()
    if interactive:
        note(f"{ckpt.path} (step {ckpt.global_step:,}); {st.describe()}; context {budget} characters")
        note("type a line and press Enter; /help lists the commands, /quit or Ctrl-D leaves")
    talk_mod.talk(dialogue, _tty_lines(f"{user}: ") if interactive else sys.stdin, st, seed=seed,
                  write=lambda x: click.echo(x, nl=False), note=note, one_line=not interactive)


@cli.command("chat")
@click.argument("checkpoint_a", metavar="CKPT_A")
@click.argument("checkpoint_b", metavar="CKPT_B")
@click.option("--turns", default=10, show_default=True, type=click.IntRange(min=1),
              help="Turns to generate, A and B alternating.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False),
              help="The chat log: one JSONL line per turn, written as it is produced.")
@click.option("--append", is_flag=True,
              help="Continue the chat in --out: its turns prime both models, numbering goes on.")
@click.option("--speaker-a", default="ALICE", show_default=True, help="A's speaker name.")
@click.option("--speaker-b", default="BOB", show_default=True, help="B's speaker name.")
@_sampling_options(ngram_default=5, suffix="-a", who="A")
@_sampling_options(ngram_default=5, suffix="-b", who="B")
@click.option("--length", default=300, show_default=True, type=click.IntRange(min=1), help="Most characters per turn.")
@click.option("--context", default=800, show_default=True, type=click.IntRange(min=16),
              help="Rolling context of each model in characters.")
@click.option("--opening", default=None, help="A given first line (said by A in a new chat); not generated.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Sampling seed: the same command writes the same chat.")
@click.option("--quiet", is_flag=True, help="Do not show the turns on the terminal.")
@DEVICE_OPTION
def chat_cmd(checkpoint_a, checkpoint_b, turns, out, append, speaker_a, speaker_b, sampling_a, sampling_b, length,
             context, opening, seed, quiet, device):
    """Two checkpoints, both resident on one GPU, talk to each other; each turn is logged as JSONL."""
    from pathlib import Path

    from catchat import checkpoint as ck
    from catchat import talk as talk_mod
    from catchat import vocab
    from catchat.errors import UsageError
    from catchat.generate import Generator, check_speaker, checkpoint_config
    from catchat.vk.device import open_device

    samplings = [sampling_a, sampling_b]
    speakers = [check_speaker(speaker_a, "--speaker-a"), check_speaker(speaker_b, "--speaker-b")]
    if speakers[0] == speakers[1]:
        raise UsageError(f"--speaker-a and --speaker-b are both {speakers[0]!r}", "give the two sides different names")
    talk_mod.check_same_vocab(checkpoint_a, checkpoint_b)
    ckpts = [ck.load_checkpoint(checkpoint_a), ck.load_checkpoint(checkpoint_b)]
    dev = open_device(device)
    sides = []
    for c, sp, s in zip(ckpts, speakers, samplings):
        budget, capped = talk_mod.context_budget(checkpoint_config(c), context)
        if capped:
            click.echo(f"{sp}: {capped}", err=True)
        sides.append(talk_mod.Side(sp, talk_mod.Dialogue(Generator.from_checkpoint(dev, c), budget), s,
                                   talk_mod.checkpoint_info(c)))
    show = (lambda x: None) if quiet else (lambda x: click.echo(x, nl=False))  # noqa: E731
    written = talk_mod.chat(sides, turns, Path(out), append=append, length=length, seed=seed, opening=opening,
                            settings={"context": context, "length": length},
                            on_turn_start=lambda sp: show(f"{sp}: "),
                            on_token=lambda t: show(vocab.decode([t])),
                            on_turn_end=lambda rec: show(rec["text"] + "\n" if rec["checkpoint"] is None else "\n"))
    click.echo(f"wrote turns {written[0]['turn']}..{written[-1]['turn']} of conversation "
               f"{written[0]['conversation']} to {out}", err=True)


# ------------------------------------------------------------------------------ reliability
@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too, not only on defects.")
def scan(run_dir, strict):
    """Scan a run for anomalies: non-finite steps, loss rises, grad-norm spikes, throughput drops, memory
    growth, lr/tf against their formulas, resume signatures. A table; exit 1 on defects (docs/reliability.md)."""
    from pathlib import Path

    from catchat.scan import FAIL, WARN, scan_run, table_rows

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


def _warn(message: str) -> None:
    err_console.print(escape(message), highlight=False, soft_wrap=True)


def _fail(message: str, hint: str | None, exit_code: int):
    """One error line (and a fix line): never wrapped, brackets in it printed as they are."""
    err_console.print("[red]error:[/red] " + escape(message), highlight=False, soft_wrap=True)
    if hint:
        err_console.print("  fix: " + escape(hint), highlight=False, soft_wrap=True)
    sys.exit(exit_code)


def main(argv=None):
    """Console-script entry point: run the CLI, turning CatchatError into a short message + exit code."""
    try:
        cli.main(args=argv, prog_name="catchat", standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.UsageError as e:  # an unknown flag or command, a bad option value: one line, exit 2
        _fail(e.format_message(), f"`{e.ctx.command_path if e.ctx else 'catchat'} --help` lists what it takes",
              e.exit_code)
    except click.ClickException as e:
        _fail(e.format_message(), None, e.exit_code)
    except CatchatError as e:
        _fail(e.message, e.hint, e.exit_code)
    except OSError as e:  # disk full, permissions, a file gone: the system's words, not a traceback
        _fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
              "check free disk space, the path and its permissions", 1)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
