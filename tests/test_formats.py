"""Files in the wrong format (issue 34 item 4): a JSON array, pretty-printed JSON, JSON lines under
another name and CSV/TSV are refused by `corpus build`, `eval --text` and `landscape --text` (exit 2,
what the file looks like and how to convert it, nothing written), while prose with commas and
brackets is read as text; `--format text` reads any of them as text. The <unk> report names the
characters. And the progress of a long command (issue 34 item 5): plain lines with an ETA when piped."""

import io
import json

import pytest
from rich.console import Console

from catchat import progress as progress_mod
from catchat.data import corpus as corpus_mod
from catchat.data import vocab
from catchat.data.corpus import detect
from catchat.errors import UsageError

from support import assert_clean_error, catchat, make_tiny_run

ROWS = [("ALICE", "Where is the cat?"), ("BOB", "Asleep on the mat, as ever."), ("ALICE", "Then let it sleep.")] * 3
RECORDS = [{"turns": [{"speaker": s, "text": t}]} for s, t in ROWS]

# name, content, what the error must say (the file's look and the hint's recipe)
WRONG = [
    ("chats.json", json.dumps(RECORDS), ["looks like a JSON array of objects, not plain text",
                                         "json.load(sys.stdin)", "chats.jsonl", "--format text"]),
    ("chats.txt", json.dumps(RECORDS, indent=2), ["looks like a JSON array of objects", "chats.jsonl"]),
    ("openai.json", json.dumps([{"messages": [{"role": "user", "content": "hi"}]}]),
     ["JSON array of objects", "m['role']", "m['content']"]),
    ("lines.json", json.dumps(["one text", "another"]), ["JSON array of strings", "{'text': r}"]),
    ("pretty.json", "\n".join(json.dumps(r, indent=2) for r in RECORDS),
     ["looks like pretty-printed JSON", "jq -c . ", "pretty.jsonl"]),
    ("pretty.txt", json.dumps(RECORDS[0], indent=1), ["looks like pretty-printed JSON"]),
    ("chats.txt", "".join(json.dumps(r) + "\n" for r in RECORDS),
     ["looks like JSON lines (its first line is a JSON object), not plain text", "--format jsonl"]),
    ("chats.csv", "speaker,text\n" + "".join(f'{s},"{t}"\n' for s, t in ROWS),
     ["looks like CSV (named .csv)", "csv.DictReader(sys.stdin)", "chats.jsonl"]),
    ("chats.tsv", "speaker\ttext\n" + "".join(f"{s}\t{t}\n" for s, t in ROWS),
     ["looks like TSV (named .tsv)", "delimiter='\\t'"]),
    ("export.txt", "speaker,text\n" + "".join(f'{s},"{t}"\n' for s, t in ROWS),
     ["looks like CSV (2 comma-separated columns on each of its first lines, under column names)"]),
    ("table.txt", "id\tspeaker\ttext\n" + "".join(f"{i}\t{s}\t{t}\n" for i, (s, t) in enumerate(ROWS * 3)),
     ["looks like TSV (3 tab-separated columns", "delimiter='\\t'"]),
]

# Prose that must still be text: brackets, braces, commas on every line, a JSON-looking word.
PROSE = {
    "aside.txt": "[Enter HAMLET]\nHAMLET: To be, or not to be, that is the question:\n[Aside] Whether 'tis nobler,\n",
    "note.txt": "[1] A note, with commas, and more.\nThe text, as it was, goes on.\n",
    "braces.txt": "{laughs} Oh, hello, you.\nAnd then, again, {sighs}.\n",
    "verse.txt": ("Shall I compare thee to a summer's day?\nThou art more lovely, and more temperate:\n"
                  "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n"
                  "Sometime too hot the eye of heaven shines,\nAnd often is his gold complexion dimm'd;\n"),
    "repeated.txt": "The quick brown fox jumps over the lazy dog, again and again.\n" * 40,
    "list.txt": '["Hello," she said, "and welcome."]\nHe nodded.\n',
    "brackets.txt": "[not json at all, just words]\n",
    "indented.txt": "".join(f"\tline {i}, indented\n" for i in range(25)),
    "tabbed.txt": "And the rest is plain.\tTab.\n" * 25,
    "headless.txt": "".join(f"{s},{t}\n" for s, t in ROWS) * 3,  # a table without column names: text
}


def nothing_written(tmp_path):
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("name,content,needles", WRONG, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRONG)])
def test_wrong_formats_are_refused_by_corpus_build(tmp_path, name, content, needles):
    (tmp_path / name).write_text(content)
    r = catchat("corpus", "build", tmp_path / name, "-o", tmp_path / "out")
    assert_clean_error(r, 2, f"{name} looks like", *needles)
    nothing_written(tmp_path)
    forced = corpus_mod.build([tmp_path / name], tmp_path / "out", fmt="text")  # the user's word: read it as text
    assert forced.conversations == 1


