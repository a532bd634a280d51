"""The `catchat` command line. Every user-fixable failure prints one or two lines, never a traceback."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from catchat import __version__
from catchat.errors import CatchatError

console = Console()
err_console = Console(stderr=True)

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

    table = Table("index", "name", "type", "driver", "Vulkan", "max buffer", "shared mem", "subgroup")
    for d in probe_devices():
        table.add_row(str(d.index), d.name, d.type, d.driver, d.api_version,
                      f"{d.max_storage_buffer_bytes / 2**20:.0f} MiB", f"{d.max_shared_memory_bytes // 1024} KiB",
                      str(d.subgroup_size))
    console.print(table)


@cli.command()
def doctor():
    """Check numpy, the Vulkan loader, kp, glslc, and run a shader on every device against numpy."""
    from catchat.doctor import checks

    failed = False
    for c in checks():
        mark = "[green]ok[/green]  " if c.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {c.what}: {c.detail}")
        if not c.ok:
            failed = True
            if c.fix:
                console.print(f"       fix: {c.fix}")
    if failed:
        raise SystemExit(1)
    console.print("all checks passed")


@cli.command()
@DEVICE_OPTION
def parity(device):
    """Run every kernel and the whole model against numpy on a device; exit 1 on any mismatch."""
    from catchat.parity import timed_run
    from catchat.vk.device import open_device

    dev = open_device(device)
    console.print(f"device: {dev.info.name} ({dev.info.type}, {dev.info.driver})")
    results, seconds = timed_run(dev)
    table = Table("group", "kernel", "shape", "max abs err", "max rel err", "tolerance", "result")
    for group, r in results:
        table.add_row(group, r.kernel, r.shape, f"{r.max_abs:.2e}", f"{r.max_rel:.2e}",
                      f"{r.atol:g} + {r.rtol:g}*|ref|", "[green]pass[/green]" if r.ok else "[red]FAIL[/red]")
    console.print(table)
    failed = sum(not r.ok for _, r in results)
    console.print(f"{len(results) - failed} passed, {failed} failed in {seconds:.1f} s")
    if failed:
        raise SystemExit(1)


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
def corpus_build(sources, out, eval_fraction, max_unk_rate, delimiter, no_delimiter, fmt, force):
    """Encode SOURCES (files, JSONL, or `shakespeare`) into a corpus directory."""
    from catchat import corpus as corpus_mod

    summary = corpus_mod.build(sources, out, eval_fraction=eval_fraction, max_unk_rate=max_unk_rate,
                               delimiter=None if no_delimiter else delimiter, fmt=fmt, force=force)
    for line in summary.lines():
        console.print(line, markup=False, highlight=False)


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
@DEVICE_OPTION
def train(config_path, overrides, run_dir, resume, stop_after_steps, device):
    """Train a model from a TOML CONFIG on the Vulkan device."""
    from pathlib import Path

    from catchat import config as cfgmod
    from catchat.progress import TrainReporter
    from catchat.train import Trainer
    from catchat.vk.device import open_device

    cfg = cfgmod.load(config_path, overrides)
    name = Path(config_path).stem
    run_dir = Path(run_dir or Path("runs") / name)
    dev = open_device(device)
    console.print(f"device: {dev.info.name}; run: {run_dir}", highlight=False)
    with TrainReporter(console) as reporter:
        trainer = Trainer(cfg, run_dir, dev, config_name=name, resume=resume, reporter=reporter)
        reason = trainer.run(stop_after_steps)
    if reason.startswith("interrupted"):
        raise SystemExit(130)


@cli.command("eval")
@click.argument("checkpoint")
@click.option("--corpus", "corpus_path", default=None, help="Corpus to evaluate on (default: the run's).")
@click.option("--windows", default=0, show_default=True, help="Held-out windows to use (0 = all).")
@DEVICE_OPTION
def eval_cmd(checkpoint, corpus_path, windows, device):
    """Evaluate a checkpoint on a corpus's held-out split; prints the metrics as JSON."""
    import json

    from catchat import checkpoint as ck
    from catchat import config as cfgmod
    from catchat.corpus import open_corpus
    from catchat.lanes import Lanes
    from catchat.model import ParamLayout
    from catchat.train import evaluate
    from catchat.vk.device import open_device
    from catchat.vk.program import Program

    ckpt = ck.load_checkpoint(checkpoint)
    cfg = cfgmod.from_dict(ckpt.state["config"], source=str(ckpt.path / ck.STATE_FILE))
    c = open_corpus(corpus_path or cfg.data.corpus)
    lanes = Lanes.from_config(c, cfg, "eval")
    spec = cfgmod.model_spec(cfg)
    prog = Program(open_device(device), spec, cfg.data.window, cfg.data.batch_lanes, training=False)
    prog.set_params(ParamLayout(spec).flatten(ckpt.params, __import__("numpy").float32))
    res = evaluate(prog, lanes, windows)
    click.echo(json.dumps(dict(checkpoint=str(ckpt.path), global_step=ckpt.global_step, **res), indent=1))


