"""One streaming writer shared by every reader: conversations -> tokens.bin and index rows."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from catchat.data import vocab
from catchat.data.corpus.layout import TOKENS_FILE
from catchat.data.corpus.split import split_key


@dataclass
class SourceStats:
    """What one source contributed (also its manifest entry)."""

    path: str
    kind: str  # "text" | "jsonl" | "shakespeare"
    sha256: str = ""
    bytes: int = 0
    conversations: int = 0
    characters: int = 0
    unk: int = 0
    skipped_empty: int = 0
    synthetic: dict | None = None  # a `catchat chat` log: the checkpoints that wrote it
    unk_chars: Counter[str] = field(default_factory=Counter)  # which characters were <unk>, how often

    @property
    def unk_rate(self) -> float:
        return self.unk / self.characters if self.characters else 0.0


class Writer:
    """Appends conversations to tokens.bin and index rows to a raw side file.

    begin() / turn(speaker) / text(s) ... / end(). Text is gathered as a string (specials as
    private-use placeholders) and encoded in batches of ~1 M characters, so memory stays bounded
    and small records cost little; each conversation's sha256 (its split key) is updated as its
    tokens are written."""

    FLUSH_CHARS = 1 << 20
    _PLACEHOLDER = {vocab.BOS: "\ue001", vocab.EOS: "\ue002", vocab.TURN: "\ue003"}
    _ESCAPE = str.maketrans({0xE001: "\ufffd", 0xE002: "\ufffd", 0xE003: "\ufffd"})  # text never makes specials

    def __init__(self, tmp_dir: Path | None):
        """tmp_dir None: tokens and index rows go to memory (`read_conversations`), not to files."""
        if tmp_dir is None:
            import io

            self._tokens, self._index = io.BytesIO(), io.BytesIO()
        else:
            self._tokens = open(tmp_dir / TOKENS_FILE, "wb", buffering=1 << 20)
            self._index = open(tmp_dir / "index.raw", "wb", buffering=1 << 16)
        self.tokens_sha = hashlib.sha256()
        self.pos = 0  # tokens written (flushed)
        self.conversations = 0
        self.turns = 0
        self.characters = 0
        self.unk = 0
        self.unk_chars: Counter[str] = Counter()  # every source's <unk> characters (the reports name them)
        self.stats: SourceStats | None = None
        self._buf: list[str] = []
        self._buf_chars = 0
        self._events: list[tuple[int, bool]] = []  # (offset in the buffer, True = begin / False = end)
        self._in_conv = False
        self._conv_turns = 0
        self._conv_start = 0
        self._conv_sha = hashlib.sha256()

    def _put(self, s: str) -> None:
        self._buf.append(s)
        self._buf_chars += len(s)
        if self._buf_chars >= self.FLUSH_CHARS:
            self.flush()

    def begin(self) -> None:
        assert not self._in_conv, "begin() inside a conversation"
        self._in_conv, self._conv_turns = True, 0
        self._events.append((self._buf_chars, True))
        self._put(self._PLACEHOLDER[vocab.BOS])

    def turn(self, speaker: str | None) -> None:
        """Start a turn: <turn> between turns, then 'SPEAKER: ' when there is a speaker."""
        if self._conv_turns:
            self._put(self._PLACEHOLDER[vocab.TURN])
        self._conv_turns += 1
        self.turns += 1
        if speaker is not None:
            speaker = " ".join(vocab.normalise(speaker).split())  # one line, single spaces
            if speaker:
                self.text(speaker + ": ", normalised=True)

    def text(self, s: str, *, normalised: bool = False) -> None:
        if s:
            s = s if normalised else vocab.normalise(s)
            if "\ue001" in s or "\ue002" in s or "\ue003" in s:  # rare: skip the slow translate otherwise
                s = s.translate(self._ESCAPE)
            self._put(s)

    def end(self) -> None:
        self._put(self._PLACEHOLDER[vocab.EOS])
        self._events.append((self._buf_chars, False))
        self._in_conv = False
        self.conversations += 1
        if self.stats is not None:
            self.stats.conversations += 1

    def conversation(self, turns: Sequence[tuple[str | None, str]]) -> None:
        self.begin()
        for speaker, text in turns:
            self.turn(speaker)
            self.text(text)
        self.end()

    def flush(self) -> None:
        """Encode the gathered text, write its tokens and the index rows of finished conversations."""
        if not self._buf:
            return
        s = "".join(self._buf)
        self._buf, self._buf_chars = [], 0
        enc = vocab.encode(s, normalise_text=False)
        ids = enc.ids
        code = np.frombuffer(s.encode("utf-32-le"), dtype=np.uint32)
        special = (code >= 0xE001) & (code <= 0xE003)
        ids[special] = (code[special] - 0xE000).astype(np.uint8)  # placeholders -> <bos> <eos> <turn>
        n_special = int(np.count_nonzero(special))
        chars, unk = enc.char_count - n_special, enc.unk_count - n_special
        unk_chars = vocab.tally_unknown(code[ids == vocab.UNK]) if unk else Counter()
        data = ids.tobytes()
        self._tokens.write(data)
        self.tokens_sha.update(data)
        prev = 0
        for off, is_begin in self._events:
            if is_begin:
                self._conv_sha, self._conv_start, prev = hashlib.sha256(), self.pos + off, off
                continue
            self._conv_sha.update(data[prev:off])
            key = split_key(self._conv_sha.digest())
            end = self.pos + off
            self._index.write(np.array([self._conv_start, end - self._conv_start, key], np.int64).tobytes())
            prev = off
        if self._in_conv:
            self._conv_sha.update(data[prev:])
        self._events = []
        self.pos += len(data)
        self.characters += chars
        self.unk += unk
        self.unk_chars.update(unk_chars)
        if self.stats is not None:
            self.stats.characters += chars
            self.stats.unk += unk
            self.stats.unk_chars.update(unk_chars)

    def close(self) -> None:
        self._tokens.close()
        self._index.close()


class SourceFile:
    """A source opened for reading (binary) whose readline() reports the bytes read to `on_bytes`
    (a build's progress), at most once per REPORT_BYTES: a call per line would cost more than the line."""

    REPORT_BYTES = 1 << 20

    def __init__(self, path: Path, on_bytes: Callable[[int], None] | None = None):
        self._f = open(path, "rb")
        self._on_bytes = on_bytes
        self._unreported = 0

    def readline(self, size: int = -1) -> bytes:
        raw = self._f.readline(size)
        if self._on_bytes is not None:
            self._unreported += len(raw)
            if self._unreported >= self.REPORT_BYTES or not raw:
                self._on_bytes(self._unreported)
                self._unreported = 0
        return raw

    def __enter__(self) -> SourceFile:
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()
