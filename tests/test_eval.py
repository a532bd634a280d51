"""`catchat eval` (issue 18 items 4-5): --text (plain text, JSONL) read exactly as `corpus build`
reads it, --split eval/train/all, the readable summary and --json, empty-split errors, and the
packed layout: the loss of a packed evaluation equals the numpy reference model's, whatever the
number of lanes."""

import hashlib
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.data import corpus as corpus_mod
from catchat.data import vocab
from catchat.data.lanes import Lanes, longest_lane, packed_layout
from catchat.model.reference import model_forward_backward
from catchat.run import checkpoint as ck

from support import make_tiny_run

JSON_FIELDS = {"checkpoint", "global_step", "source", "path", "description", "loss", "bpc", "top1", "top5",
               "n_valid", "characters", "conversations", "lanes", "window", "windows", "carry_state", "seconds",
               "notes"}

# conversations of 5..70 characters: several are longer than the tiny run's window (T = 16)
PLAIN = ("The cat sat on the mat.\n<|endoftext|>\nA dog barked at the moon all night long, and nobody slept "
         "a wink.\n<|endoftext|>\nHi.\n<|endoftext|>\nWhere is the cat? Asleep, as ever, by the fire.\n"
         "<|endoftext|>\nOne more line\nand a second line.\n")
DIALOGUE = [
    {"turns": [{"speaker": "ALICE", "text": "Where is the cat?"}, {"speaker": "BOB", "text": "Asleep on the mat."}]},
    {"text": "a conversation without speakers, \u201ccurly\u201d quotes\tand a tab"},
    {"speaker": "NARRATOR", "text": "one turn with a speaker \u2014 and a dash"},
    {"conversation": "x", "speaker": "ANNA", "text": "Hi!"},
    {"conversation": "x", "speaker": "BO", "text": "Hello.\nHow are you?"},
]


@pytest.fixture(scope="module")
def run(tmp_path_factory, dev):
    """A tiny trained run (H=16, L=1, B=4, T=16) on 24 short dialogues (eval fraction 0.05)."""
    return make_tiny_run(tmp_path_factory.mktemp("eval"), dev)


@pytest.fixture
def plain(tmp_path):
    p = tmp_path / "scenes.txt"
    p.write_text(PLAIN)
    return p


@pytest.fixture
def dialogue(tmp_path):
    p = tmp_path / "chat.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in DIALOGUE))
    return p


