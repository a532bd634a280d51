"""Generation: `sample`, `talk`, `chat`, and the sampling options they share."""

from __future__ import annotations

import functools
import sys

import click

from catchat.cli import ALLOW_UNVERIFIED_OPTION, DEVICE_OPTION, GEN_PRECISION_OPTION, _warn, cli


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
            from catchat.inference.generate import Sampling

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
@GEN_PRECISION_OPTION
@DEVICE_OPTION
def sample(checkpoint, prompt, speaker, length, sampling, stop_at_turn, seed, num, allow_unverified, precision,
           device):
    """Generate text from a checkpoint, streaming it as it comes (docs/generation.md)."""
    from catchat.data import vocab
    from catchat.inference.generate import Generator, check_speaker, prompt_ids
    from catchat.run import checkpoint as ck
    from catchat.vk.device import open_device

    speaker = check_speaker(speaker) if speaker is not None else None
    ckpt = ck.load_checkpoint(checkpoint, allow_unverified=allow_unverified, warn=_warn)
    gen = Generator.from_checkpoint(open_device(device), ckpt, streams=num, precision=precision)
    text = (f"{speaker}: " if speaker else "") + prompt
    ids = prompt_ids(text)
    unk = vocab.unknown_characters(text)
    if unk:
        click.echo(f"note: {unk.total()} prompt characters are outside {vocab.NAME} and read as <unk>: "
                   + vocab.describe_unknown(unk), err=True)
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
@GEN_PRECISION_OPTION
@DEVICE_OPTION
def talk_cmd(checkpoint, user, speaker, length, sampling, context, seed, precision, device):
    """Talk with a checkpoint: you write one speaker's lines, the model answers as another.

    Interactive at a terminal (/help lists the commands); with stdin from a pipe, each input line is
    one turn and each answer one output line."""
    from catchat.errors import UsageError
    from catchat.inference import talk as talk_mod
    from catchat.inference.generate import Generator, check_speaker, checkpoint_config
    from catchat.run import checkpoint as ck
    from catchat.vk.device import open_device

    user, speaker = check_speaker(user, "--user"), check_speaker(speaker)
    if user == speaker:
        raise UsageError(f"--user and --speaker are both {user!r}", "give the model another name than yours")
    ckpt = ck.load_checkpoint(checkpoint)
    budget, capped = talk_mod.context_budget(checkpoint_config(ckpt), context)
    note = lambda m: click.echo(m, err=True)  # noqa: E731
    if capped:
        note(capped)
    dialogue = talk_mod.Dialogue(Generator.from_checkpoint(open_device(device), ckpt, precision=precision), budget)
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
@GEN_PRECISION_OPTION
@DEVICE_OPTION
def chat_cmd(checkpoint_a, checkpoint_b, turns, out, append, speaker_a, speaker_b, sampling_a, sampling_b, length,
             context, opening, seed, quiet, precision, device):
    """Two checkpoints, both resident on one GPU, talk to each other; each turn is logged as JSONL."""
    from pathlib import Path

    from catchat.data import vocab
    from catchat.errors import UsageError
    from catchat.inference import talk as talk_mod
    from catchat.inference.generate import Generator, check_speaker, checkpoint_config
    from catchat.run import checkpoint as ck
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
        gen = Generator.from_checkpoint(dev, c, precision=precision)
        sides.append(talk_mod.Side(sp, talk_mod.Dialogue(gen, budget), s,
                                   talk_mod.checkpoint_info(c)))
    show = (lambda x: None) if quiet else (lambda x: click.echo(x, nl=False))  # noqa: E731
    written = talk_mod.chat(sides, turns, Path(out), append=append, length=length, seed=seed, opening=opening,
                            settings={"context": context, "length": length},
                            on_turn_start=lambda sp: show(f"{sp}: "),
                            on_token=lambda t: show(vocab.decode([t])),
                            on_turn_end=lambda rec: show(rec["text"] + "\n" if rec["checkpoint"] is None else "\n"))
    click.echo(f"wrote turns {written[0]['turn']}..{written[-1]['turn']} of conversation "
               f"{written[0]['conversation']} to {out}", err=True)
