"""Fuzzing (issue 8) with hypothesis, bounded in time (the whole file: well under 60 s): the corpus
readers, the config loader and the checkpoint state reader take arbitrary input and either work or
raise one clear UsageError (one message line, a fix line, exit code 2), never anything else."""

import json
import string
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catchat import config as cfgmod
from catchat.data import corpus as corpus_mod
from catchat.data import vocab
from catchat.data.corpus import Corpus, detect
from catchat.data.corpus import text as corpus_text
from catchat.errors import UsageError
from catchat.run import checkpoint as ck

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True, database=None)  # the same examples every run: CI stays reproducible


def clear(e: UsageError) -> None:
    assert e.exit_code == 2 and e.message and "\n" not in e.message and e.hint, repr(e)


def build_or_refuse(data: bytes, name: str, **kw):
    """Build a corpus from one source; returns the opened Corpus or None (after checking the refusal)."""
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / name
        src.write_bytes(data)
        try:
            corpus_mod.build([src], Path(d) / "out", **kw)
        except UsageError as e:
            clear(e)
            assert not (Path(d) / "out").exists()
            return None
        c = Corpus.open(Path(d) / "out")
        tokens = np.asarray(c.tokens).copy()
        starts, lengths = c.starts.copy(), c.lengths.copy()
    assert tokens.max() < vocab.VOCAB_SIZE and (lengths >= 2).all()
    assert (tokens[starts] == vocab.BOS).all() and (tokens[starts + lengths - 1] == vocab.EOS).all()
    return tokens


# --------------------------------------------------------------------------------------- corpus readers

@FAST
@given(st.binary(max_size=3000))
def test_text_reader_arbitrary_bytes(data):
    build_or_refuse(data, "x.txt", max_unk_rate=1.0)


TEXTISH = st.lists(st.sampled_from(list(string.printable) + ["\r\n", "\u00e9", "\u2019", "\u4e2d", "\x00",
                                                              "<|endoftext|>\n", "\ud7ff", "\U0001F600"]),
                   max_size=300).map("".join)


@FAST
@given(TEXTISH, st.integers(1, 9))
def test_text_reader_is_independent_of_read_sizes(text, chunk):
    """However the file is cut into reads (multibyte characters, CRLF and delimiter lines split), the
    tokens are the same."""
    data = text.encode("utf-8")
    whole = build_or_refuse(data, "x.txt", max_unk_rate=1.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(corpus_text, "_READ_CHUNK", chunk)
        pieces = build_or_refuse(data, "x.txt", max_unk_rate=1.0)
    assert (whole is None) == (pieces is None)
    if whole is not None:
        assert np.array_equal(whole, pieces)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                           | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
RECORDS = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries({"text": st.text(max_size=40)},
                          optional={"speaker": st.none() | st.text(max_size=8) | st.integers()}),
    st.fixed_dictionaries({"turns": st.lists(st.fixed_dictionaries({"text": st.text(max_size=30) | st.integers()},
                                                                    optional={"speaker": st.text(max_size=6)}),
                                             max_size=4)},
                          optional={"conversation": st.integers(0, 3) | st.text(max_size=3) | st.floats()}),
)


@FAST
@given(st.lists(st.one_of(RECORDS.map(lambda r: json.dumps(r).encode()), st.binary(max_size=30)), max_size=8))
def test_jsonl_reader_arbitrary_lines(lines):
    """Any mix of records, other JSON values and raw bytes: a corpus, or an error naming the line."""
    data = b"\n".join(lines)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "x.jsonl"
        src.write_bytes(data)
        try:
            corpus_mod.build([src], Path(d) / "out", max_unk_rate=1.0)
        except UsageError as e:
            clear(e)
            assert "line " in e.message or "x.jsonl" in e.message


# --------------------------------------------------------------------------------- format detection

FORMATISH = st.lists(st.sampled_from(["[", "]", "{", "}", '"', ",", ":", "\t", ";", "\n", " ", "\r\n", "text",
                                      '"text": ', "A", "1", "-", "null", "\\", "\ufeff", "\u00e6", "[Aside]"]),
                     max_size=200).map("".join)
DOCUMENTS = st.one_of(
    st.binary(max_size=2000),
    FORMATISH.map(str.encode),
    st.tuples(st.lists(RECORDS, max_size=5), st.sampled_from([None, 0, 2])).map(
        lambda v: json.dumps(v[0], indent=v[1]).encode()),  # arrays, pretty or not
    st.lists(RECORDS, max_size=5).map(lambda rs: "".join(json.dumps(r, indent=1) + "\n" for r in rs).encode()),
    st.lists(st.lists(st.text(string.ascii_letters + " ,\"", max_size=8), min_size=1, max_size=4),
             max_size=25).map(lambda rows: "".join(",".join(r) + "\n" for r in rows).encode()),  # CSV-ish
)
NAMES = st.sampled_from(["x.txt", "x.json", "x.csv", "x.tsv", "x.jsonl", "x", "x.md"])