def eval_json(cli, *args) -> dict:
    code, out, err = cli("eval", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def reference_scores(run_dir, conversations) -> tuple[float, int, int, int]:
    """(loss sum, targets, top-1 hits, top-5 hits) of the numpy model (float64) over each
    conversation alone, from zero state: the definition the packed evaluation must meet."""
    c = ck.load_checkpoint(run_dir)
    spec = cfgmod.model_spec(cfgmod.from_dict(c.state["config"]))
    params = {k: v.astype(np.float64) for k, v in c.params.items()}
    loss, n, top1, top5 = 0.0, 0, 0, 0
    for conv in conversations:
        conv = np.asarray(conv, np.uint32)
        tokens = conv[:, None]
        targets = np.append(conv[1:], vocab.PAD)[:, None].astype(np.uint32)  # nothing after <eos>
        resets = np.zeros_like(tokens)
        resets[0] = 1
        r = model_forward_backward(params, spec, tokens, targets, resets,
                                   np.zeros((spec.layers, 1, spec.hidden)), 1, need_grads=False)
        loss, n, top1, top5 = loss + r.loss, n + r.n_valid, top1 + r.top1, top5 + r.top5
    return loss, n, top1, top5


def conversations_of(path) -> list[np.ndarray]:
    r = corpus_mod.read_conversations(path)
    return [r.tokens[s:s + n] for s, n in zip(r.starts, r.lengths)]


# ------------------------------------------------------------------ --text
def test_text_plain(cli, run, plain):
    res = eval_json(cli, run, "--text", plain)
    assert res["source"] == "text" and res["path"] == str(plain) and "split" not in res
    assert res["conversations"] == 5
    # 5 conversations split at the delimiter lines, trailing whitespace dropped; each adds its <eos>
    assert res["characters"] == sum(len(piece.rstrip()) for piece in PLAIN.split("<|endoftext|>\n"))
    assert res["n_valid"] == res["characters"] + 5
    assert 0 < res["loss"] < 2 * math.log(101)
    assert res["lanes"] <= 4 and res["window"] <= 16

    code, out, err = cli("eval", run, "--text", plain)
    assert code == 0, err
    assert out.splitlines()[0].endswith(f"on {plain} (5 conversations)")
    for needle in (f"loss       {res['loss']:.4f} nats/char", f"bits/char  {res['bpc']:.4f}", "top-1 ", "top-5 ",
                   f"scored     {res['n_valid']:,} targets: {res['characters']:,} characters + 5 <turn>/<eos>"):
        assert needle in out, out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_text_jsonl_is_encoded_like_corpus_build(cli, run, dialogue, tmp_path):
    """--text FILE.jsonl scores exactly the conversations `corpus build` makes of the file: the same
    tokens, and the same metrics as `eval --corpus BUILT --split all`."""
    res = eval_json(cli, run, "--text", dialogue)
    assert res["conversations"] == 4  # the two "conversation": "x" records are one
    built = tmp_path / "built"
    corpus_mod.build([str(dialogue)], built)
    c = corpus_mod.open_corpus(built)
    mem = corpus_mod.read_conversations(dialogue)
    assert mem.tokens.tobytes() == np.asarray(c.tokens).tobytes()
    np.testing.assert_array_equal(mem.starts, c.starts)
    np.testing.assert_array_equal(mem.lengths, c.lengths)
    assert mem.characters == c.manifest["characters"] and mem.turns == c.manifest["turns"]
    assert res["characters"] == mem.characters
    assert res["n_valid"] == mem.characters + mem.turns  # a <turn> between turns, an <eos> after the last
    via_corpus = eval_json(cli, run, "--corpus", built, "--split", "all")
    for k in ("loss", "bpc", "top1", "top5", "n_valid", "characters", "conversations", "lanes", "window"):
        assert via_corpus[k] == res[k], k
    assert "<turn>" in vocab.decode(mem.tokens, show_specials=True)
    assert '"curly" quotes and a tab' in vocab.decode(mem.tokens)  # normalised as the build does


def test_text_format_flag(cli, run, tmp_path):
    p = tmp_path / "chat.txt"  # JSONL under a .txt name: refused as text unless --format says (test_formats.py)
    p.write_text(json.dumps({"speaker": "A", "text": "hello there"}) + "\n")
    as_text = eval_json(cli, run, "--text", p, "--format", "text")
    as_jsonl = eval_json(cli, run, "--text", p, "--format", "jsonl")
    assert as_jsonl["characters"] == len("A: hello there")
    assert as_text["characters"] == len(p.read_text().strip())


# ------------------------------------------------------------------ --split
def test_splits(cli, run):
    ev, tr, al = (eval_json(cli, run, "--split", s) for s in ("eval", "train", "all"))
    assert eval_json(cli, run)["loss"] == ev["loss"]  # the default is the eval split
    c = corpus_mod.open_corpus(ck.load_checkpoint(run).state["config"]["data"]["corpus"])
    sp = c.split(0.05)
    assert (ev["conversations"], tr["conversations"], al["conversations"]) == (len(sp.eval), len(sp.train), 24)
    assert ev["split"] == "eval" and tr["split"] == "train" and al["split"] == "all"
    assert ev["source"] == "corpus" and ev["path"] == str(c.path)
    assert ev["n_valid"] + tr["n_valid"] == al["n_valid"]
    assert ev["characters"] + tr["characters"] == al["characters"] == c.manifest["characters"]
    weighted = (ev["loss"] * ev["n_valid"] + tr["loss"] * tr["n_valid"]) / al["n_valid"]
    assert al["loss"] == pytest.approx(weighted, abs=1e-5)
    code, out, _ = cli("eval", run, "--split", "train")
    assert code == 0 and f"on the train split of corpus {c.path} ({len(sp.train)} conversations)" in out


def test_corpus_eval_matches_trainer_eval(cli, run, dev):
    """The packed layout scores the eval split as the trainer's evals do
    (catchat.inference.evaluate.evaluate_lanes over the run's own B = 4, T = 16 lanes)."""
    from catchat.inference.evaluate import evaluate_lanes as evaluate
    from catchat.model import ParamLayout
    from catchat.vk.program import Program

    c = ck.load_checkpoint(run)
    cfg = cfgmod.from_dict(c.state["config"])
    layout = ParamLayout(cfgmod.model_spec(cfg))
    prog = Program(dev, layout, cfg.data.window, cfg.data.batch_lanes, training=False)
    prog.set_params(layout.flatten(c.params, np.float32))
    want = evaluate(prog, Lanes.from_config(corpus_mod.open_corpus(cfg.data.corpus), cfg, "eval"), 0)
    got = eval_json(cli, run)
    n = want["n_valid"]
    assert got["n_valid"] == n and got["characters"] < n
    assert abs(got["top1"] - want["top1"]) * n <= 1 and abs(got["top5"] - want["top5"]) * n <= 1
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-5)