@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), help="Where to write the PNGs (default RUN_DIR/plots).")
def plot(run_dir, out):
    """Summarise a run and write PNG plots of loss, lr, grad norm, throughput and accuracy."""
    from pathlib import Path

    from catchat.plot import plot_run, summarise_run

    for line in summarise_run(Path(run_dir)):
        console.print(line, highlight=False, markup=False)
    paths = plot_run(Path(run_dir), Path(out) if out else None)
    where = paths[0].parent if paths else Path(out or Path(run_dir) / "plots")
    console.print(f"wrote {len(paths)} plots to {where}: " + " ".join(p.name for p in paths),
                  highlight=False, markup=False)


# ------------------------------------------------------------------------------ generation
@cli.command()
@click.argument("checkpoint")
@click.option("--prompt", default="", help="Text to continue (after <bos>).")
@click.option("--speaker", default=None, help="Start the prompt as this speaker's turn: 'SPEAKER: '.")
@click.option("--length", default=300, show_default=True, type=click.IntRange(min=1), help="Characters to generate.")
@click.option("--temperature", default=0.8, show_default=True, type=click.FloatRange(min=0.0))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0), help="0 = off.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0.0, 1.0, min_open=True))
@click.option("--greedy", is_flag=True, help="Always take the most likely character.")
@click.option("--seed", default=0, show_default=True, help="Sampling seed: the same seed gives the same text.")
@click.option("--num", default=1, show_default=True, type=click.IntRange(min=1), help="Samples generated at once.")
@DEVICE_OPTION
def sample(checkpoint, prompt, speaker, length, temperature, top_k, top_p, greedy, seed, num, device):
    """Generate text from a checkpoint, streaming it as it comes."""
    from catchat import checkpoint as ck
    from catchat import vocab
    from catchat.generate import Generator, Sampling, prompt_ids
    from catchat.vk.device import open_device

    ckpt = ck.load_checkpoint(checkpoint)
    gen = Generator.from_checkpoint(open_device(device), ckpt, streams=num)
    text = (f"{speaker}: " if speaker else "") + prompt
    s = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)
    stream = num == 1
    if stream:
        click.echo(text, nl=False)
    outs = gen.generate(prompt_ids(text), length, s, seed=seed,
                        on_tokens=(lambda t: click.echo(vocab.decode(t), nl=False)) if stream else None)
    if stream:
        click.echo()
    else:
        for i, ids in enumerate(outs):
            click.echo(f"--- sample {i + 1}\n{text}{vocab.decode(ids)}")


def main(argv=None):
    """Console-script entry point: run the CLI, turning CatchatError into a short message + exit code."""
    try:
        cli.main(args=argv, prog_name="catchat", standalone_mode=False)
    except click.exceptions.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except CatchatError as e:
        err_console.print(f"[red]error:[/red] {e.message}", highlight=False)
        if e.hint:
            err_console.print(f"  fix: {e.hint}", highlight=False)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
