"""Reader: JSONL dialogue, one conversation per record (or per run of records sharing "conversation")."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from catchat.data.corpus.writer import SourceFile, SourceStats, Writer
from catchat.errors import UsageError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
MAX_JSONL_LINE_BYTES = 64 << 20  # a JSONL record is decoded whole: longer lines are refused

_JSONL_HINT = 'each line is {"turns": [{"speaker": "A", "text": "..."}, ...]} or {"text": "..."}'
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # json.loads lets a lone "\\ud800" escape through
_SURROGATE_HINT = ("a \\ud800-\\udfff escape is half of a UTF-16 pair and needs its other half "
                   "(e.g. \\ud83d\\ude00 for U+1F600): fix the tool that wrote the file")


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


def read_jsonl(path: Path, w: Writer, stats: SourceStats, on_bytes: Callable[[int], None] | None = None) -> None:
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

    with SourceFile(path, on_bytes) as f:
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