def test_wrong_formats_in_memory_and_in_directories(tmp_path):
    """The one check (`detect.check_format`) behind every reader: read_conversations (eval --text),
    build of a directory (the file named), and --format jsonl on a JSON array."""
    for i, (name, content, needles) in enumerate(WRONG):
        d = tmp_path / f"d{i}"
        d.mkdir()
        (d / "fine.txt").write_text("Plain text.\n")
        (d / name).write_text(content)
        with pytest.raises(UsageError) as e:
            corpus_mod.read_conversations(d / name)
        assert needles[0] in e.value.message
        with pytest.raises(UsageError) as e:
            corpus_mod.build([d], tmp_path / "out")
        assert e.value.message.startswith(f"{d / name} looks like") and e.value.exit_code == 2
        nothing_written(tmp_path)
    (tmp_path / "a.jsonl").write_text(json.dumps(RECORDS))
    r = catchat("corpus", "build", tmp_path / "a.jsonl", "-o", tmp_path / "out")
    assert_clean_error(r, 2, "looks like a JSON array of objects, not JSON lines (one object per line)",
                       "a-lines.jsonl")
    (tmp_path / "b.txt").write_text(json.dumps(RECORDS, indent=2))
    r = catchat("corpus", "build", tmp_path / "b.txt", "-o", tmp_path / "out", "--format", "jsonl")
    assert_clean_error(r, 2, "looks like a JSON array")
    nothing_written(tmp_path)


def test_prose_with_commas_and_brackets_is_text(tmp_path):
    for name, text in PROSE.items():
        (tmp_path / name).write_text(text)
        assert detect.detect(text.encode(), name, "text", complete=True) is None, name
    summary = corpus_mod.build([tmp_path / n for n in PROSE], tmp_path / "out", delimiter=None)
    assert summary.conversations == len(PROSE)


def test_the_built_in_corpus_is_text(tmp_path):
    """No play of the built-in corpus, as markdown or as the text of its conversations, looks like JSON or CSV."""
    for f in corpus_mod.shakespeare_files():
        assert detect.detect(f.read_bytes(), "play.txt", "text", complete=True) is None, f
    convs = corpus_mod.read_conversations("shakespeare")
    text = vocab.decode(convs.tokens[:200_000])
    assert detect.detect(text.encode()[:detect.SNIFF_BYTES], "plays.txt", "text", complete=False) is None


def test_a_long_json_array_is_told_from_its_head(tmp_path):
    """Only the first SNIFF_BYTES are read: an array cut there (in an element or between two) is
    still an array, a line of prose that opens with '[' is not."""
    big = json.dumps([{"text": "x" * 1000} for _ in range(200)]).encode()
    assert len(big) > detect.SNIFF_BYTES
    for cut in (detect.SNIFF_BYTES, 1001, 1500, 20):
        assert detect.detect(big[:cut], "a.txt", "text", complete=False) is not None, cut
    prose = ("[Enter the KING, with attendants.] " + "Words, words, words. " * 5000).encode()
    assert detect.detect(prose[:detect.SNIFF_BYTES], "a.txt", "text", complete=False) is None


def test_eval_and_landscape_refuse_the_same_files(cli, dev, tmp_path_factory, tmp_path):
    run = make_tiny_run(tmp_path_factory.mktemp("fmt"), dev)
    name, content, needles = WRONG[0]
    (tmp_path / name).write_text(content)
    for args in (("eval", run, "--text", tmp_path / name), ("landscape", run, "--text", tmp_path / name,
                                                             "--out", tmp_path / "land")):
        code, out, err = cli(*args)
        assert code == 2 and "Traceback" not in err, err
        for n in needles:
            assert n in err, (n, err)
    assert not (tmp_path / "land").exists()
    code, _, err = cli("landscape", run, "--format", "text")
    assert code == 2 and "--format says how to read --text" in err, err