@FAST
@given(DOCUMENTS, NAMES, st.sampled_from(["text", "jsonl"]), st.booleans(), st.integers(0, 2000))
def test_format_detection_any_head(data, name, kind, complete, cut):
    """Any bytes, whole or cut anywhere (a file's head): an answer, never an exception, and a
    finding is one line of what the file looks like and one line of what to do."""
    head = data if complete else data[:cut]
    f = detect.detect(head, name, kind, complete)
    assert f is None or (f.looks_like and f.hint and "\n" not in f.looks_like + f.hint)


@FAST
@given(DOCUMENTS, NAMES)
def test_format_refusals_write_nothing(data, name):
    """Through a build: a corpus, or one clear UsageError and no output (build_or_refuse checks both)."""
    build_or_refuse(data, name, max_unk_rate=1.0)


# ----------------------------------------------------------------------------------------- config

KEYS = [(s, k) for s, keys in cfgmod.key_specs().items() for k in keys]
VALUES = st.one_of(st.integers(-5, 10**7), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                   st.text(max_size=12), st.lists(st.integers(), max_size=2),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=1))


@FAST
@given(st.dictionaries(st.sampled_from(KEYS) | st.tuples(st.text(max_size=8), st.text(max_size=8)), VALUES, max_size=8))
def test_config_from_arbitrary_values(items):
    """Known and unknown keys with values of any type: a valid Config, or one clear error."""
    data: dict = {"train": {"total_steps": 5}}  # so that valid configs come up too
    for (section, key), value in items.items():
        data.setdefault(section, {})[key] = value
    try:
        cfg = cfgmod.from_dict(data)
    except UsageError as e:
        clear(e)
        return
    assert cfgmod.loads(cfgmod.resolved_toml(cfg)) == cfg  # whatever is accepted round-trips


@FAST
@given(st.text(max_size=300))
def test_config_loader_arbitrary_text(text):
    try:
        cfg = cfgmod.loads(text)
    except UsageError as e:
        clear(e)
    else:  # what loads writes back to the same config (the run dir's config.toml)
        assert cfgmod.loads(cfgmod.resolved_toml(cfg)) == cfg


TOML_LINES = st.lists(st.one_of(
    st.sampled_from(["[model]", "[data]", "[train]", "[schedule]", "[eval]", "[checkpoint]", "[teacher_forcing]",
                     "[trian]", "total_steps = 10", "[[train]]", "x.y = 1"]),
    st.builds(lambda k, v: f"{k} = {v}", st.sampled_from([k for _, k in KEYS] + ["lrr", "hiden"]),
              st.sampled_from(["0", "-1", "1e9", "0.5", "1.0", "true", '"adamw"', '"x"', "[]", "{}", "nan", "inf",
                               "2024-01-01", "0x10", "1_000"]))), max_size=12)


@FAST
@given(TOML_LINES)
def test_config_loader_toml_shaped_text(lines):
    try:
        cfg = cfgmod.loads("\n".join(lines))
    except UsageError as e:
        clear(e)
    else:
        assert cfgmod.loads(cfgmod.resolved_toml(cfg)) == cfg


@FAST
@given(st.text(max_size=60))
def test_set_override_arbitrary(item):
    try:
        cfgmod.loads("[train]\ntotal_steps = 5\n", overrides=[item])
    except UsageError as e:
        clear(e)


# ------------------------------------------------------------------------------------- checkpoint state

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ck")
    return ck.save_checkpoint(root, 3, {"w": np.zeros(4, np.float32)}, {"carry.h0": np.zeros((1, 1, 4), np.float32)},
                              {"seqs": 3})


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), JSON_VALUES.map(lambda v: json.dumps(v).encode()),
                 st.dictionaries(st.sampled_from(["format", "global_step", "vocab_fingerprint", "sha256", "config"]),
                                 JSON_VALUES, max_size=5).map(lambda d: json.dumps(
                                     {"format": "catchat-checkpoint", "global_step": 1,
                                      "vocab_fingerprint": vocab.FINGERPRINT, **d}).encode())))
def test_checkpoint_state_arbitrary(saved, data):
    """A state.json with any content: the checkpoint loads, or one clear error naming the file."""
    good = (saved / "state.json").read_bytes()
    try:
        (saved / "state.json").write_bytes(data)
        try:
            c = ck.load_checkpoint(saved)
        except UsageError as e:
            clear(e)
            return
        assert c.global_step == int(c.state["global_step"])
    finally:
        (saved / "state.json").write_bytes(good)
