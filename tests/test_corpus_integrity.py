"""Corpus integrity (issue 17, items 1 and 9), through the real CLI where a user would meet it.

`corpus build --force -o DIR` replaces only the corpus's own files, atomically (a build killed at
any point leaves the old corpus or the new one readable), and keeps every other file in DIR; an
output that is the current directory, one of its parents, a filesystem root or the home directory
is refused. Hostile JSONL (lone surrogates, 100,000-deep nesting, 5000-digit numbers, inf/NaN) gives
one error line naming the file and the line, never a traceback; the fuzz tests at the end
(hypothesis, derandomized, bounded: a few seconds each) check that no input does otherwise."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from catchat.data import corpus as corpus_mod
from catchat.data import vocab
from catchat.data.corpus import Corpus
from catchat.data.corpus import store as corpus_store
from catchat.errors import UsageError

from support import assert_clean_error, catchat

CORPUS_FILES = ["index.npy", "manifest.json", "tokens.bin"]  # a corpus's own files (docs/data.md)
SURROGATE = re.compile(r"[\ud800-\udfff]")


def texts(path) -> list[str]:
    c = Corpus.open(path)
    return [c.text(i, show_specials=False) for i in range(len(c))]


def info(path) -> str:
    """`catchat corpus info` output, its lines unwrapped (the console wraps at its width)."""
    r = catchat("corpus", "info", path)
    assert r.returncode == 0, r.stderr
    return " ".join(r.stdout.split())


def strict_json(path: Path):
    """The file parsed as standard JSON (NaN / Infinity refused: other tools cannot read them)."""
    def refuse(name):
        raise AssertionError(f"{path} holds {name}, not standard JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def snapshot(d: Path) -> dict:
    """Every file under d except the corpus's own: relative path -> (bytes, inode, mtime_ns)."""
    own = set(CORPUS_FILES)
    return {p.relative_to(d).as_posix(): (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(d.rglob("*")) if p.is_file() and not (p.parent == d and p.name in own)}


@pytest.fixture
def corpus_with_notes(tmp_path):
    """tmp_path/c: a corpus of old.txt plus the user's notes.txt and other/data.bin; new.txt beside it."""
    (tmp_path / "old.txt").write_text("the old corpus\n")
    (tmp_path / "new.txt").write_text("the new corpus, longer\n")
    r = catchat("corpus", "build", tmp_path / "old.txt", "-o", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    c = tmp_path / "c"
    (c / "notes.txt").write_text("my notes: do not lose\n")
    (c / "other").mkdir()
    (c / "other" / "data.bin").write_bytes(np.random.default_rng(0).bytes(5000))
    (c / ".hidden").write_text("dot files too\n")
    return c


# ------------------------------------------------------------------------------- --force (item 1)

def test_force_replaces_only_the_corpus_files(corpus_with_notes, tmp_path):
    c = corpus_with_notes
    before = snapshot(c)
    r = catchat("corpus", "build", tmp_path / "new.txt", "-o", c, "--force")
    assert r.returncode == 0, r.stderr
    assert snapshot(c) == before  # byte-identical, and not even rewritten (same inode, same mtime)
    assert texts(c) == ["the new corpus, longer"]
    assert sorted(p.name for p in c.iterdir()) == sorted([".hidden", "notes.txt", "other", *CORPUS_FILES])
    assert strict_json(c / "manifest.json")["sources"][0]["path"].endswith("new.txt")


def test_failed_force_build_keeps_everything(corpus_with_notes, tmp_path):
    c = corpus_with_notes
    before = snapshot(c)
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    assert_clean_error(catchat("corpus", "build", tmp_path / "bad.jsonl", "-o", c, "--force"), 2,
                       "bad.jsonl line 2: not valid JSON")
    assert snapshot(c) == before and texts(c) == ["the old corpus"]
    assert not [p for p in c.iterdir() if p.name.startswith(".catchat")]


def test_not_a_corpus_and_not_empty_is_still_refused(tmp_path):
    (tmp_path / "a.txt").write_text("hi\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    assert_clean_error(catchat("corpus", "build", tmp_path / "a.txt", "-o", tmp_path / "mine", "--force"), 2,
                       "output directory", "is not empty and is not a corpus")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("out,what", [(".", "the current directory"), ("..", "a parent of the current directory"),
                                      ("/", "a filesystem root"), ("HOME", "your home directory")])
def test_output_that_holds_other_things_is_refused(corpus_with_notes, tmp_path, out, what):
    """-o . from inside a corpus directory was `Device or resource busy` (a rename of the cwd)."""
    c = corpus_with_notes
    home = tmp_path / "home"
    home.mkdir()
    before, old = snapshot(c), (c / "tokens.bin").read_bytes()
    r = catchat("corpus", "build", tmp_path / "new.txt", "-o", home if out == "HOME" else out, "--force",
                cwd=c, env={"HOME": str(home)})
    assert_clean_error(r, 2, f"is {what} (", "a corpus needs a directory of its own", "fix: choose a new directory")
    assert snapshot(c) == before and (c / "tokens.bin").read_bytes() == old and not any(home.iterdir())


def test_output_dot_in_an_empty_directory_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("hi\n")
    (tmp_path / "empty").mkdir()
    r = catchat("corpus", "build", tmp_path / "a.txt", "-o", ".", cwd=tmp_path / "empty")
    assert_clean_error(r, 2, "output . is the current directory")


def test_an_empty_directory_is_built_in_place(tmp_path):
    (tmp_path / "a.txt").write_text("hi\n")
    (tmp_path / "empty").mkdir()
    assert catchat("corpus", "build", tmp_path / "a.txt", "-o", tmp_path / "empty").returncode == 0
    assert texts(tmp_path / "empty") == ["hi"]
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == CORPUS_FILES


# A `catchat corpus build` killed (SIGKILL: no cleanup runs) at a chosen point of the replacement.
_KILLED_BUILD = """
import os, signal, sys
from catchat.data.corpus import commit as corpus
point = sys.argv[1]
die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
if point == "before-commit":      # the new corpus is built in DIR/.catchat-build-<pid>, not committed
    corpus._fsync_files = die
else:                             # committed; killed after moving N files into place
    real, moved = os.replace, []
    def replace(a, b):
        if len(moved) == int(point):
            die()
        real(a, b)
        moved.append(b)
    os.replace = replace
from catchat.cli import main
main(sys.argv[2:])
"""


def killed_build(point, *args):
    r = subprocess.run([sys.executable, "-c", _KILLED_BUILD, point, *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)


def test_build_killed_before_commit_leaves_the_old_corpus(corpus_with_notes, tmp_path):
    c = corpus_with_notes
    before = snapshot(c)
    killed_build("before-commit", "corpus", "build", tmp_path / "new.txt", "-o", c, "--force")
    assert [p.name for p in c.iterdir() if p.name.startswith(".catchat-build-")]  # what a kill leaves
    assert texts(c) == ["the old corpus"]
    assert "1 conversations, 1 turns, 14 characters" in info(c)
    # the next build removes the dead build's directory and replaces the corpus
    assert catchat("corpus", "build", tmp_path / "new.txt", "-o", c, "--force").returncode == 0
    assert texts(c) == ["the new corpus, longer"] and snapshot(c) == before
    assert not [p for p in c.iterdir() if p.name.startswith(".catchat")]


@pytest.mark.parametrize("moved", [0, 1, 2])
def test_build_killed_after_commit_reads_as_the_new_corpus(corpus_with_notes, tmp_path, monkeypatch, moved):
    """Killed with `moved` of the three files moved in: old files sit beside new ones at the top of
    DIR, yet every reader gets the new corpus whole, and the first one that can write finishes the move."""
    c = corpus_with_notes
    before = snapshot(c)
    killed_build(str(moved), "corpus", "build", tmp_path / "new.txt", "-o", c, "--force")
    assert (c / ".catchat-commit").is_dir()
    def read_only(path):
        raise PermissionError(13, "Read-only file system")
    with monkeypatch.context() as m:  # a reader that cannot write here (a read-only mount) reads it where it is
        m.setattr(corpus_store, "finish_replacement", read_only)
        assert texts(c) == ["the new corpus, longer"]
    assert (c / ".catchat-commit").is_dir()
    assert "1 conversations, 1 turns, 22 characters" in info(c)  # a reader that can write finishes the move first
    assert not (c / ".catchat-commit").exists() and snapshot(c) == before
    m = strict_json(c / "manifest.json")
    assert (c / "tokens.bin").stat().st_size == m["tokens"] and texts(c) == ["the new corpus, longer"]


def test_build_killed_after_commit_is_finished_by_the_next_build(corpus_with_notes, tmp_path):
    c = corpus_with_notes
    killed_build("1", "corpus", "build", tmp_path / "new.txt", "-o", c, "--force")
    assert_clean_error(catchat("corpus", "build", tmp_path / "old.txt", "-o", c), 2, "already exists", "--force")
    assert not (c / ".catchat-commit").exists() and texts(c) == ["the new corpus, longer"]


# ------------------------------------------------------------------------------ hostile JSONL (item 9)

GOOD = '{"text": "a fine first line"}\n'
SURROGATE_FIX = "fix: a \\ud800-\\udfff escape is half of a UTF-16 pair and needs its other half"


@pytest.mark.parametrize("line,message,fix", [
    ('{"text": "\\ud800"}', 'line 2: "text" holds a lone surrogate \\ud800 (character 0), not a Unicode character',
     SURROGATE_FIX),
    ('{"text": "ok \\ude00\\ud83d reversed"}', 'line 2: "text" holds a lone surrogate \\ude00 (character 3)',
     SURROGATE_FIX),
    ('{"speaker": "\\udc00", "text": "hi"}', 'line 2: "speaker" holds a lone surrogate \\udc00', SURROGATE_FIX),
    ('{"turns": [{"speaker": "A", "text": "hi"}, {"speaker": "B\\udbff", "text": "yo"}]}',
     'line 2: turns[1]."speaker" holds a lone surrogate \\udbff (character 1)', SURROGATE_FIX),
    ('{"turns": [{"text": "x\\udfff"}]}', 'line 2: turns[0]."text" holds a lone surrogate \\udfff', SURROGATE_FIX),
    ("[" * 100_000 + "]" * 100_000, "line 2: JSON nested too deeply (more than ~", "fix: each line is"),
    ('{"a":' * 100_000 + "1" + "}" * 100_000, "line 2: JSON nested too deeply", "fix: each line is"),
    ('{"text": "hi", "n": ' + "7" * 5000 + "}", "line 2: a number with more than 4300 digits",
     "fix: write such a value as a string, or leave it out"),
    ('{"text": -' + "1" * 4301 + "}", "line 2: a number with more than 4300 digits", "fix: write such a value"),
    ('{"text": NaN}', 'line 2: "text" must be a string', "fix: each line is"),
], ids=["surrogate", "reversed-pair", "speaker", "turn-speaker", "turn-text", "deep-arrays", "deep-objects",
        "5000-digits", "negative-4301-digits", "nan-text"])
def test_hostile_jsonl_is_one_clean_error(tmp_path, line, message, fix):
    (tmp_path / "h.jsonl").write_text(GOOD + line + "\n", encoding="utf-8")
    err = assert_clean_error(catchat("corpus", "build", tmp_path / "h.jsonl", "-o", tmp_path / "out"), 2,
                             f"error: {tmp_path / 'h.jsonl'} {message}", fix)
    assert len(err.strip().splitlines()) == 2
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_odd_but_valid_json_values_build(tmp_path):
    """Huge floats, NaN and Infinity literals, 4300-digit numbers and a proper surrogate pair are
    readable JSON; where they are not the text they are ignored, and the manifest stays standard JSON."""
    lines = ['{"text": "hi", "x": 1e999, "y": NaN, "z": -Infinity, "w": Infinity}',
             '{"text": "ok", "n": ' + "9" * 4300 + ', "conversation": 1}',
             '{"text": "cat \\ud83d\\ude00", "speaker": "A"}',
             '{"turns": [{"text": "deep but fine"}], "extra": ' + "[" * 200 + "]" * 200 + "}"]
    (tmp_path / "v.jsonl").write_text("\n".join(lines) + "\n")
    r = catchat("corpus", "build", tmp_path / "v.jsonl", "-o", tmp_path / "out", "--max-unk-rate", "0.2")
    assert r.returncode == 0, r.stderr
    assert texts(tmp_path / "out") == ["hi", "ok", "A: cat \ufffd", "deep but fine"]
    strict_json(tmp_path / "out" / "manifest.json")


@pytest.mark.parametrize("depth", [900, 960, 975, 985, 995])
def test_hostile_chat_provenance_values(tmp_path, depth):
    """A `catchat chat` line's checkpoint fields go into the manifest: deep nesting there (that
    json.loads still reads) crashed the manifest's json.dumps, and 1e999 wrote `Infinity` into it."""
    nest = "[" * depth + "]" * depth
    lines = ['{"format": "catchat-chat", "conversation": "c1", "speaker": "A", "text": "hello", '
             '"checkpoint": {"path": ' + nest + ', "global_step": 1e999, "vocab_fingerprint": NaN}}',
             '{"format": "catchat-chat", "conversation": "c1", "speaker": ' + nest.replace("[]", "[1]", 1) + ', '
             '"turns": [{"speaker": "B", "text": "hi"}], "checkpoint": {"path": "/ck", "global_step": 7}}']
    (tmp_path / "chat.jsonl").write_text("\n".join(lines) + "\n")
    r = catchat("corpus", "build", tmp_path / "chat.jsonl", "-o", tmp_path / "out")
    if r.returncode != 0:  # this Python's parser stops short of `depth`: refused cleanly
        assert_clean_error(r, 2, "chat.jsonl line ", "nested too deeply")
        return
    m = strict_json(tmp_path / "out" / "manifest.json")
    syn = m["sources"][0]["synthetic"]
    assert syn["conversations"] == 1 and syn["turns"] == 2
    none = {"path": None, "global_step": None, "vocab_fingerprint": None}
    assert syn["checkpoints"] == [dict(none, speakers=["A"], turns=1),
                                  dict(none, path="/ck", global_step=7, speakers=[None], turns=1)]


def test_plain_text_with_surrogate_bytes_is_refused_cleanly(tmp_path):
    """Plain text is decoded as strict UTF-8: an encoded surrogate (CESU-8 / WTF-8) is invalid."""
    (tmp_path / "s.txt").write_bytes(b"fine text\nab\xed\xa0\x80cd\n")
    assert_clean_error(catchat("corpus", "build", tmp_path / "s.txt", "-o", tmp_path / "out"), 2,
                       "s.txt is not valid UTF-8: byte offset 12 (0xed)", "fix: convert it to UTF-8")
    (tmp_path / "lit.txt").write_text('a literal "\\ud800" is just text\n')
    assert catchat("corpus", "build", tmp_path / "lit.txt", "-o", tmp_path / "lit").returncode == 0
    assert texts(tmp_path / "lit") == ['a literal "\\ud800" is just text']


# ------------------------------------------------------------------------------------ fuzzing

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SECONDS_PER_BUILD = 10.0  # each build takes milliseconds; this only catches a hang or a blow-up


def build_or_refuse(data: bytes, name: str = "x.jsonl") -> dict | None:
    """Build one source in-process: the corpus's manifest, or None after checking the refusal.
    Anything but a clear UsageError (a traceback to the user) fails the test."""
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / name, Path(d) / "out"
        src.write_bytes(data)
        t0 = time.monotonic()
        try:
            corpus_mod.build([src], out, max_unk_rate=1.0)
        except UsageError as e:
            assert e.exit_code == 2 and e.message and "\n" not in e.message and e.hint, repr(e)
            assert str(src) in e.message, e.message
            assert not out.exists() and sorted(os.listdir(d)) == [name]
            # what was refused, for pytest --hypothesis-show-statistics
            event("refused: " + re.sub(r"\d+", "N", e.message.replace(str(src), "FILE"))[:48])
            return None
        finally:
            assert time.monotonic() - t0 < SECONDS_PER_BUILD
        event("built")
        c = Corpus.open(out)
        tokens, starts, lengths = np.asarray(c.tokens), c.starts, c.lengths
        assert tokens.max() < vocab.VOCAB_SIZE and (lengths >= 2).all()
        assert (tokens[starts] == vocab.BOS).all() and (tokens[starts + lengths - 1] == vocab.EOS).all()
        return strict_json(out / corpus_mod.MANIFEST_FILE)


SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
HOSTILE_TEXT = st.lists(st.one_of(st.characters(), SURROGATES), max_size=12).map("".join)
SCALARS = (st.none() | st.booleans() | st.integers()  # big integers: BIG_INT below, as text
           | st.floats(allow_nan=True, allow_infinity=True) | HOSTILE_TEXT)
JSON_VALUES = st.recursive(SCALARS, lambda inner: (st.lists(inner, max_size=3)
                                                  | st.dictionaries(HOSTILE_TEXT, inner, max_size=3)), max_leaves=10)


def encode(value, ascii_only: bool) -> bytes:
    """A JSONL line of `value`: surrogates escaped (\\udXXX, valid JSON) or raw (invalid UTF-8);
    NaN / Infinity as Python writes them."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def nested(depth: int, kind: str, leaf: str) -> str:
    if kind == "array":
        return "[" * depth + leaf + "]" * depth
    if kind == "object":
        return '{"k":' * depth + leaf + "}" * depth
    return "[" * depth  # cut short: unbalanced


DEEP = st.builds(nested, st.integers(1, 100_000), st.sampled_from(["array", "object", "open"]),
                 st.sampled_from(["1", '"x"', "null", ""]))
BIG_INT = st.builds(lambda sign, n, d: sign + d * n, st.sampled_from(["", "-"]), st.integers(4000, 6000),
                    st.sampled_from("123456789"))
RAW_VALUE = st.one_of(JSON_VALUES.map(lambda v: encode(v, True).decode()), DEEP, BIG_INT,
                      SURROGATES.map(lambda c: json.dumps(c)),
                      st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999", '"\\u0000"']))
# a hostile value dropped into each place a record reads
TEMPLATES = ['{"text": V}', '{"text": "hi", "speaker": V}', '{"text": "hi", "other": V}', 'V',
             '{"turns": [{"speaker": V, "text": "hi"}]}', '{"turns": [{"speaker": "A", "text": V}]}', '{"turns": V}',
             '{"text": "hi", "conversation": V}',
             '{"format": "catchat-chat", "conversation": "c", "speaker": V, "text": "hi", "checkpoint": {"path": V}}',
             '{"format": "catchat-chat", "text": "hi", '
             '"checkpoint": {"path": "p", "global_step": V, "vocab_fingerprint": V}}']
LINES = st.one_of(st.builds(lambda t, v: t.replace("V", v).encode(), st.sampled_from(TEMPLATES), RAW_VALUE),
                  st.builds(lambda t, v: t.encode().replace(b"V", encode(v, False)), st.sampled_from(TEMPLATES),
                            JSON_VALUES),
                  st.just(b'{"text": "a plain good line"}'))


@FUZZ
@given(st.lists(LINES, min_size=1, max_size=5))
def test_fuzz_hostile_jsonl_lines(lines):
    """Deep nesting, huge numbers, surrogates and arbitrary JSON in every field: a valid corpus
    (with a standard-JSON manifest), or one clear error naming the file, in bounded time."""
    build_or_refuse(b"\n".join(lines) + b"\n")


@FUZZ
@given(st.lists(st.fixed_dictionaries({"text": HOSTILE_TEXT}, optional={"speaker": HOSTILE_TEXT | st.none()}),
                min_size=1, max_size=6), st.booleans())
def test_fuzz_surrogates_in_text_and_speaker(records, ascii_only):
    """Text and speakers with surrogates, escaped (valid JSON; an adjacent high + low pair reads
    as one character) or raw (invalid UTF-8): refused exactly when one is left unpaired or the
    bytes are not UTF-8 (or no record has text), else built."""
    lines = [encode(r, ascii_only) for r in records]
    manifest = build_or_refuse(b"\n".join(lines) + b"\n")

    def unpaired(line: bytes) -> bool:
        try:
            r = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            return True
        return bool(SURROGATE.search(r["text"] + (r.get("speaker") or "")))
    assert (manifest is None) == (any(map(unpaired, lines)) or not any(r["text"].strip() for r in records))