# ------------------------------------------------------------------------ characters outside cc101
def test_unknown_characters_are_named(cli, dev, tmp_path_factory, tmp_path):
    text = ("The \u00e6ther, the \u00e6on and the \u00e6gis; caf\u00e9.\n" * 4 + "A zero\x00 byte.\n"
            + "Plain words.\n" * 30)
    (tmp_path / "ae.txt").write_text(text)
    r = catchat("corpus", "build", tmp_path / "ae.txt", "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "(17 characters outside cc101: \u00e6 U+00E6 x12, \u00e9 U+00E9 x4, U+0000 x1)" in r.stdout, r.stdout
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["unk_chars"] == {"\u00e6": 12, "\u00e9": 4, "\x00": 1}
    assert "U+00E6 x12" in catchat("corpus", "info", tmp_path / "out").stdout
    run = make_tiny_run(tmp_path_factory.mktemp("unk"), dev)
    code, out, err = cli("eval", run, "--text", tmp_path / "ae.txt", "--json")
    assert code == 0, err
    assert any(n.endswith("\u00e6 U+00E6 x12, \u00e9 U+00E9 x4, U+0000 x1") for n in json.loads(out)["notes"])
    many = "".join(chr(0x400 + i) * (20 - i) for i in range(8)) + "plain" * 400
    (tmp_path / "many.txt").write_text(many)
    r = catchat("corpus", "build", tmp_path / "many.txt", "-o", tmp_path / "out2", "--max-unk-rate", "0.01")
    assert_clean_error(r, 2, "most often \u0400 U+0400 x20, \u0401 U+0401 x19, \u0402 U+0402 x18, "
                             "\u0403 U+0403 x17, \u0404 U+0404 x16 and 3 more")


def test_unknown_characters_of_a_prompt():
    """What `catchat sample` names for its prompt: characters left after normalisation (curly quotes,
    tabs and dashes are not <unk>), an invisible one by its code point alone."""
    unk = vocab.unknown_characters("\u201cS\u00f8ren\u201d\t\u2014 \u00f8\u200d!")
    assert unk == {"\u00f8": 2, "\u200d": 1}
    assert vocab.describe_unknown(unk) == "\u00f8 U+00F8 x2, U+200D x1"
    assert vocab.describe_unknown(unk, top=1) == "\u00f8 U+00F8 x2 and 1 more"


# ------------------------------------------------------------------------------------ progress
class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def plain_progress(total, unit="windows"):
    buf = io.StringIO()
    clock = Clock()
    bar = progress_mod.Progress(Console(file=buf, width=200), "eval", unit, live=False, now=clock)
    bar.start(total)
    return bar, clock, buf


def test_plain_progress_lines():
    """Piped: nothing for the first PLAIN_AFTER_S, then a line per tenth of the work (and at least
    every PLAIN_EVERY_S), each with the ETA from the rate so far, and one at the end."""
    bar, clock, buf = plain_progress(40)
    for i in range(40):
        clock.t = (i + 1) * 1.0  # 1 s per window on the test's clock
        bar.advance()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "eval: 5/40 windows (12%), 0:05 elapsed, eta 0:35"
    assert lines[1] == "eval: 8/40 windows (20%), 0:08 elapsed, eta 0:32"
    assert lines[-1] == "eval: 40/40 windows (100%), 0:40 elapsed"
    assert len(lines) == 10  # 5, then 8, 12, 16, ..., 36, 40: every 4 windows after the quiet start
    quick, clock, buf = plain_progress(40)
    for _ in range(40):
        quick.advance()  # all of it within PLAIN_AFTER_S: no line at all
    assert buf.getvalue() == ""
    slow, clock, buf = plain_progress(1000)
    for _ in range(3):
        clock.t += progress_mod.PLAIN_EVERY_S + 1  # each unit slower than PLAIN_EVERY_S: a line per unit
        slow.advance()
    assert buf.getvalue().splitlines()[-1] == "eval: 3/1,000 windows (0%), 1:33 elapsed, eta 8:35:07"
    assert len(buf.getvalue().splitlines()) == 3
    mib, clock, buf = plain_progress(10 << 20, "bytes")
    clock.t = 10.0
    mib.advance(1 << 20)
    assert buf.getvalue() == "eval: 1.0/10.0 MiB (10%), 0:10 elapsed, eta 1:30\n"


def test_piped_eval_prints_progress_and_json_stays_clean(cli, dev, tmp_path_factory, tmp_path, monkeypatch):
    run = make_tiny_run(tmp_path_factory.mktemp("progress"), dev)
    (tmp_path / "long.txt").write_text("The cat sat on the mat, and the dog sat by the door.\n" * 6)
    monkeypatch.setattr(progress_mod, "PLAIN_AFTER_S", 0.0)  # a tiny eval is quick: show its lines at once
    code, out, err = cli("eval", run, "--text", tmp_path / "long.txt", "--json", "--lanes", "1")
    assert code == 0, err
    res = json.loads(out)  # stdout: the JSON object alone
    lines = [x for x in err.splitlines() if x.startswith("eval: ")]
    assert res["windows"] >= 10 and len(lines) >= 5, err
    assert lines[0].startswith(f"eval: 1/{res['windows']} windows (") and "elapsed, eta " in lines[0]
    assert lines[-1].startswith(f"eval: {res['windows']}/{res['windows']} windows (100%)")
