"""The corpus commands: `corpus build`, `corpus plays`, `corpus info`."""

from __future__ import annotations

import click

from catchat.cli import cli, console, err_console
from catchat.console import new_table


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
@click.option("--format", "fmt", type=click.Choice(["auto", "text", "jsonl"]), default="auto", show_default=True,
              help="auto: .jsonl/.ndjson are JSONL, other files text, and a file that is JSON or CSV is refused "
                   "with how to convert it; text or jsonl: read every file so.")
@click.option("--force", is_flag=True, help="Overwrite an existing corpus directory.")
@click.option("--hold-out", "hold_out", multiple=True, metavar="PLAYS",
              help="Hold out whole plays of `shakespeare` (comma-separated titles, case-insensitive; repeatable): "
                   "every scene of them is eval, none train. `catchat corpus plays` lists the titles.")
def corpus_build(sources, out, eval_fraction, max_unk_rate, delimiter, no_delimiter, fmt, force, hold_out):
    """Encode SOURCES (files, JSONL, or `shakespeare`) into a corpus directory."""
    from catchat.data import corpus as corpus_mod
    from catchat.progress import Progress

    with Progress(err_console, "corpus build", "bytes") as progress:  # stderr: stdout has the summary
        summary = corpus_mod.build(sources, out, eval_fraction=eval_fraction, max_unk_rate=max_unk_rate,
                                   delimiter=None if no_delimiter else delimiter, fmt=fmt, force=force,
                                   hold_out=list(hold_out) or None, progress=progress)
    for line in summary.lines():
        console.print(line, markup=False, highlight=False)

@corpus.command("plays")
def corpus_plays():
    """List the plays of the built-in corpus (the titles --hold-out and "shakespeare:hold-out=..." take)."""
    from catchat.data import corpus as corpus_mod

    default = set(corpus_mod.DEFAULT_HOLD_OUT)
    table = new_table("title", "genre", "file", "held out by shakespeare:hold-out")
    for p in corpus_mod.plays():
        table.add_row(p.title, p.genre, p.path.name, "yes" if p.title in default else "")
    console.print(table)

@corpus.command("info")
@click.argument("path")
def corpus_info(path):
    """Summarise a corpus directory (or `shakespeare`)."""
    from catchat.data import corpus as corpus_mod

    for line in corpus_mod.info(path):
        console.print(line, markup=False, highlight=False)
