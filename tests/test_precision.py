"""train.precision = "fp16": the loss scaler's rules, the fp16 model against its fp16 twin, training
at fp16 (the loss falls), the overflow path (skipped, logged, S halves, training goes on), a diverged
run still stopping, the checkpointed scale, and the config/CLI refusals. The exact resume at fp16 is
test_train.py's test_exact_resume_matches_straight_run[fp16]."""

import csv
import json
from dataclasses import replace

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat import precision
from catchat.errors import CatchatError
from catchat.model import ParamLayout
from catchat.model import reference as ref
from catchat.parity import model as pm
from catchat.precision import LossScaler
from catchat.rng import step_seed
from catchat.run import checkpoint as ck
from catchat.run.faults import Fault
from catchat.train import Trainer
from catchat.vk.kernels import gru
from catchat.vk.kernels.gemm import coopmat_runs, products

from support import build_scene_corpus, small_config


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_scene_corpus(tmp_path_factory.mktemp("scenes"))


def fp16(corpus, **train):
    return cfgmod.with_changes(small_config(corpus), train={"precision": "fp16", **train})


def events(run, kind):
    return [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["event"] == kind]


def metrics(run):
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_loss_scaler_rules():
    s = LossScaler()
    assert (s.scale, s.good_steps) == (2.0**16, 0)
    assert all(s.applied() is None for _ in range(precision.GROWTH_INTERVAL - 1))
    assert s.applied() == 2.0**17 and s.good_steps == 0  # the 2000th applied step in a row doubles S
    s.applied()
    assert s.overflow() and (s.scale, s.good_steps) == (2.0**16, 0)  # halves, and the count starts again
    s = LossScaler(2.0)
    assert s.overflow() and s.scale == 1.0
    assert not s.overflow() and s.scale == 1.0  # the floor: not the scale's doing
    assert LossScaler.from_state(s.state()) == s and LossScaler.from_state(None) == LossScaler()
    assert precision.valid_state({"scale": 2.0**20, "good_steps": 7}) is None
    for bad, why in [({"scale": 3.0, "good_steps": 0}, "power of two"), ({"scale": 0.5, "good_steps": 0}, "[1,"),
                     ({"scale": 4, "good_steps": -1}, "good_steps"), ({"scale": 4, "good_steps": 2000}, "good_steps"),
                     ({"scale": True, "good_steps": 0}, "scale"), ([], "table")]:
        assert why in precision.valid_state(bad)


def test_fp16_model_matches_its_twin(dev):
    """One training step at fp16 (loss scale 2**16) against the fp16 twin: loss, logits, hT, every
    gradient (unscaled), the clamp hits, the update. The gradient tolerance tells the precisions apart:
    the fp32 twin's gradients are off by more than it (so a GEMM that did not round would fail)."""
    label, spec, T, B, hp = pm.MODEL_CASES[0]
    rows = pm.model_parity(dev, spec, T, B, replace(hp, loss_scale=pm.FP16_SCALE), label=label, precision="fp16")
    assert all(r.ok for r in rows), "\n".join(str(r) for r in rows if not r.ok)
    assert sum(r.kernel.startswith("grad ") for r in rows) == len(ParamLayout(spec).names) + 1

    layout = ParamLayout(spec)
    flat, tokens, targets, resets, h0 = pm.model_inputs(spec, T, B)  # model_parity's step
    f64, h0 = layout.unflatten(flat.astype(np.float64)), h0.astype(np.float64)
    kw = dict(smoothing=hp.label_smoothing, p_emb=hp.dropout_embedding, p_hid=hp.dropout_hidden,
              seed=step_seed(hp.run_seed, 0, 0))
    twins = [ref.model_forward_backward(f64, spec, tokens, targets, resets, h0, int(np.count_nonzero(targets)),
                                        precision=p, **kw) for p in ("fp16", "fp32")]
    for name in layout.names:
        g16, g32 = twins[0].grads[name], twins[1].grads[name]
        assert np.abs(g16 - g32).max() > 2 * pm.FP16_GRAD * np.abs(g16).max(), name


def test_fp16_training_learns_like_fp32(dev, corpus, tmp_path):
    """A few steps of a small config at fp16: the loss falls, as at fp32, and stays close to it."""
    losses = {}
    for p in ("fp32", "fp16"):
        cfg = cfgmod.with_changes(small_config(corpus, total_steps=12), train={"precision": p, "lr": 0.02},
                                  eval={"eval_every_seqs": 0}, checkpoint={"checkpoint_every_seqs": 0})
        said = []
        with Trainer(cfg, tmp_path / p, dev, reporter=lambda kind, said=said, **f: said.append((kind, f))) as t:
            assert t.run() == "done"
        # lavapipe has no tensor cores: an fp16 run says it will be no faster (once), and its start event too
        warned = [f["text"] for k, f in said if k == "warning" and "no tensor cores" in f["text"]]
        assert len(warned) == (p == "fp16" and not coopmat_runs(dev))
        start = events(tmp_path / p, "start")[0]
        assert start["gemm_products"] == ("fp32" if p == "fp32" else products(dev, "fp16"))
        coop = p == "fp16" and gru.coop_sweeps(dev, cfg.data.batch_lanes, cfg.model.hidden, "fp16")
        design = gru.program_products(dev, cfg.data.batch_lanes, cfg.model.hidden, cfg.model.layers, "fp16", True)
        assert start["sweep_products"] == (f"fp16 on tensor cores ({design})" if coop else "fp32")
        # layer by layer, dW_hh in its layer's place: the defaults (CATCHAT_WAVEFRONT, CATCHAT_OVERLAP_DW unset)
        assert start["recording"] == dict(wavefront_forward=1, wavefront_backward=1, dw_hh_beside=False)
        rows = metrics(tmp_path / p)
        losses[p] = np.array([float(r["loss"]) for r in rows])
        assert all(r["skipped"] == "0" for r in rows)
        assert {r["loss_scale"] for r in rows} == {"1" if p == "fp32" else "65536"}
    for p, lo in losses.items():
        assert lo[-3:].mean() < lo[:3].mean() - 0.3, (p, lo)
    assert np.abs(losses["fp16"] - losses["fp32"]).max() < 0.02, losses


