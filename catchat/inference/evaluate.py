"""`catchat eval`: a checkpoint's loss, bits per char and top-1/top-5 on a corpus split or on any
plain-text / JSONL file (docs/eval.md).

What is scored: the conversations, each from zero hidden state (reset at its `<bos>`), the state
carried across windows within it, every next-token target but the one after its `<eos>` (so
every character, every `<turn>` and the `<eos>`): the same targets and state as the trainer's
evals (`evaluate_lanes` over `Lanes`, below). A checkpoint trained stateless (data.carry_state =
false) is scored stateless too, with its own window.

The eval program is forward-only and built for the data, not for the checkpoint's training batch:
the checkpoint's config gives the model, `lanes.packed_layout` the lanes and window (the fewest
lanes that keep the longest lane as short as data.batch_lanes lanes would, and the shortest window
that needs no more windows than data.window), shrunk further where the device's memory or buffer
limit needs it. Carrying state, the result does not depend on that layout (up to float32
summation order).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from catchat.data import vocab
from catchat.data.lanes import Lanes, packed_layout
from catchat.errors import UsageError

if TYPE_CHECKING:
    from catchat.distributed import Comm
    from catchat.progress import Progress
    from catchat.vk.program import Program

SPLITS = ("eval", "train", "all")


def evaluate_lanes(prog: Program, lanes: Lanes, n_windows: int, *, free_running: bool = False,
                   comm: Comm | None = None, share: tuple[int, int] | None = None) -> dict:
    """Plain cross-entropy over the first n_windows windows (0 = all) of `lanes`, from zero state;
    teacher-forced, or free-running (every input the model's own argmax, the per-timestep path).

    With `comm` (data parallelism) this rank scores lanes share = [lo, hi) of each window and the
    sums (loss, valid targets, top-1/5) are added over the ranks in rank order: every rank gets the
    result of all lanes. The program's carried state is saved and restored around it, so training
    continues unchanged.
    """
    saved = prog.get_carry()
    lo, hi = share if comm is not None else (0, None)
    windows = ((w.tokens[:, lo:hi], w.targets[:, lo:hi], w.resets[:, lo:hi])
               for w in (lanes.window(0, i) for i in range(windows_to_score(lanes, n_windows))))
    reduce_sums = None if comm is None else (lambda sums: comm.sum_rows(sums, "adding up an evaluation"))
    res = prog.evaluate_windows(windows, free_running=free_running, reduce_sums=reduce_sums)
    prog.set_carry(saved)
    return res


def windows_to_score(lanes: Lanes, n_windows: int) -> int:
    """The windows an eval of n_windows (0 = all) scores: at most one cycle's."""
    return lanes.windows_per_cycle if n_windows <= 0 else min(n_windows, lanes.windows_per_cycle)


FORMATS = ("auto", "text", "jsonl")


@dataclass
class EvalSet:
    """Conversations to score: tokens back to back plus each one's start and length."""

    tokens: np.ndarray  # uint8
    starts: np.ndarray  # int64 [N]
    lengths: np.ndarray  # int64 [N]
    source: str  # "corpus" | "text"
    path: str
    split: str | None = None  # corpus only
    notes: list[str] = field(default_factory=list)

    @property
    def conversations(self) -> int:
        return len(self.starts)

    def describe(self) -> str:
        n = f"{self.conversations:,} conversation{'s' if self.conversations != 1 else ''}"
        if self.source == "text":
            return f"{self.path} ({n})"
        what = "all" if self.split == "all" else f"the {self.split} split"
        return f"{what} of corpus {self.path} ({n})"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def corpus_set(corpus, split: str, eval_fraction: float, max_conversations: int = 0) -> EvalSet:
    """One side of a corpus's split (the checkpoint's data.eval_fraction and data.max_conversations),
    or all of it; an empty side is a UsageError that says why and what to use instead."""
    if split not in SPLITS:
        raise UsageError(f"unknown split {split!r}", "use --split eval, train or all")
    sp = corpus.split(eval_fraction, max_conversations)
    ids = {"eval": sp.eval, "train": sp.train, "all": np.arange(sp.considered, dtype=np.int64)}[split]
    if len(ids) == 0:
        held = (f"eval fraction {eval_fraction:g}" if split == "eval" else
                f"all of them held out for eval at eval fraction {eval_fraction:g}")
        capped = f" of the first {sp.considered:,} read (data.max_conversations)" if sp.considered < sp.total else ""
        other = "all" if split == "eval" else "all or --split eval"
        raise UsageError(f"the {split} split of {corpus.path} is empty ({_plural(sp.considered, 'conversation')}"
                         f"{capped}, {held})",
                         f"use --split {other}, or --text FILE to score a text file")
    notes = [sp.note] if sp.note else []
    return EvalSet(tokens=corpus.tokens, starts=np.asarray(corpus.starts[ids], np.int64),
                   lengths=np.asarray(corpus.lengths[ids], np.int64), source="corpus", path=str(corpus.path),
                   split=split, notes=notes)


def text_set(path: str | Path, fmt: str = "auto", max_unk_rate: float | None = None) -> EvalSet:
    """A plain-text or JSONL file, read, normalised and encoded exactly as `catchat corpus build`
    does (catchat.data.corpus.read_conversations), in memory."""
    from catchat.data.corpus import read_conversations

    convs = read_conversations(path, fmt=fmt, **({} if max_unk_rate is None else {"max_unk_rate": max_unk_rate}))
    notes = []
    skipped = sum(s.skipped_empty for s in convs.sources)
    if skipped:
        notes.append(f"skipped {_plural(skipped, 'empty record')}")
    if convs.unk:
        notes.append(f"{convs.unk:,} of {convs.characters:,} characters are outside {vocab.NAME} (scored as <unk>): "
                     + vocab.describe_unknown(convs.unk_chars))
    return EvalSet(tokens=convs.tokens, starts=convs.starts, lengths=convs.lengths, source="text", path=str(path),
                   notes=notes)


def _largest_buffer_bytes(spec, T: int, B: int) -> int:
    """The eval program's largest buffer (the GRU's saved gates, or the logits), in bytes."""
    return 4 * T * B * max(4 * spec.hidden, spec.vocab_size)


def fit_layout(dev, layout, lengths, max_lanes: int, window: int, carry_state: bool) -> tuple[int, int, str]:
    """(B, T, note): `packed_layout`, with fewer lanes (then, carrying state, a shorter window) while
    the program would exceed the device's memory or its largest storage buffer. The note says so."""
    from catchat.vk.program import Program

    heap = dev.info.device_memory_bytes
    max_buffer = min(dev.info.max_storage_buffer_bytes or 2**32 - 1, 2**32 - 1)
    cap_b, cap_t = max_lanes, window
    first = None
    while True:
        B, T = packed_layout(lengths, cap_b, cap_t, carry_state=carry_state)
        first = first or (B, T)
        fits = ((not heap or Program.planned_bytes(layout, T, B, training=False, dev=dev) <= heap)
                and _largest_buffer_bytes(layout.spec, T, B) <= max_buffer)
        if fits or (B == 1 and (T == 1 or not carry_state)):
            break  # fits, or cannot shrink further (Program then says what is missing)
        if B > 1:
            cap_b = B // 2
        else:
            cap_t = max(1, T // 2)
    note = "" if (B, T) == first else (f"{first[0]} lanes of {first[1]} would not fit on {dev.info.name}: "
                                       f"using {B} of {T}")
    return B, T, note


def evaluate_set(dev, layout, flat_params: np.ndarray, data: EvalSet, *, max_lanes: int, window: int,
                 carry_state: bool = True, n_windows: int = 0, progress: Progress | None = None) -> dict:
    """Score `data` with the model (its ParamLayout, flat float32 params) on `dev`: a forward-only program of
    the `fit_layout` shape. n_windows > 0 scores only the first that many windows of that layout;
    `progress` counts them as they are scored (a window is the unit: its steps depend on each other).
    Returns loss (nats per target), bpc, top1, top5 (rates), n_valid (targets scored), characters
    (of them, the text's characters: not <turn>/<eos>), conversations, lanes, window, windows,
    seconds (building the program and scoring)."""
    from catchat.vk.program import Program

    t0 = time.perf_counter()
    B, T, note = fit_layout(dev, layout, data.lengths, max_lanes, window, carry_state)
    lanes = Lanes(data.tokens, data.starts, data.lengths, batch_lanes=B, window=T, carry_state=carry_state,
                  layout_id="eval")
    prog = Program(dev, layout, T, B, training=False)
    prog.set_params(flat_params)
    total = windows_to_score(lanes, n_windows)
    characters = 0

    def windows():
        nonlocal characters
        for i in range(total):
            w = lanes.window_at(i)
            characters += int(np.count_nonzero(w.targets >= vocab.UNK))  # not <pad>, <eos>, <turn>
            yield w.tokens, w.targets, w.resets

    if progress is not None:
        progress.start(total)
    res = prog.evaluate_windows(windows() if progress is None else progress.track(windows()))
    notes = list(data.notes) + ([note] if note else [])
    if n_windows > 0 and total < lanes.windows_per_cycle:
        notes.append(f"--windows {n_windows}: scored the first {total} of {lanes.windows_per_cycle} windows")
    return dict(res, characters=characters, conversations=data.conversations, lanes=B, window=T,
                carry_state=carry_state, seconds=round(time.perf_counter() - t0, 3), notes=notes)


def evaluate_checkpoint(ckpt, dev, *, text: str | None = None, fmt: str = "auto", corpus_path: str | None = None,
                        split: str = "eval", n_windows: int = 0, max_lanes: int = 0,
                        max_unk_rate: float | None = None, progress: Progress | None = None) -> dict:
    """`catchat eval`: a loaded checkpoint (catchat.run.checkpoint.load_checkpoint) on `text` (a file)
    or on one split of `corpus_path` (default: the run's corpus). max_lanes > 0 caps the lanes
    (default: the checkpoint's data.batch_lanes); `progress` shows the windows scored. Returns the
    result dict of `evaluate_set` plus checkpoint, global_step, source, path and split (corpus only)."""
    from catchat import config as cfgmod
    from catchat.model import ParamLayout
    from catchat.run import checkpoint as ck

    cfg = cfgmod.from_dict(ckpt.state["config"], source=str(ckpt.path / ck.STATE_FILE))
    if text is not None:
        data = text_set(text, fmt, max_unk_rate)
    else:
        from catchat.data.corpus import open_corpus

        data = corpus_set(open_corpus(corpus_path or cfg.data.corpus), split, cfg.data.eval_fraction,
                          cfg.data.max_conversations)
    layout = ParamLayout(cfgmod.model_spec(cfg))
    flat = layout.flatten(ckpt.params, np.float32)
    res = evaluate_set(dev, layout, flat, data, max_lanes=max_lanes or cfg.data.batch_lanes, window=cfg.data.window,
                       carry_state=cfg.data.carry_state, n_windows=n_windows, progress=progress)
    head = {"checkpoint": str(ckpt.path), "global_step": ckpt.global_step, "source": data.source, "path": data.path}
    if data.split is not None:
        head["split"] = data.split
    return dict(head, description=data.describe(), **res)


def summary_lines(res: dict) -> list[str]:
    """The human-readable report of an `evaluate_checkpoint` result."""
    nv, chars = res["n_valid"], res["characters"]
    if nv == 0:
        scores = ["  nothing scored (no targets in the windows evaluated)"]
    else:
        scores = [f"  loss       {res['loss']:.4f} nats/char",
                  f"  bits/char  {res['bpc']:.4f}",
                  f"  top-1      {res['top1']:.2%}",
                  f"  top-5      {res['top5']:.2%}"]
    mode = "state carried across windows" if res["carry_state"] else "stateless: state reset every window"
    lines = [f"{res['checkpoint']} (step {res['global_step']:,}) on {res['description']}", *scores,
             f"  scored     {_plural(nv, 'target')}: {_plural(chars, 'character')} + {nv - chars:,} <turn>/<eos>",
             (f"  layout     {_plural(res['lanes'], 'lane')} x {_plural(res['windows'], 'window')} of "
              f"{res['window']:,} ({mode}); {res['seconds']:.1f} s")]
    lines += [f"  note: {n}" for n in res["notes"]]
    return lines
