"""Which files are not what their reader expects: a JSON array, pretty-printed JSON, JSON lines
under another name, or CSV/TSV given as plain text (and a JSON array or pretty JSON given as JSONL).

Read as plain text such a file builds without complaint and trains a model on brackets, quotes and
commas; `check_format` refuses it before anything is written, saying what the file looks like and
the command that reads it (or converts it). Every reader of a user's file goes through it: `corpus
build` and `eval --text` (through `expand_sources`) and `landscape --text`. `--format text` skips the
check for a file that really is text.

The verdict comes from the file's first SNIFF_BYTES and its name, never from the whole file, and
leans towards text: prose that opens with `[Enter Ghost]`, `[1] A note` or `{laughs}`, or that has
commas on every line, is still text. What counts as each format:
- a JSON array: the text opens with `[` and the elements that follow parse as JSON, separated by
  commas, up to the closing `]` (then only whitespace) or the end of the sniffed bytes;
- JSON lines: the first non-blank line is a whole JSON object (fine for the JSONL reader);
- pretty-printed JSON: an object that opens with `{` and a `"key":` and does not end on its line;
- CSV/TSV: a .csv/.tsv/.tab name, or the first CSV_SAMPLE_LINES lines (at least CSV_MIN_LINES, no
  blank line among them) all split into the same number (2 or more) of fields by `,`, tab or `;`,
  with something in every column (a tab-indented poem has nothing before its tabs), for `,` and
  `;` most cells not starting with a space (prose puts one after its commas; a CSV writer does
  not), and a first line of column names (a few short words each: prose opens with a sentence). A
  file shorter than CSV_SAMPLE_LINES also needs no empty cell. No stretch of 5, 8 or 20 lines of
  the built-in Shakespeare's markdown passes.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from catchat.errors import UsageError

SNIFF_BYTES = 1 << 16  # the head of a file that decides its format (a few hundred lines of text)
CSV_SUFFIXES = {".csv": ",", ".tsv": "\t", ".tab": "\t"}
CSV_DELIMITERS = {",": "comma", "\t": "tab", ";": "semicolon"}
CSV_SAMPLE_LINES = 20  # lines of a file (without a CSV name) whose fields are counted
CSV_MIN_LINES = 5  # fewer lines than this are never CSV by content: too little to tell from prose
CSV_HEADER_WORDS = 3  # column names are at most this many words (and 32 characters)
JSON_SUFFIXES = (".json",)

# `{` then a quoted key and a colon: how a JSON object opens (prose in braces does not); used when
# the object is longer than the sniffed bytes and cannot be parsed whole.
_JSON_OBJECT_START = re.compile(r'\{\s*"(?:[^"\\\n]|\\.)*"\s*:')
_WHITESPACE = " \t\r\n"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Finding:
    """What a file looks like and what to do about it (one line each)."""

    looks_like: str  # e.g. "a JSON array of objects"
    hint: str


def check_format(path: Path, kind: str) -> None:
    """Refuse (UsageError, exit 2) a file that the `kind` reader ("text" or "jsonl") would misread."""
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES + 1)
    except OSError:
        return  # the reader says what is wrong with it, in its words
    finding = detect(head[:SNIFF_BYTES], str(path), kind, complete=len(head) <= SNIFF_BYTES)
    if finding is not None:
        reader = "plain text" if kind == "text" else "JSON lines (one object per line)"
        raise UsageError(f"{path} looks like {finding.looks_like}, not {reader}", finding.hint)


def detect(head: bytes, name: str, kind: str, complete: bool) -> Finding | None:
    """The format `head` (a file's first bytes; `complete`: all of it) shows when `kind` ("text" or
    "jsonl") would read it, or None when that reader fits. Never raises: any bytes are an answer."""
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")  # the reader judges the bytes themselves
    body = text.lstrip(_WHITESPACE)
    suffix = Path(name).suffix.lower()
    force_text = "; or --format text to read it as plain text anyway" if kind == "text" else ""
    if body.startswith("["):
        is_array, sample = _json_array(body, complete)
        if is_array or suffix in JSON_SUFFIXES:
            what = _records(sample)
            recipe = (f"python -c \"import json,sys; [print(json.dumps({_record_expr(sample)})) "
                      f"for r in json.load(sys.stdin)]\" < {_q(name)} > {_q(_jsonl_name(name))}")
            return Finding(f"a JSON array{what}",
                           f"catchat reads JSONL, one conversation per line (docs/data.md): convert it with "
                           f"{recipe}, then read the .jsonl{force_text}")
    if body.startswith("{"):
        first_line, _, rest = body.partition("\n")
        first_line = first_line.strip()
        # a first line that opens and closes like one object is a JSON line even where json cannot read
        # it (nested past the parser's depth, a bad value): the JSONL reader says what is wrong with it
        one_line = _JSON_OBJECT_START.match(first_line) is not None and first_line.endswith("}")
        if _json_object(first_line) or one_line or (not rest and not complete and _JSON_OBJECT_START.match(body)):
            if kind == "jsonl":
                return None
            return Finding("JSON lines (its first line is a JSON object)",
                           f"read it as JSONL with --format jsonl (or name it {_jsonl_name(name)}){force_text}")
        if _JSON_OBJECT_START.match(body) or suffix in JSON_SUFFIXES:
            return Finding("pretty-printed JSON (an object spread over several lines)",
                           f"JSONL needs each conversation on one line: jq -c . {_q(name)} > {_q(_jsonl_name(name))} "
                           f"prints every object on one line (docs/data.md){force_text}")
    if kind == "text":
        return _csv_finding(text, suffix, name, complete)
    return None


def _json_array(body: str, complete: bool) -> tuple[bool, object]:
    """(whether `body` is a JSON array, its first element: None when empty or cut off). Walks the
    elements in order: each must parse and be followed by `,` or `]`, and after the `]` only
    whitespace may follow; the sniffed bytes may end anywhere in a file that is not `complete`."""
    i, n, first = 1, 0, None
    while True:
        i = _skip_space(body, i)
        if i >= len(body):
            return not complete and n > 0, first  # cut by the sniffed bytes between elements
        if body[i] == "]" and n == 0:
            return not body[i + 1:].strip(_WHITESPACE), None
        try:
            value, i = _DECODER.raw_decode(body, i)
        except (ValueError, RecursionError):
            # An element the sniffed bytes cut in two still opens like JSON; prose does not.
            opens = body[i] in '[{"' if n else _JSON_OBJECT_START.match(body, i) is not None
            return not complete and opens, first
        first = value if n == 0 else first
        n += 1
        i = _skip_space(body, i)
        if i >= len(body):
            return not complete, first
        if body[i] == "]":
            return not body[i + 1:].strip(_WHITESPACE), first
        if body[i] != ",":
            return False, None
        i += 1


def _skip_space(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WHITESPACE:
        i += 1
    return i


def _json_object(line: str) -> bool:
    if not line.startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):
        return False


def _records(sample: object) -> str:
    """' of objects' / ' of strings' / '': what the array's first element says about the rest."""
    if isinstance(sample, dict):
        return " of objects"
    if isinstance(sample, str):
        return " of strings"
    return ""