# ------------------------------------------------------------------ output and errors
def test_json_fields(cli, run, plain):
    res = eval_json(cli, run, "--text", plain)
    assert set(res) == JSON_FIELDS
    assert res["bpc"] == pytest.approx(res["loss"] / math.log(2))
    assert 0 <= res["top1"] <= res["top5"] <= 1
    assert res["global_step"] == 5 and res["checkpoint"].endswith("step-0000005")
    assert res["windows"] == math.ceil(longest_lane(res_lengths(plain), res["lanes"]) / res["window"])
    assert res["carry_state"] is True and res["seconds"] > 0 and res["notes"] == []
    assert set(eval_json(cli, run)) == JSON_FIELDS | {"split"}


def res_lengths(path):
    return corpus_mod.read_conversations(path).lengths


def _one_conversation_corpus(tmp_path, want_eval: bool):
    """A corpus of one text file whose single conversation falls on the wanted side at 0.05."""
    for i in range(1000):
        text = f"Just one scene, number {i}.\n"
        key = int.from_bytes(hashlib.sha256(
            bytes([vocab.BOS]) + vocab.encode(text.strip()).ids.tobytes() + bytes([vocab.EOS])).digest()[:8],
            "big") >> 1
        if (key < 0.05 * 2**63) == want_eval:
            break
    src = tmp_path / f"one-{want_eval}.txt"
    src.write_text(text)
    out = tmp_path / f"one-{want_eval}"
    corpus_mod.build([str(src)], out)
    assert corpus_mod.open_corpus(out).split(0.05).eval.size == int(want_eval)
    return out


def test_empty_eval_split(cli, run, tmp_path):
    one = _one_conversation_corpus(tmp_path, want_eval=False)
    code, out, err = cli("eval", run, "--corpus", one)
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"error: the eval split of {one} is empty (1 conversation, eval fraction 0.05)" in err
    assert "fix: use --split all, or --text FILE to score a text file" in err
    assert eval_json(cli, run, "--corpus", one, "--split", "all")["conversations"] == 1
    assert eval_json(cli, run, "--corpus", one, "--split", "train")["conversations"] == 1


def test_empty_train_split(cli, run, tmp_path):
    one = _one_conversation_corpus(tmp_path, want_eval=True)
    code, _, err = cli("eval", run, "--corpus", one, "--split", "train")
    assert code == 2
    assert (f"error: the train split of {one} is empty (1 conversation, all of them held out for eval at eval "
            "fraction 0.05)") in err
    assert "fix: use --split all or --split eval, or --text FILE" in err
    assert eval_json(cli, run, "--corpus", one)["conversations"] == 1


def test_bad_flag_combinations(cli, run, plain, tmp_path):
    code, _, err = cli("eval", run, "--text", plain, "--split", "all")
    assert code == 2 and "--text scores a file: it takes neither --corpus nor --split" in err
    code, _, err = cli("eval", run, "--format", "jsonl")
    assert code == 2 and "--format and --max-unk-rate say how to read --text" in err
    (tmp_path / "empty.txt").write_text("")
    code, _, err = cli("eval", run, "--text", tmp_path / "empty.txt")
    assert code == 2 and "empty.txt is empty (0 bytes)" in err  # corpus build's own checks
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    code, _, err = cli("eval", run, "--text", tmp_path / "bad.jsonl")
    assert code == 2 and "bad.jsonl line 2: not valid JSON" in err


# ------------------------------------------------------------------ packing
@pytest.mark.parametrize("text", ["plain", "dialogue"])
def test_packed_loss_matches_reference(cli, run, text, request):
    """Whatever the number of lanes (1, 2, 3, the default), the loss is the numpy model's over the
    conversations one by one from zero state, to 1e-5; the counts are exact."""
    path = request.getfixturevalue(text)
    loss_sum, n, top1, top5 = reference_scores(run, conversations_of(path))
    layouts = set()
    for lanes in ("1", "2", "3", "0"):
        res = eval_json(cli, run, "--text", path, "--lanes", lanes)
        layouts.add((res["lanes"], res["window"], res["windows"]))
        assert res["n_valid"] == n
        assert res["loss"] == pytest.approx(loss_sum / n, abs=1e-5), lanes
        assert abs(res["top1"] * n - top1) <= 1 and abs(res["top5"] * n - top5) <= 1
    assert len(layouts) >= 3  # the layouts really differ


def test_windows_flag_scores_a_prefix(cli, run, plain):
    full = eval_json(cli, run, "--text", plain, "--lanes", "1")
    part = eval_json(cli, run, "--text", plain, "--lanes", "1", "--windows", "2")
    assert part["windows"] == 2 < full["windows"] and part["n_valid"] < full["n_valid"]
    assert part["notes"] == [f"--windows 2: scored the first 2 of {full['windows']} windows"]


