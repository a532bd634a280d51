"""The trainer end to end on a small corpus: exact resume, intervals, telemetry, refusals (lessons 2-10)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.data.corpus import open_corpus
from catchat.data.lanes import Lanes
from catchat.errors import UsageError
from catchat.precision import LossScaler
from catchat.run import checkpoint as ck
from catchat.train import Trainer
from catchat.training.feed import Feed

from support import build_scene_corpus, small_config


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    return build_scene_corpus(tmp_path_factory.mktemp("scenes"))


def _losses(run_dir):
    with open(run_dir / "metrics.csv") as f:
        return [row["loss"] for row in csv.DictReader(f)]


def _final_params(run_dir):
    return ck.load_checkpoint(run_dir).params


def test_next_steps_data_is_made_while_the_gpu_runs_and_changes_nothing(dev, small_corpus, tmp_path, monkeypatch):
    """Each step's data is made once, during the step before (only the first step makes its own), and
    training is bitwise what it is when every step makes its data itself."""
    cfg = small_config(small_corpus)
    made = []
    step_data = Feed.step_data
    monkeypatch.setattr(Feed, "step_data", lambda self, c, s: made.append((c, s)) or step_data(self, c, s))
    t = Trainer(cfg, tmp_path / "ahead", dev)
    assert t.run() == "done"
    steps = t.global_step
    assert [s for _, s in made] == list(range(steps + 1))  # 0 by step 1 itself, k + 1 during step k + 1
    assert len(set(made)) == len(made)

    monkeypatch.setattr(Feed, "prepare_next", lambda self, cursor, global_step: None)
    assert Trainer(cfg, tmp_path / "own", dev).run() == "done"
    assert _losses(tmp_path / "ahead") == _losses(tmp_path / "own")
    a, b = _final_params(tmp_path / "ahead"), _final_params(tmp_path / "own")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("precision,lane_order", [("fp32", "corpus"), ("fp16", "shuffle")])
def test_exact_resume_matches_straight_run(dev, small_corpus, tmp_path, precision, lane_order):
    """fp16: the loss scale and its good-step count are restored too. Both runs start at S = 2**24, so
    their first steps overflow and S at the checkpoint is neither the start's nor a fresh 2**16. The
    fp16 run also lays its lanes out shuffled (data.lane_order, a function of the seed and cycle): the
    resumed half reads what the straight run read (one case, not a third run, to keep the suite short)."""
    cfg = cfgmod.with_changes(small_config(small_corpus), train={"precision": precision},
                              data={"lane_order": lane_order})
    straight = Trainer(cfg, tmp_path / "straight", dev)
    first = Trainer(cfg, tmp_path / "resumed", dev)
    if precision == "fp16":
        straight.scaler = LossScaler(2.0**24)
        first.scaler = LossScaler(2.0**24)
    assert straight.run() == "done"
    assert first.run(stop_after_steps=4) == "stop-after-steps"
    if precision == "fp16":
        assert 2.0**16 != ck.load_checkpoint(tmp_path / "resumed").state["loss_scale"]["scale"] < 2.0**24
    assert ck.load_checkpoint(tmp_path / "resumed").global_step == 4  # lesson 3: named after steps done
    second = Trainer(cfg, tmp_path / "resumed", dev, resume="")
    assert second.global_step == 4
    assert second.run() == "done"
    assert _losses(tmp_path / "straight") == _losses(tmp_path / "resumed")
    a, b = _final_params(tmp_path / "straight"), _final_params(tmp_path / "resumed")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)  # bitwise
    sa = ck.load_checkpoint(tmp_path / "straight", with_optimizer=True)
    sb = ck.load_checkpoint(tmp_path / "resumed", with_optimizer=True)
    np.testing.assert_array_equal(sa.optimizer["carry.h0"], sb.optimizer["carry.h0"])
    assert sa.state["cursor"] == sb.state["cursor"]
    assert sa.state["cursor"]["layout"] == Lanes.from_config(open_corpus(str(small_corpus)), cfg).layout
    assert sa.state.get("loss_scale") == sb.state.get("loss_scale")
    assert ("loss_scale" in sa.state) == (precision == "fp16")


def test_telemetry_and_intervals(dev, small_corpus, tmp_path):
    cfg = small_config(small_corpus)
    Trainer(cfg, tmp_path / "run", dev).run()
    run = tmp_path / "run"
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["global_step"]) for r in rows] == list(range(1, 9))
    assert [int(r["seqs"]) for r in rows] == [8 * i for i in range(1, 9)]  # micro_batches * lanes per step
    assert all(int(r["valid_tokens"]) > 0 and float(r["tokens_per_s"]) > 0 for r in rows)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    # every 16 seqs, by boundary crossing; the last at step 8 is also the run's final eval (not run twice)
    assert [e["seqs"] for e in evals] == [16, 32, 48, 64]
    assert all(0 < e["loss"] < 6 and e["bpc"] == pytest.approx(e["loss"] / np.log(2)) for e in evals)
    ckpts = [e["global_step"] for e in events if e["event"] == "checkpoint"]
    assert ckpts == [3, 6, 8]  # crossings of 24 and 48 seqs, then the final one
    assert [p.name for p in ck.list_checkpoints(run / "checkpoints")] == ["step-0000006", "step-0000008"]
    assert cfgmod.load(run / "config.toml") == cfg  # the resolved config round-trips


def test_a_finished_run_resumed_does_not_evaluate_again(dev, small_corpus, tmp_path):
    """Resuming a run at the step it ended at adds no eval (its final one is in the log); one whose log
    lacks that eval (stopped between its final checkpoint and the eval) runs it once."""
    cfg = cfgmod.with_changes(small_config(small_corpus), eval={"eval_every_seqs": 24})  # steps 3, 6; final 8
    run = tmp_path / "run"
    Trainer(cfg, run, dev).run()

    def evals():
        return [e["global_step"] for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
                if e["event"] == "eval"]

    assert evals() == [3, 6, 8]
    assert Trainer(cfg, run, dev, resume="").run() == "done"
    assert evals() == [3, 6, 8]
    lines = (run / "events.jsonl").read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if json.loads(line)["event"] == "eval")
    (run / "events.jsonl").write_text("\n".join(lines[:last] + lines[last + 1:]) + "\n")  # as if cut before it
    assert Trainer(cfg, run, dev, resume="").run() == "done"
    assert evals() == [3, 6, 8]  # run again, once


def test_schedule_is_a_function_of_global_step(dev, small_corpus, tmp_path):
    """Lesson 2: the resumed half continues the lr column, no second warmup."""
    cfg = small_config(small_corpus)
    Trainer(cfg, tmp_path / "r", dev).run(stop_after_steps=5)
    Trainer(cfg, tmp_path / "r", dev, resume="").run()
    with open(tmp_path / "r" / "metrics.csv") as f:
        lrs = [float(r["lr"]) for r in csv.DictReader(f)]
    from catchat.run.schedule import lr_at

    assert lrs == pytest.approx([lr_at(s, 8, cfg) for s in range(8)], rel=1e-5)
    assert lrs[5] >= lrs[4] * 0.5  # not back to warmup


def test_existing_run_needs_resume_and_resume_needs_a_checkpoint(dev, small_corpus, tmp_path):
    cfg = small_config(small_corpus)
    Trainer(cfg, tmp_path / "r", dev).run(stop_after_steps=1)
    with pytest.raises(UsageError, match="already holds a run"):
        Trainer(cfg, tmp_path / "r", dev)
    with pytest.raises(UsageError, match="no checkpoint"):
        Trainer(cfg, tmp_path / "empty", dev, resume="")


def test_changed_model_is_refused_on_resume(dev, small_corpus, tmp_path):
    cfg = small_config(small_corpus)
    Trainer(cfg, tmp_path / "r", dev).run(stop_after_steps=1)
    bigger = cfgmod.with_changes(cfg, model={"hidden": 16})
    with pytest.raises(UsageError, match="does not match the model config"):
        Trainer(bigger, tmp_path / "r", dev, resume="")


def test_sigint_mid_run_checkpoints_and_exits_130(small_corpus, tmp_path):
    """Ctrl-C: the step in flight finishes, a checkpoint is written, exit code 130; resume continues."""
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(cfgmod.resolved_toml(small_config(small_corpus, total_steps=400)))
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "catchat.cli", "train", str(cfg_path), "--run-dir", str(run)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 600  # generous: CI machines are busy
    while time.time() < deadline and not ((run / "metrics.csv").exists()
                                          and len((run / "metrics.csv").read_text().splitlines()) > 3):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    assert time.time() < deadline, "training never started"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out
    assert "Traceback" not in out
    step = ck.load_checkpoint(run).global_step
    assert 2 < step < 400
    with open(run / "metrics.csv") as f:
        assert len(list(csv.DictReader(f))) == step


# held-out loss bound of test_training_learns (measured there: 0.1212 nats/char on lavapipe)
LEARNED_LOSS_BOUND = 0.35


def test_training_learns(dev, small_corpus, tmp_path):
    """The trained model predicts held-out text far better than chance: a check that fails when the
    gradient or the optimizer is broken (`0 < loss < 6` elsewhere cannot).

    H=32, L=2, AdamW at lr 0.01, no dropout or smoothing, 60 steps of 8 lanes x 32 characters on the
    scene corpus (tests/support.py), then one teacher-forced eval over the whole held-out split
    (452 targets): the eval a run planned in steps ends with, its interval never crossed (issue 36
    item 4: it is printed and recorded after the final checkpoint). Measured on lavapipe, in nats/char:
      - this run: 0.1212 (seeds 1, 2, 4: 0.1096, 0.1275, 0.1132); 0.5873 after 30 of the 60 steps;
      - a zeroed gradient (the same run at lr 1e-9: the weights stay at their init): 4.8087
        (uniform over the 101 tokens: ln 101 = 4.615);
      - the best a model without context can do (the held-out text's own character frequencies):
        3.1155; with one character of context (its own bigram statistics): 0.9614.
    The bound, 0.35, is below what half the training reaches and a third of the bigram figure, so a
    model has to learn through its recurrence to pass; it leaves ~3x the measured loss for other
    devices' rounding."""
    cfg = cfgmod.loads(f"""
[model]
hidden = 32
layers = 2
[data]
corpus = "{small_corpus}"
batch_lanes = 8
window = 32
micro_batches = 1
[train]
lr = 0.01
total_steps = 60
seed = 3
[schedule]
warmup_fraction = 0.1
cooldown_fraction = 0.2
lr_min = 0.001
[eval]
eval_every_seqs = 1000000
eval_windows = 0
free_running = false
sample_chars = 0
[checkpoint]
checkpoint_every_seqs = 480
keep_last = 1
""")
    reported = []
    with Trainer(cfg, tmp_path / "run", dev, reporter=lambda kind, **_: reported.append(kind)) as trainer:
        assert trainer.run() == "done"
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert [e["global_step"] for e in evals] == [60]
    assert [e["event"] for e in events][-3:] == ["checkpoint", "eval", "end"] == reported[-3:]
    # the bound was measured on this held-out split: a changed corpus must be measured again
    assert evals[0]["n_valid"] == 452
    assert evals[0]["loss"] < LEARNED_LOSS_BOUND, evals[0]
