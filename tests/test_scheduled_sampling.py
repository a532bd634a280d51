"""Scheduled sampling (issue 5): the choice kernel, the per-timestep path, the TF schedule, prefix
dropout, dual evaluation and exact resume with teacher forcing below 1."""

import csv
import json

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.data.lanes import prefix_dropout
from catchat.model import ModelSpec, init_params
from catchat.model import reference as ref
from catchat.parity import model as model_parity
from catchat.parity import sampling
from catchat.run import checkpoint as ck
from catchat.run.schedule import tf_at
from catchat.train import Trainer

from support import build_scene_corpus, small_config


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    return build_scene_corpus(tmp_path_factory.mktemp("scenes"))


def test_choice_kernel_matches_reference(dev):
    results = sampling.parity_checks(dev)
    bad = [str(r) for r in results if not r.ok]
    assert results and not bad, "\n".join(bad)


@pytest.mark.parametrize("case", model_parity.STEPWISE_CASES,
                         ids=lambda c: f"tf={c[4]}" if isinstance(c, tuple) else "")
def test_per_timestep_path(dev, case):
    """tf = 1: equal to the batched path; tf < 1: the reference's inputs, loss and gradients."""
    results = model_parity.stepwise_parity(dev, *case)
    bad = [str(r) for r in results if not r.ok]
    assert not bad, "\n".join(bad)


def test_reference_inputs_at_full_teacher_forcing_are_the_data():
    spec = ModelSpec(vocab_size=101, hidden=6, layers=1)
    params = init_params(spec, 0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, 101, (5, 3)).astype(np.uint32)
    resets = np.zeros((5, 3), np.uint32)
    fed, n = ref.scheduled_sampling_inputs(params, spec, tokens, resets, np.zeros((1, 3, 6), np.float32), tf=1.0)
    assert n == 0 and np.array_equal(fed, tokens)
    fed, n = ref.scheduled_sampling_inputs(params, spec, tokens, resets, np.zeros((1, 3, 6), np.float32), tf=0.0)
    assert n == 4 * 3 and np.array_equal(fed[0], tokens[0])  # t = 0 is always the data's token


def _tf_cfg(**tf):
    return cfgmod.loads("[train]\ntotal_steps = 10\n[teacher_forcing]\n"
                        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in tf.items()))


def test_tf_schedules_keyed_to_cycles():
    lin = _tf_cfg(schedule="linear", start=1.0, floor=0.6, hold_cycles=1.0, decay_cycles=2.0)
    assert [tf_at(c, lin) for c in (0, 1, 2, 3, 10)] == pytest.approx([1.0, 1.0, 0.8, 0.6, 0.6])
    exp = _tf_cfg(schedule="exponential", floor=0.7, decay_cycles=1.0)
    assert tf_at(0, exp) == 1.0 and tf_at(1, exp) == pytest.approx(0.7 + 0.3 * np.exp(-5))
    sig = _tf_cfg(schedule="inverse_sigmoid", floor=0.7, decay_cycles=1.0)
    assert tf_at(0.5, sig) == pytest.approx(0.85) and tf_at(5, sig) == pytest.approx(0.7, abs=1e-9)
    assert tf_at(3.0, _tf_cfg()) == 1.0  # constant by default
    assert all(tf_at(c, lin) == tf_at(c, lin) for c in np.linspace(0, 4, 9))  # pure


def test_prefix_dropout_masks_prefix_and_resets_at_its_end():
    T, B = 20, 64
    targets = np.full((T, B), 9, np.uint32)
    resets = np.zeros((T, B), np.uint32)
    tg, rs = prefix_dropout(targets, resets, 0.5, 0.5, seed=7)
    hit = np.flatnonzero(tg[0] == 0)
    assert 10 < hit.size < 54  # about half the lanes
    for b in range(B):
        n = int(np.count_nonzero(tg[:, b] == 0))
        if b in hit:
            assert 1 <= n <= 10 and (tg[:n, b] == 0).all() and rs[n, b] == 1
        else:
            assert n == 0 and not rs[:, b].any()
    again = prefix_dropout(targets, resets, 0.5, 0.5, seed=7)
    assert np.array_equal(again[0], tg) and np.array_equal(again[1], rs)
    untouched = prefix_dropout(targets, resets, 0.0, 0.5, seed=7)
    assert np.array_equal(untouched[0], targets) and not untouched[1].any()


def _tf_small(corpus_dir):
    cfg = small_config(corpus_dir)
    return cfgmod.with_changes(cfg, teacher_forcing={"schedule": "linear", "floor": 0.5, "decay_cycles": 0.05},
                               data={"prefix_dropout": 0.25}, eval={"sample_chars": 40})


def test_training_with_scheduled_sampling_resumes_exactly(dev, small_corpus, tmp_path):
    cfg = _tf_small(small_corpus)
    Trainer(cfg, tmp_path / "straight", dev).run()
    Trainer(cfg, tmp_path / "resumed", dev).run(stop_after_steps=3)
    Trainer(cfg, tmp_path / "resumed", dev, resume="").run()
    rows = {}
    for name in ("straight", "resumed"):
        with open(tmp_path / name / "metrics.csv") as f:
            rows[name] = list(csv.DictReader(f))
    assert [r["loss"] for r in rows["straight"]] == [r["loss"] for r in rows["resumed"]]
    tfs = [float(r["tf"]) for r in rows["straight"]]
    assert tfs[0] == 1.0 and min(tfs) < 1.0 and tfs == sorted(tfs, reverse=True)
    a, b = ck.load_checkpoint(tmp_path / "straight"), ck.load_checkpoint(tmp_path / "resumed")
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name], err_msg=name)
    events = [json.loads(x) for x in (tmp_path / "straight" / "events.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert evals and all({"loss", "bpc", "top1", "top5"} <= set(e["free_running"]) for e in evals)
    samples = sorted((tmp_path / "straight" / "samples").glob("step-*.txt"))
    assert len(samples) == len(evals)
    text = samples[-1].read_text()
    assert "=== greedy" in text and "=== temperature 0.5" in text and "=== temperature 0.8" in text
