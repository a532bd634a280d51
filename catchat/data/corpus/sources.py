"""From sources to tokens: the inputs a build takes (files, directories, "shakespeare"), each read
by its reader into one Writer (`read_sources`), and the same path into memory (`read_conversations`)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from catchat.data import vocab
from catchat.data.corpus.detect import check_format
from catchat.data.corpus.jsonl import JSONL_SUFFIXES, read_jsonl
from catchat.data.corpus.shakespeare import SHAKESPEARE, read_shakespeare, shakespeare_files
from catchat.data.corpus.text import read_text
from catchat.data.corpus.writer import SourceStats, Writer
from catchat.errors import UsageError

if TYPE_CHECKING:
    from catchat.progress import Progress

DEFAULT_DELIMITER = "<|endoftext|>"  # a plain-text line equal to this ends a conversation
DEFAULT_MAX_UNK_RATE = 0.05  # refuse a source with more <unk> characters than this (binary data)


def expand_sources(sources: Sequence[str | os.PathLike], fmt: str) -> list[tuple[str, Path | None]]:
    """(kind, path) per input file, in the order given (directories: sorted, recursive, no dot files).
    A file whose content is another format than its reader's (a JSON array, CSV...) is refused here,
    before anything is read or written (`detect.check_format`)."""
    if not sources:
        raise UsageError("no sources given", "e.g. catchat corpus build shakespeare chats.jsonl -o corpora/mine")
    out: list[tuple[str, Path | None]] = []
    for src in sources:
        if str(src) == SHAKESPEARE:
            out.append((SHAKESPEARE, None))
            continue
        p = Path(src)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file()
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))
            if not files:
                raise UsageError(f"source directory {p} holds no files",
                                 "pass files, or a directory with text/JSONL files")
        elif p.is_file():
            files = [p]
        elif p.exists():
            raise UsageError(f"source {p} is not a regular file",
                             "pass text or JSONL files, directories or 'shakespeare'")
        elif str(src).startswith(f"{SHAKESPEARE}:"):
            raise UsageError(f"source {src} does not exist: a build takes the built-in corpus as '{SHAKESPEARE}'",
                             f"name held-out plays with --hold-out, e.g. {SHAKESPEARE} --hold-out 'Macbeth, Othello'")
        else:
            raise UsageError(f"source {p} does not exist",
                             f"check the path (the built-in corpus is spelled '{SHAKESPEARE}')")
        for f in files:
            kind = fmt if fmt != "auto" else ("jsonl" if f.suffix.lower() in JSONL_SUFFIXES else "text")
            if fmt == "auto" or kind == "jsonl":  # --format text reads any file as text, as asked
                check_format(f, kind)
            out.append((kind, f))
    return out


def read_sources(w: Writer, inputs: list[tuple[str, Path | None]], max_unk_rate: float,
                 delimiter: str | None, progress: Progress | None = None) -> list[SourceStats]:
    """Read every (kind, path) of `expand_sources` into `w` (the one path from a file to tokens:
    `build` and `read_conversations` both use it); returns each source's stats. Refuses an empty
    file, a file without text and a source over `max_unk_rate`. `progress` counts the bytes read."""
    all_stats: list[SourceStats] = []
    on_bytes = None
    if progress is not None:
        progress.start(input_bytes(inputs))
        on_bytes = progress.advance

    def stats_for(path: str, kind: str) -> SourceStats:
        w.flush()
        check_unk(w.stats)
        s = SourceStats(path=path, kind=kind)
        all_stats.append(s)
        w.stats = s
        return s

    def check_unk(s: SourceStats | None) -> None:
        if s is not None and s.characters and s.unk_rate > max_unk_rate:
            raise UsageError(
                f"{s.path}: {s.unk_rate:.1%} of its characters are outside the {vocab.NAME} vocabulary "
                f"(at most {max_unk_rate:.1%} allowed), most often {vocab.describe_unknown(s.unk_chars)}: "
                "binary data or a non-English script?",
                "leave the file out, convert it, or raise the limit with --max-unk-rate")

    for kind, path in inputs:
        if kind == SHAKESPEARE:
            read_shakespeare(w, stats_for, on_bytes)
            continue
        try:
            size = path.stat().st_size
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}", "check the path and its permissions") from None
        if size == 0:
            raise UsageError(f"{path} is empty (0 bytes)", "leave it out or give it some text")
        stats = stats_for(str(path), kind)
        try:
            if kind == "jsonl":
                read_jsonl(path, w, stats, on_bytes)
            else:
                read_text(path, w, stats, delimiter, on_bytes)
        except PermissionError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}", "check its permissions") from None
        if stats.conversations == 0:
            what = "no records with text" if kind == "jsonl" else "no text (only whitespace or delimiters)"
            raise UsageError(f"{path} holds {what}", "leave it out or give it some text")
    w.flush()
    check_unk(w.stats)
    return all_stats


def input_bytes(inputs: list[tuple[str, Path | None]]) -> int:
    """The bytes a build reads (the built-in corpus: its play files), for its progress."""
    total = 0
    for kind, path in inputs:
        paths = shakespeare_files() if kind == SHAKESPEARE else [path]
        for p in paths:
            try:
                total += p.stat().st_size
            except OSError:
                pass  # read_sources says what is wrong with it
    return total


@dataclass
class Conversations:
    """Conversations read from a file without building a corpus (`read_conversations`)."""

    tokens: np.ndarray  # uint8: every conversation back to back, <bos> .. <eos>
    starts: np.ndarray  # int64 [N]: offset of each conversation in tokens
    lengths: np.ndarray  # int64 [N]: its length in tokens
    sources: list[SourceStats]  # path, kind, sha256, bytes, conversations, characters, unk, skipped_empty
    turns: int
    characters: int  # text and speaker characters (not the specials), as a corpus manifest counts them
    unk: int
    unk_chars: Counter[str]  # which characters were <unk>, how often

    def __len__(self) -> int:
        return len(self.starts)


def read_conversations(source: str | os.PathLike, *, fmt: str = "auto", delimiter: str | None = DEFAULT_DELIMITER,
                       max_unk_rate: float = DEFAULT_MAX_UNK_RATE) -> Conversations:
    """A plain-text or JSONL file (or a directory of them, as `build` takes it) -> its conversations
    as token ids, in memory: the readers, normalisation, encoding and checks of `build`, with no
    corpus directory written (`catchat eval --text FILE`)."""
    if fmt not in ("auto", "text", "jsonl"):
        raise UsageError(f"unknown corpus format {fmt!r}", "use auto, text or jsonl")
    w = Writer(None)
    try:
        stats = read_sources(w, expand_sources([source], fmt), max_unk_rate, delimiter)
        tokens = np.frombuffer(w._tokens.getvalue(), dtype=np.uint8)
        index = np.frombuffer(w._index.getvalue(), dtype=np.int64).reshape(-1, 3)
    finally:
        w.close()
    return Conversations(tokens=tokens, starts=index[:, 0].copy(), lengths=index[:, 1].copy(), sources=stats,
                         turns=w.turns, characters=w.characters, unk=w.unk, unk_chars=w.unk_chars)