def test_fp16_overflow_is_skipped_logged_and_halves_the_scale(dev, corpus, tmp_path):
    """From S = 2**24 the first steps overflow (tiny models' gradients pass 65504 from ~2**21): each
    is skipped, logged with its reason and halves S, none counts toward max_consecutive_skips (2 here,
    fewer than the overflows), and then steps apply. The checkpoint holds the scale; a resume at fp32
    says it changes precision."""
    run = tmp_path / "run"
    with Trainer(fp16(corpus, max_consecutive_skips=2), run, dev) as t:
        t.scaler = LossScaler(2.0**24)  # the test hook: the run's scale before its first step
        assert t.run(stop_after_steps=6) == "stop-after-steps"
    skipped = events(run, "skipped_step")
    assert len(skipped) > 2 and [e["global_step"] for e in skipped] == list(range(1, len(skipped) + 1))
    for k, e in enumerate(skipped):
        before = 2**(24 - k)
        assert e["reason"] == f"fp16 overflow, loss scale {before} -> {before // 2}" and e["consecutive"] == 0
        assert e["loss_scale"] == before / 2
    rows = metrics(run)
    assert [r["skipped"] for r in rows] == ["1"] * len(skipped) + ["0"] * (6 - len(skipped))
    assert [float(r["loss_scale"]) for r in rows[:len(skipped) + 1]] == [2.0**(24 - k) for k in range(len(skipped) + 1)]
    state = ck.load_checkpoint(run).state
    assert state["loss_scale"] == {"scale": 2.0**(24 - len(skipped)), "good_steps": 6 - len(skipped)}
    assert state["config"]["train"]["precision"] == "fp16"

    said = []
    with Trainer(small_config(corpus), run, dev, resume="", reporter=lambda kind, **f: said.append((kind, f))) as t:
        assert t.scaler is None and t.run(stop_after_steps=1) == "stop-after-steps"
    assert any(k == "warning" and "trained at precision fp16; continuing at fp32" in f["text"] for k, f in said)
    assert "loss_scale" not in ck.load_checkpoint(run).state


def test_a_diverged_fp16_run_still_stops(dev, corpus, tmp_path):
    """Non-finite gradients every step: S halves to its floor without counting (2 -> 1), then the
    overflows at S = 1 count as ordinary skips and the run stops after max_consecutive_skips of them."""
    faults = [Fault("nan_grad", s) for s in range(1, 9)]
    run = tmp_path / "run"
    with Trainer(fp16(corpus, max_consecutive_skips=3), run, dev, faults=faults) as t:
        t.scaler = LossScaler(2.0)
        with pytest.raises(CatchatError, match="3 consecutive steps were skipped"):
            t.run()
        assert t.global_step == 4 and t.scaler.scale == 1.0
    reasons = [(e["reason"], e["consecutive"]) for e in events(run, "skipped_step")]
    assert reasons[0] == ("fp16 overflow, loss scale 2 -> 1", 0)
    assert [c for _, c in reasons[1:]] == [1, 2, 3] and all("non-finite" in r for r, _ in reasons[1:])


def test_damaged_loss_scale_is_refused(tmp_path):
    state = {"format_version": ck.FORMAT_VERSION, "global_step": 3, "config": {}, "vocab_fingerprint": "x",
             "applied_steps": 3, "seqs": 0, "cycle": 0, "run_seed": 0, "cursor": {},
             "loss_scale": {"scale": 3.0, "good_steps": 1}}
    assert ck.state_problems(state, tmp_path / "step-0000003", for_resume=True) == [
        "loss_scale: scale must be a power of two, got 3.0"]
    state["loss_scale"]["scale"] = 8.0
    assert ck.state_problems(state, tmp_path / "step-0000003", for_resume=True) == []


@pytest.mark.parametrize("value,needle", [("bf16", "bfloat16 cooperative matrices"),
                                          ("fp8", 'train.precision must be one of "fp32", "fp16", got "fp8"')])
def test_train_precision_flag_refuses(cli, corpus, tmp_path, value, needle):
    code, _, err = cli("train", "configs/tiny.toml", "--run-dir", tmp_path / "r", "--precision", value)
    assert code == 2 and needle in err and not (tmp_path / "r").exists()