def test_packed_layout():
    # one conversation: one lane, the shortest window that needs as few windows as T = 1024
    assert packed_layout([3761], 64, 1024) == (1, 941)
    assert packed_layout([500], 64, 1024) == (1, 500)
    # one long conversation and short ones: 2 lanes keep the longest lane at 3000, 12 would be padding
    assert packed_layout([3000] + [100] * 11, 64, 1024) == (2, 1000)
    # stateless: the window is what is measured, the lanes are the training eval's
    assert packed_layout([3000] + [100] * 11, 64, 1024, carry_state=False) == (12, 1024)
    assert packed_layout([3000] + [100] * 11, 4, 1024, carry_state=False) == (4, 1024)
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(2, 400, rng.integers(1, 40))
        max_lanes, window = int(rng.integers(1, 12)), int(rng.integers(1, 300))
        B, T = packed_layout(lengths, max_lanes, window)
        top = min(max_lanes, len(lengths))
        best = longest_lane(lengths, top)
        assert 1 <= B <= top and 1 <= T <= window
        assert longest_lane(lengths, B) == best  # no more sequential steps than max_lanes lanes take
        assert B == 1 or longest_lane(lengths, B - 1) > best  # and no fewer lanes would do
        assert math.ceil(best / T) == math.ceil(best / window)  # no more windows than the config's T


def test_fit_layout_shrinks_to_the_device():
    """A v3-size model (H=512) on a device with 128 MiB buffers (lavapipe): fewer lanes, then a
    shorter window, until the largest buffer fits; the note says so."""
    from catchat.inference.evaluate import _largest_buffer_bytes, fit_layout
    from catchat.model import ModelSpec, ParamLayout

    spec = ModelSpec(vocab_size=101, hidden=512, layers=3)
    layout = ParamLayout(spec)
    dev = SimpleNamespace(info=SimpleNamespace(name="small", type="CPU", device_memory_bytes=2 << 30,
                                               max_storage_buffer_bytes=128 << 20))
    assert fit_layout(dev, layout, [3761], 64, 1024, True) == (1, 941, "")
    B, T, note = fit_layout(dev, layout, [3000] * 64, 64, 1024, True)
    assert _largest_buffer_bytes(spec, T, B) <= 128 << 20 and B * T >= 8192
    assert note == f"64 lanes of 1000 would not fit on small: using {B} of {T}"
    tiny = SimpleNamespace(info=SimpleNamespace(name="tiny", type="CPU", device_memory_bytes=0,
                                                max_storage_buffer_bytes=1 << 20))
    B, T, _ = fit_layout(tiny, layout, [3000], 64, 1024, True)
    assert (B, T) == (1, 125) and _largest_buffer_bytes(spec, T, B) <= 1 << 20 < _largest_buffer_bytes(spec, 250, 1)


def test_stateless_checkpoint_keeps_its_window(cli, run, plain, tmp_path):
    """A checkpoint trained stateless is scored stateless: its own window T = 16 (the state resets
    at each), the training eval's lanes (min(B, N) = 4 of the 5 conversations)."""
    c = ck.load_checkpoint(run)
    state = {k: v for k, v in c.state.items() if k in ("seqs", "cycle", "applied_steps", "run_seed", "cursor",
                                                        "config", "model")}
    state["config"]["data"]["carry_state"] = False
    stateless = ck.save_checkpoint(tmp_path / "ckpts", c.global_step, c.params, {}, state)
    res = eval_json(cli, stateless, "--text", plain)
    assert (res["carry_state"], res["lanes"], res["window"]) == (False, 4, 16)
    carried = eval_json(cli, run, "--text", plain)
    assert res["n_valid"] == carried["n_valid"] and res["loss"] != carried["loss"]
    code, out, _ = cli("eval", stateless, "--text", plain)
    assert code == 0 and "(stateless: state reset every window)" in out


def test_max_unk_rate_for_text(cli, run, tmp_path):
    """A text mostly outside cc101 is refused as `corpus build` refuses it; --max-unk-rate admits it."""
    odd = tmp_path / "odd.txt"
    odd.write_text("ALICE: Привет, как дела?\n", encoding="utf-8")
    code, _, err = cli("eval", run, "--text", odd)
    assert code == 2 and "outside the cc101 vocabulary" in err and "--max-unk-rate" in err, err
    res = eval_json(cli, run, "--text", odd, "--max-unk-rate", "1")
    assert res["characters"] == len("ALICE: Привет, как дела?") and res["n_valid"] == res["characters"] + 1