def _record_expr(sample: object) -> str:
    """A Python expression turning one array element `r` into a catchat JSONL record, from the first
    element's shape: a string is one speaker-less text; chat logs in the common `messages`
    (role/content) and `conversations` (from/value) shapes become turns; anything else is kept."""
    if isinstance(sample, str):
        return "{'text': r}"
    if isinstance(sample, dict):
        for key, speaker, text in (("messages", "role", "content"), ("conversations", "from", "value")):
            turns = sample.get(key)
            if isinstance(turns, list) and turns and isinstance(turns[0], dict) and text in turns[0]:
                return f"{{'turns': [{{'speaker': m['{speaker}'], 'text': m['{text}']}} for m in r['{key}']]}}"
    return "r"


def _csv_finding(text: str, suffix: str, name: str, complete: bool) -> Finding | None:
    delimiter, columns = CSV_SUFFIXES.get(suffix), None
    if delimiter is None:
        lines = text.splitlines(keepends=True)
        if not complete and lines:
            lines = lines[:-1]  # the last line may be cut by the sniffed bytes
        for d in CSV_DELIMITERS:
            columns = _csv_columns(lines[:CSV_SAMPLE_LINES], d)
            if columns:
                delimiter = d
                break
        if delimiter is None:
            return None
    word = CSV_DELIMITERS[delimiter]
    table = "TSV" if delimiter == "\t" else "CSV"
    looks = (f"{table} (named {suffix})" if columns is None else
             f"{table} ({columns} {word}-separated columns on each of its first lines, under column names)")
    reader = "csv.DictReader(sys.stdin" + ("" if delimiter == "," else f", delimiter={delimiter!r}") + ")"
    recipe = (f"python -c \"import csv,json,sys; [print(json.dumps({{'speaker': r['speaker'], 'text': r['text']}})) "
              f"for r in {reader}]\" < {_q(name)} > {_q(_jsonl_name(name))}")
    return Finding(looks, f"convert the rows to JSONL, one conversation per line (docs/data.md), e.g. {recipe} "
                          "(with your column names); or --format text to read it as plain text anyway")


def _csv_columns(lines: list[str], delimiter: str) -> int | None:
    """The number of fields every line has (quotes respected), when it is the same on all of them,
    2 or more, with at least CSV_MIN_LINES lines, no blank line and something in every column."""
    if len(lines) < CSV_MIN_LINES:
        return None
    try:
        rows = list(csv.reader(lines, delimiter=delimiter))
    except csv.Error:
        return None
    if len(rows) < CSV_MIN_LINES or any(not row for row in rows):
        return None
    widths = {len(row) for row in rows}
    if len(widths) != 1 or (width := widths.pop()) < 2:
        return None
    if any(not any(row[c].strip() for row in rows) for c in range(width)):
        return None
    later = [f for row in rows for f in row[1:]]
    if delimiter != "\t" and sum(f[:1].isspace() for f in later) * 2 > len(later):
        return None  # ", " after most commas: prose (a CSV writer puts nothing between a comma and the cell)
    if not all(_header_like(f) for f in rows[0]):
        return None  # a table of text starts with its column names; prose starts with a sentence
    if len(rows) < CSV_SAMPLE_LINES and not all(f.strip() for row in rows for f in row):
        return None  # a few lines of verse: a short file needs no empty cell too
    return width


def _header_like(field: str) -> bool:
    """A column name: a few short words ("speaker", "user id"), not a piece of a sentence."""
    words = field.split()
    return 0 < len(words) <= CSV_HEADER_WORDS and len(field.strip()) <= 32


def _jsonl_name(name: str) -> str:
    """Where a conversion writes: x.json -> x.jsonl (x.jsonl itself -> x-lines.jsonl)."""
    p = Path(name)
    return str(p.with_name(p.stem + "-lines.jsonl") if p.suffix.lower() in (".jsonl", ".ndjson")
               else p.with_suffix(".jsonl"))


def _q(path: str) -> str:
    return shlex.quote(path)
