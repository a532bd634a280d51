"""Reader: plain text (one file = one conversation, or split on a delimiter line)."""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import Callable
from pathlib import Path

from catchat.data import vocab
from catchat.data.corpus.writer import SourceFile, SourceStats, Writer
from catchat.errors import UsageError

_READ_CHUNK = 1 << 20  # bytes per read of a plain-text file (a longer line arrives in pieces)


class _TextConversation:
    """Streams one plain-text conversation as one turn without a speaker: text kept verbatim
    (after normalisation) except that whitespace-only lines before the first text, and all
    whitespace after the last, are dropped."""

    _MAX_PENDING = 1 << 20  # whitespace held back, at most

    def __init__(self, w: Writer):
        self.w = w
        self.begun = False
        self.pending = ""  # whitespace not yet written (it may turn out to be trailing)
        self.cr = ""

    def feed(self, s: str) -> None:
        s = self.cr + s
        self.cr = ""
        if s.endswith("\r"):  # maybe the first half of a CRLF split across reads
            self.cr, s = "\r", s[:-1]
        s = vocab.normalise(s)
        if not s:
            return
        if not self.begun:
            s = self.pending + s
            text = s.lstrip()
            if not text:
                self.pending = s[-self._MAX_PENDING:]
                return
            s = s[s.rfind("\n", 0, len(s) - len(text)) + 1:]  # from the start of the first text line
            self.pending = ""
            self.w.begin()
            self.w.turn(None)
            self.begun = True
        body = s.rstrip()
        if body:
            self.w.text(self.pending + body, normalised=True)
            self.pending = s[len(body):]
        else:
            self.pending += s
        if len(self.pending) > self._MAX_PENDING:
            self.w.text(self.pending, normalised=True)
            self.pending = ""

    def end(self) -> None:
        if self.begun:
            self.w.end()
        self.begun, self.pending, self.cr = False, "", ""


def read_text(path: Path, w: Writer, stats: SourceStats, delimiter: str | None,
              on_bytes: Callable[[int], None] | None = None) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    sha = hashlib.sha256()
    conv = _TextConversation(w)
    offset = 0
    at_line_start = True
    block: list[str] = []  # decoded text not yet fed (fed per ~1 M characters or at a delimiter)
    block_chars = 0
    max_delimiter_line = len(delimiter.encode()) + 64 if delimiter is not None else 0

    def bad_utf8(e: UnicodeDecodeError, base: int) -> UsageError:
        return UsageError(f"{path} is not valid UTF-8: byte offset {base + e.start} (0x{e.object[e.start]:02x})",
                          "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8), or leave binary files out")

    with SourceFile(path, on_bytes) as f:

        def read_piece() -> tuple[bytes, bool]:  # (bytes, whether they end a line)
            raw = f.readline(_READ_CHUNK)
            return raw, raw.endswith(b"\n") or len(raw) < _READ_CHUNK

        while True:
            raw, complete = read_piece()
            if not raw:
                break
            while at_line_start and not complete and len(raw) <= max_delimiter_line:
                more, complete = read_piece()  # a line that could be the delimiter: read all of it
                raw += more
            sha.update(raw)
            buffered = len(decoder.getstate()[0])
            try:
                s = decoder.decode(raw)
            except UnicodeDecodeError as e:
                raise bad_utf8(e, offset - buffered) from None
            offset += len(raw)
            if delimiter is not None and at_line_start and complete and s.strip() == delimiter:
                conv.feed("".join(block))
                block, block_chars = [], 0
                conv.end()
            else:
                block.append(s)
                block_chars += len(s)
                if block_chars >= _READ_CHUNK:
                    conv.feed("".join(block))
                    block, block_chars = [], 0
            at_line_start = complete
        buffered = len(decoder.getstate()[0])
        try:
            block.append(decoder.decode(b"", final=True))
        except UnicodeDecodeError as e:
            raise bad_utf8(e, offset - buffered) from None
        conv.feed("".join(block))
        conv.end()
    stats.sha256, stats.bytes = sha.hexdigest(), offset
