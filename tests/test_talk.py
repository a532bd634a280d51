"""Dialogue: the rolling context, `catchat talk` over a pipe, `catchat chat` and its JSONL log,
and reading that log back as one corpus conversation."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.data import corpus as corpus_mod
from catchat.data import vocab
from catchat.errors import UsageError
from catchat.inference import talk as talk_mod
from catchat.inference.generate import Generator, Sampling
from catchat.run import checkpoint as ck

from support import make_tiny_run

LOG_KEYS = {"format", "id", "conversation", "turn", "speaker", "text", "stop", "checkpoint", "sampling"}


@pytest.fixture(scope="module")
def runs(dev, tmp_path_factory):
    root = tmp_path_factory.mktemp("talk")
    return make_tiny_run(root / "a", dev, 1), make_tiny_run(root / "b", dev, 2)


def enc(text):
    return vocab.encode(text).ids.tolist()


def generator(dev, run, **kw):
    return Generator.from_checkpoint(dev, ck.load_checkpoint(run), **kw)


# ------------------------------------------------------------------------------ Dialogue
def test_dialogue_layout_and_state(dev, runs):
    d = talk_mod.Dialogue(generator(dev, runs[0]), 800)
    seed = 0
    d.add("YOU", "hello\nthere")
    r1 = d.reply("CAT", 25, Sampling(greedy=True), seed)
    assert d.context_tokens == [vocab.BOS] + enc("YOU: hello\nthere") + [vocab.TURN] + enc("CAT: ") + r1.ids
    assert r1.stop in ("turn", "eos", "length") and vocab.TURN not in r1.ids and vocab.EOS not in r1.ids
    d.add("YOU", "and?")
    r2 = d.reply("CAT", 25, Sampling(temperature=1.0), seed + 1)
    assert d.context_tokens == ([vocab.BOS] + enc("YOU: hello\nthere") + [vocab.TURN] + enc("CAT: ") + r1.ids
                                + [vocab.TURN] + enc("YOU: and?") + [vocab.TURN] + enc("CAT: ") + r2.ids)
    assert d.reprimes == 0
    # the model's state is exactly that of reading the context from scratch
    fresh = generator(dev, runs[0], prefill=0)
    np.testing.assert_allclose(fresh.feed(np.array(d.context_tokens[:d._fed], np.uint32))[0], d.gen.logits[0],
                               atol=1e-5)


def test_rolling_context_keeps_the_latest_whole_turns(dev, runs):
    budget = 60
    d = talk_mod.Dialogue(generator(dev, runs[0]), budget)
    seed = 1
    said = [f"line number {i} is here" for i in range(6)]  # 'YOU: ...' = 24 tokens each
    for text in said:
        d.add("YOU", text)
        last = d.reply("CAT", 8, Sampling(temperature=1.0), seed)
    assert d.reprimes >= 2
    ctx = d.context_tokens
    assert ctx[0] == vocab.BOS and vocab.BOS not in ctx[1:]
    shown = vocab.decode(ctx, show_specials=True)
    assert said[-1] in shown and said[0] not in shown  # the oldest turns were dropped...
    turns = shown[len("<bos>"):].split("<turn>")
    assert turns[0].startswith("YOU: line number") or turns[0].startswith("CAT: ")  # ...whole
    assert len(ctx) - len(last.ids) <= budget  # primed within the budget, then the reply
    fresh = generator(dev, runs[0], prefill=0)  # re-primed from a zero state
    np.testing.assert_allclose(fresh.feed(np.array(ctx[:d._fed], np.uint32))[0], d.gen.logits[0], atol=1e-5)
    # a turn longer than the whole budget is still kept (alone)
    d.add("YOU", "x" * 100)
    d.reply("CAT", 4, Sampling(temperature=1.0), seed)
    ctx = d.context_tokens
    assert ctx[:1 + len(enc("YOU: " + "x" * 100))] == [vocab.BOS] + enc("YOU: " + "x" * 100)


def test_context_budget_respects_stateless_training(runs):
    cfg = cfgmod.from_dict(ck.load_checkpoint(runs[0]).state["config"])
    assert talk_mod.context_budget(cfg, None) == (800, "")
    stateless = cfgmod.with_changes(cfg, data={"carry_state": False})
    budget, note = talk_mod.context_budget(stateless, 800)
    assert budget == cfg.data.window and "statelessly" in note


# ------------------------------------------------------------------------------ catchat talk
def test_talk_over_a_pipe(cli, runs):
    lines = "hello there\n/temp 0.5\n\nhow are you\n//slash text\n/bogus\n/topk x\n/quit\nnever read\n"
    code, out, err = cli("talk", runs[0], "--length", "40", "--seed", "3", stdin=lines)
    assert code == 0
    answers = out.split("\n")
    assert len(answers) == 4 and answers[-1] == ""  # three answers, one line each
    assert not any(a.startswith("CATCHAT: ") for a in answers)
    assert "temperature 0.5" in err and "unknown command /bogus" in err and "/topk: 'x' is not an integer" in err
    assert cli("talk", runs[0], "--length", "40", "--seed", "3", stdin=lines)[1] == out  # same seed, same answers
    other = cli("talk", runs[0], "--length", "40", "--seed", "3", stdin=lines.replace("/temp 0.5", "/temp 1.9"))[1]
    assert other.split("\n")[0] == answers[0] and other.split("\n")[1:] != answers[1:]  # /temp is used
    hot = cli("talk", runs[0], "--length", "40", "--seed", "3", "--temperature", "1.9", stdin="hello there\n")[1]
    assert hot != answers[0] + "\n"  # and so is --temperature


def test_talk_refusals(cli, runs, tmp_path):
    assert cli("talk", runs[0], "--temprature", "1", stdin="")[0] == 2
    code, _, err = cli("talk", runs[0], "--user", "CAT", "--speaker", "CAT", stdin="")
    assert code == 2 and "both 'CAT'" in err
    code, _, err = cli("talk", tmp_path / "none", stdin="")
    assert code == 2 and "no checkpoint" in err


# ------------------------------------------------------------------------------ catchat chat
def read_log(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_chat_log_append_and_corpus_round_trip(cli, runs, tmp_path):
    log = tmp_path / "chat.jsonl"
    args = ("chat", runs[0], runs[1], "--turns", "4", "--out", log, "--length", "40", "--opening", "Hello, Bob.",
            "--temperature-b", "1.3", "--top-k-a", "20", "--seed", "7")
    code, out, err = cli(*args)
    assert code == 0 and "wrote turns 1..5" in err
    recs = read_log(log)
    assert [r["turn"] for r in recs] == [1, 2, 3, 4, 5]
    assert [r["speaker"] for r in recs] == ["ALICE", "BOB", "ALICE", "BOB", "ALICE"]
    assert all(set(r) == LOG_KEYS and r["format"] == "catchat-chat" for r in recs)
    conv = recs[0]["conversation"]
    assert all(r["conversation"] == conv and r["id"] == f"{conv}:{r['turn']}" for r in recs)
    assert recs[0]["text"] == "Hello, Bob." and recs[0]["checkpoint"] is None and recs[0]["sampling"] is None
    for r in recs[1:]:
        side = 0 if r["speaker"] == "ALICE" else 1
        assert r["checkpoint"] == {"path": str(ck.resolve(runs[side]).resolve()), "global_step": 5,
                                   "vocab_fingerprint": vocab.FINGERPRINT}
        assert r["sampling"]["temperature"] == (0.8, 1.3)[side] and r["sampling"]["top_k"] == (20, 0)[side]
        assert r["sampling"]["ngram_block"] == 5 and r["sampling"]["seed"] == 7
        assert r["stop"] in ("turn", "eos", "length") and isinstance(r["text"], str)
    assert out.startswith("ALICE: Hello, Bob.\nBOB: ")
    # the same command writes the same file
    again = tmp_path / "again.jsonl"
    assert cli(*args[:6], again, *args[7:])[0] == 0
    assert again.read_text() == log.read_text()
    # an existing log is not overwritten; --append continues it (numbering, id, whose turn)
    code, _, err = cli(*args)
    assert code == 2 and "--append" in err
    assert cli("chat", runs[0], runs[1], "--turns", "3", "--out", log, "--append", "--length", "30")[0] == 0
    recs = read_log(log)
    assert [r["turn"] for r in recs] == list(range(1, 9))
    assert [r["speaker"] for r in recs[5:]] == ["BOB", "ALICE", "BOB"]
    assert {r["conversation"] for r in recs} == {conv}
    # the log is one corpus conversation, with its provenance in the manifest
    corpus_mod.build([str(log)], tmp_path / "c", eval_fraction=0.0)
    c = corpus_mod.open_corpus(tmp_path / "c")
    assert len(c) == 1
    want = [vocab.BOS]
    for i, r in enumerate(recs):
        want += ([vocab.TURN] if i else []) + enc(f"{r['speaker']}: {r['text']}")
    assert c.conversation(0).tolist() == want + [vocab.EOS]
    syn = c.manifest["sources"][0]["synthetic"]
    assert syn["generator"] == "catchat chat" and syn["turns"] == 8 and syn["given_turns"] == 1
    assert syn["conversations"] == 1
    got = {(e["path"], e["global_step"], e["vocab_fingerprint"], tuple(e["speakers"])) for e in syn["checkpoints"]}
    assert got == {(str(ck.resolve(runs[0]).resolve()), 5, vocab.FINGERPRINT, ("ALICE",)),
                   (str(ck.resolve(runs[1]).resolve()), 5, vocab.FINGERPRINT, ("BOB",))}


def test_chat_contexts_are_the_logged_conversation(dev, runs, tmp_path):
    """Both models read exactly the conversation the log holds (no re-priming at this size)."""
    sides = [talk_mod.Side(sp, talk_mod.Dialogue(generator(dev, r), 2000), Sampling(temperature=1.0),
                           talk_mod.checkpoint_info(ck.load_checkpoint(r)))
             for sp, r in zip(("ANNA", "BEN"), runs)]
    talk_mod.chat(sides, 6, tmp_path / "c.jsonl", length=30, seed=1)
    recs = read_log(tmp_path / "c.jsonl")
    want = [vocab.BOS]
    for i, r in enumerate(recs):
        want += ([vocab.TURN] if i else []) + enc(f"{r['speaker']}: {r['text']}")
    assert sides[0].dialogue.context_tokens == want == sides[1].dialogue.context_tokens


def test_chat_refusals(cli, runs, tmp_path):
    out = tmp_path / "x.jsonl"
    other = tmp_path / "other-vocab"
    shutil.copytree(ck.resolve(runs[1]), other)
    state = json.loads((other / ck.STATE_FILE).read_text())
    state["vocab_fingerprint"] = "0" * 64
    (other / ck.STATE_FILE).write_text(json.dumps(state))
    code, _, err = cli("chat", runs[0], other, "--out", out)
    assert code == 2 and "different vocabularies" in err and not out.exists()
    code, _, err = cli("chat", runs[0], runs[1], "--out", out, "--speaker-a", "BOB")
    assert code == 2 and "both 'BOB'" in err
    code, _, err = cli("chat", runs[0], runs[1], "--out", out, "--speaker-b", "B:")
    assert code == 2 and "--speaker-b" in err
    code, _, err = cli("chat", runs[0], runs[1], "--out", out, "--temperature", "1")  # per side: --temperature-a
    assert code == 2 and "No such option" in err
    assert cli("chat", runs[0], runs[1])[0] == 2  # --out is required
    out.write_text('{"text": "not a chat log"}\n')
    code, _, err = cli("chat", runs[0], runs[1], "--out", out, "--append")
    assert code == 2 and "catchat-chat" in err


# ------------------------------------------------------------------------------ corpus: grouped JSONL records
def test_jsonl_records_sharing_a_conversation_are_one(tmp_path):
    src = tmp_path / "d.jsonl"
    recs = [{"conversation": "x", "speaker": "A", "text": "hi"}, {"conversation": "x", "speaker": "B", "text": "yo"},
            {"text": "alone"}, {"conversation": 7, "turns": [{"speaker": "C", "text": "one"}]},
            {"conversation": 7, "speaker": "D", "text": "two"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    corpus_mod.build([str(src)], tmp_path / "c", eval_fraction=0.0)
    c = corpus_mod.open_corpus(tmp_path / "c")
    assert [c.text(i) for i in range(len(c))] == ["<bos>A: hi<turn>B: yo<eos>", "<bos>alone<eos>",
                                                  "<bos>C: one<turn>D: two<eos>"]
    assert "synthetic" not in c.manifest["sources"][0]
    src.write_text("".join(json.dumps(r) + "\n" for r in [recs[0], recs[2], recs[1]]))
    with pytest.raises(UsageError, match="line 3: conversation 'x' appeared earlier"):
        corpus_mod.build([str(src)], tmp_path / "c2")
    src.write_text(json.dumps({"conversation": [1], "text": "a"}) + "\n")
    with pytest.raises(UsageError, match='line 1: "conversation" must be'):
        corpus_mod.build([str(src)], tmp_path / "c3")
