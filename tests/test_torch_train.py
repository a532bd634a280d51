"""Issue 36 item 3: the speedrun's PyTorch row (catchat/analysis/torch_train.py, torch_program.py and
tools/speedrun.py --torch). Without torch: the command lines and rows, the arguments that mirror `catchat
train`'s, the refusals, the schedule, the reset segments, the dropout masks and the feed. With torch (CPU):
training steps equal catchat's numpy reference in float64, the eval scores what catchat's eval scores (the
reference and the Vulkan program) on the same weights, and a run's loss falls; tools/speedrun.py's rows."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.analysis import torch_train as tt
from catchat.analysis.torch_program import reset_segments, torch_name
from catchat.data import vocab
from catchat.data.corpus import open_corpus
from catchat.data.lanes import Lanes
from catchat.errors import UsageError
from catchat.model import ParamLayout, init_params
from catchat.model import reference as ref
from catchat.rng import step_seed
from catchat.training.feed import Feed
from catchat.training.step import step_lr

from support import build_scene_corpus, load_tool, small_config

ROOT = Path(__file__).resolve().parent.parent
SHRINK = ["model.hidden=12", "model.layers=1", "data.batch_lanes=4", "data.window=16", "eval.eval_windows=1",
          "eval.eval_every_seqs=0", "eval.sample_chars=0"]


def speedrun_tool():
    return load_tool("speedrun")


def events(run, kind=None):
    evs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return [e for e in evs if kind is None or e["event"] == kind]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    return build_scene_corpus(tmp_path_factory.mktemp("torch-scenes"))


# ------------------------------------------------------------------------------ without torch
def test_speedrun_torch_rows_run_the_torch_trainer_with_the_same_arguments(tmp_path):
    sr = speedrun_tool()
    d = tmp_path / "t"
    for engine, head in (("catchat", ["-m", "catchat", "train"]), ("torch", ["-m", "catchat.analysis.torch_train"])):
        cmd = sr.train_command(engine, "configs/speedrun.toml", 300.0, d, ["data.corpus=X", "train.lr=2e-3"])
        assert cmd == [sys.executable, *head, "configs/speedrun.toml", "--run-dir", str(d), "--time-budget", "300",
                       "--set", "data.corpus=X", "--set", "train.lr=2e-3"]
        assert "--time-budget" not in sr.train_command(engine, "c.toml", 0.0, d, [])  # the config's own length
    other = sr.train_command("torch", "c.toml", 0.0, d, [], "/opt/py")  # --torch-python
    assert other[:3] == ["/opt/py", "-m", "catchat.analysis.torch_train"]
    s = {"steps": 2048, "tokens_per_s": 512345.6, "loss": 1.45678}
    assert sr.format_row("t", ["data.lane_order=longest_first"], s, 301.25, "torch") == \
        "| t | PyTorch, data.lane_order=longest_first | 2,048 | 512,346 | 1.4568 | 301.2 |"
    assert sr.format_row("t", [], s, 3.0, "torch").startswith("| t | PyTorch | 2,048 |")
    assert sr.format_row("c", [], s, 3.0).startswith("| c | - | 2,048 |")
    args = sr.parse_args(["coop", "--torch", "torch", "--torch", "tl:data.lane_order=longest_first", "--budget", "0"])
    assert args.variants == ["coop"] and args.torch_variants == ["torch", "tl:data.lane_order=longest_first"]
    assert args.budget == 0.0 and args.torch_python == sys.executable
    assert sr.parse_args(["--torch", "t"]).variants == []  # torch rows alone
    for bad in ([], ["a", "--torch", "a"]):  # nothing to run; two rows in one run directory
        with pytest.raises(SystemExit):
            sr.parse_args(bad)


def test_time_budget_and_sets_apply_as_catchat_train_applies_them():
    """--time-budget first (budget, no step plan), the --sets after it: a step cap set there wins."""
    assert cfgmod.budget_overrides(None, ["train.lr=1e-3"]) == ["train.lr=1e-3"]
    cfg = cfgmod.load(ROOT / "configs" / "tiny.toml", cfgmod.budget_overrides(240.0, []))
    assert (cfg.train.time_budget_s, cfg.train.total_steps, cfg.train.cycles) == (240.0, 0, 0.0)
    cfg = cfgmod.load(ROOT / "configs" / "tiny.toml", cfgmod.budget_overrides(240.0, ["train.total_steps=50"]))
    assert (cfg.train.time_budget_s, cfg.train.total_steps) == (240.0, 50)
    args = tt.parse_args(["configs/speedrun.toml", "--time-budget", "300", "--set", "data.corpus=D"])
    assert (args.time_budget, args.overrides, args.device, args.amp) == (300.0, ["data.corpus=D"], "auto", "auto")
    with pytest.raises(SystemExit):
        tt.parse_args(["c.toml", "--time-budget", "0"])


def test_what_cannot_be_trained_the_same_is_refused_by_name():
    assert tt.refusals(cfgmod.load(ROOT / "configs" / "speedrun.toml")) == []
    assert tt.refusals(cfgmod.load(ROOT / "configs" / "tiny.toml")) == []
    cfg = cfgmod.load(ROOT / "configs" / "tiny.toml", ["train.gradh_clamp=1", "train.spectral_bound=2",
                                                       "teacher_forcing.start=0.9"])
    assert [r.split(":")[0] for r in tt.refusals(cfg)] == ["train.gradh_clamp", "train.spectral_bound",
                                                          "teacher_forcing"]
    with pytest.raises(UsageError, match="train.gradh_clamp"):
        tt.train(cfgmod.load(ROOT / "configs" / "tiny.toml", ["train.gradh_clamp=1"]), Path("/nonexistent"))


def test_amp_follows_the_configs_precision_on_cuda_only():
    fp16 = cfgmod.load(ROOT / "configs" / "speedrun.toml")
    fp32 = cfgmod.load(ROOT / "configs" / "tiny.toml")
    assert tt.amp_for(fp16, "cuda", "auto") and not tt.amp_for(fp32, "cuda", "auto")
    assert not tt.amp_for(fp16, "cpu", "auto") and not tt.amp_for(fp16, "cuda", "off")
    assert tt.amp_for(fp32, "cuda", "bf16")
    with pytest.raises(UsageError, match="CUDA only"):
        tt.amp_for(fp16, "cpu", "bf16")


def test_reset_segments_cut_where_any_lane_resets_after_step_0():
    r = np.zeros((8, 3), np.uint32)
    assert reset_segments(r) == [(0, 8)]
    r[0, :] = 1  # step 0's resets apply to the carried state: no cut
    assert reset_segments(r) == [(0, 8)]
    r[3, 1] = r[3, 2] = r[5, 0] = r[7, 2] = 1
    assert reset_segments(r) == [(0, 3), (3, 5), (5, 7), (7, 8)]


def test_dropout_masks_are_catchats():
    layout = ParamLayout(cfgmod.model_spec(cfgmod.load(ROOT / "configs" / "tiny.toml")))
    V, H, L = layout.spec.vocab_size, layout.spec.hidden, layout.spec.layers
    seed = step_seed(3, 17, 1)
    rows, hid = ref.dropout_scales(layout.spec, 5, seed, 0.1, 0.15)
    assert rows.shape == (V,) and hid.shape == (L, 5, H)
    keep = ref.embedding_keep_mask(seed, V, 0.1)
    np.testing.assert_allclose(rows, math.sqrt(H) * keep / 0.9, rtol=1e-15)
    assert 0 < keep.sum() < V
    for l in range(L):
        np.testing.assert_allclose(hid[l], ref.hidden_keep_mask(seed, l, 5, H, 0.15) / 0.85, rtol=1e-15)
    assert not np.array_equal(hid[0], ref.dropout_scales(layout.spec, 5, step_seed(3, 18, 1), 0.1, 0.15)[1][0])
    rows, hid = ref.dropout_scales(layout.spec, 5, seed, 0.0, 0.0)  # no dropout: sqrt(H) and ones
    assert np.all(rows == math.sqrt(H)) and np.all(hid == 1.0)


def test_torch_names_are_torch_twins_modules():
    assert [torch_name(n) for n in ("embedding.weight", "layers.2.gru.weight_ih", "layers.2.gru.bias_hh",
                                    "layers.0.norm.weight", "head.weight")] == \
        ["emb.weight", "grus.2.weight_ih_l0", "grus.2.bias_hh_l0", "norms.0.weight", "head.weight"]


def test_the_feed_is_catchats_with_the_steps_masks(scenes):
    cfg = small_config(scenes)
    lanes = Lanes.from_config(open_corpus(cfg.data.corpus), cfg, "train")
    layout = ParamLayout(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE))
    cur = lanes.start()
    for gs in range(3):
        mine, after = tt.MaskedFeed(lanes, cfg, layout).step_data(cur, gs)
        theirs, same = Feed(lanes, cfg).step_data(cur, gs)
        assert after == same and len(mine) == len(theirs) == cfg.data.micro_batches
        for k, (a, b) in enumerate(zip(mine, theirs)):
            for x, y in zip(a[:3], b):
                np.testing.assert_array_equal(x, y)
            masks = ref.dropout_scales(layout.spec, cfg.data.batch_lanes, step_seed(cfg.train.seed, gs, k),
                                       cfg.train.dropout_embedding, cfg.train.dropout_hidden)
            np.testing.assert_array_equal(a[3], masks[0])
            np.testing.assert_array_equal(a[4], masks[1])
        cur = after


def test_without_torch_the_trainer_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert tt.main(["configs/tiny.toml"]) == 2
    assert "torch is not importable" in capsys.readouterr().err


# ------------------------------------------------------------------------------ with torch (CPU)
@pytest.mark.parametrize("changes", [dict(train={"optimizer": "nadam", "weight_decay": 0.1, "clip": 0.5}),
                                     dict(train={"optimizer": "adamw", "weight_decay": 0.1, "clip": 0.5},
                                          model={"tie_embeddings": True}, data={"lane_order": "longest_first"})])
def test_training_steps_equal_catchats_reference(scenes, changes):
    """Five steps in float64 (two micro-batches, dropout, label smoothing, clipping, decay, warmup and
    cooldown, the state carried) against reference_train_step on the same data and init."""
    torch = pytest.importorskip("torch")
    from catchat.analysis.torch_program import TorchProgram

    cfg = cfgmod.with_changes(small_config(scenes), **changes)
    t = cfg.train
    lanes = Lanes.from_config(open_corpus(cfg.data.corpus), cfg, "train")
    layout = ParamLayout(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE))
    flat = layout.flatten(init_params(layout.spec, t.seed)).astype(np.float64)
    prog = TorchProgram(cfg, layout, cfg.data.batch_lanes, "cpu", dtype=torch.float64)
    prog.set_params(flat)
    m, v = np.zeros_like(flat), np.zeros_like(flat)
    h = np.zeros((layout.spec.layers, cfg.data.batch_lanes, layout.spec.hidden))
    feed, cur = tt.MaskedFeed(lanes, cfg, layout), lanes.start()
    for gs in range(5):
        batches, cur = feed.take(cur, gs)
        lr, _ = step_lr(None, gs, t.total_steps, cfg)
        st = prog.train_step(batches, lr=lr, n_valid=sum(int(np.count_nonzero(b[1])) for b in batches))
        r = ref.reference_train_step(flat, m, v, layout, [(b[0], b[1], b[2], h if k == 0 else None)
                                                          for k, b in enumerate(batches)],
                                     global_step=gs, lr=lr, optimizer=t.optimizer, b1=t.beta1, b2=t.beta2, eps=t.eps,
                                     wd=t.weight_decay, clip=t.clip, smoothing=t.label_smoothing,
                                     p_emb=t.dropout_embedding, p_hid=t.dropout_hidden, run_seed=t.seed)
        h = r["hT"][-1]
        assert st["loss"] == pytest.approx(r["loss"], rel=1e-9)
        assert st["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-8)
        assert (st["clipped"], st["skipped"]) == (r["clipped"], r["skipped"]) == (True, False)
        # torch's NAdam keeps its mu product in float32: ~1e-8 of a coefficient, 1e-9 of a weight
        np.testing.assert_allclose(prog.get_params(np.float64), flat, rtol=0, atol=1e-8)
        np.testing.assert_allclose(prog.get_carry(), h, rtol=0, atol=1e-8)


def test_a_run_learns_and_its_eval_is_catchats_eval_of_the_same_weights(scenes, tmp_path, dev):
    """A few float32 steps on the CPU: a finite loss that falls, interval and final evals; the final eval
    equals catchat's numpy reference and catchat's own Vulkan eval of the saved weights on the held-out
    lanes (all of them), and the speedrun's summary reads the run."""
    torch = pytest.importorskip("torch")
    from catchat.analysis.landscape.evaluation import EvalSlice, ReferenceEvaluator
    from catchat.analysis.torch_program import TorchProgram
    from catchat.inference.evaluate import evaluate_lanes
    from catchat.run import tensorfile
    from catchat.vk.program import Program

    cfg = cfgmod.with_changes(small_config(scenes, total_steps=24), train={"optimizer": "nadam", "lr": 0.02},
                              eval={"eval_windows": 0, "eval_every_seqs": 64, "sample_chars": 20})
    run = tmp_path / "run"
    assert tt.train(cfg, run) == "done"
    rows = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()[1:]]
    losses = [float(r[6]) for r in rows]
    assert len(rows) == 24 and all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.3, losses
    evals = events(run, "eval")
    assert [e["global_step"] for e in evals] == [8, 16, 24] and evals[-1]["loss"] < evals[0]["loss"]
    assert (run / "samples" / "step-0000024.txt").read_text().count("=== ") == 3
    assert events(run)[-1]["event"] == "end" and events(run)[-1]["reason"] == "done"

    layout = ParamLayout(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE))
    params, _ = tensorfile.read(run / "model.safetensors")
    flat = layout.flatten(params, np.float32)
    held = Lanes.from_config(open_corpus(cfg.data.corpus), cfg, "eval")
    windows = [held.window(0, i) for i in range(held.windows_per_cycle)]
    reference = ReferenceEvaluator(layout.spec, EvalSlice([(w.tokens, w.targets, w.resets) for w in windows],
                                                          held.T, held.B, "held-out"))(flat)
    prog = Program(dev, layout, held.T, held.B, training=False)
    prog.set_params(flat)
    vulkan = evaluate_lanes(prog, held, 0)
    tp = TorchProgram(cfg, layout, held.B, "cpu")
    tp.set_params(flat)
    mine = evaluate_lanes(tp, held, 0)
    assert mine["n_valid"] == vulkan["n_valid"] == sum(w.n_valid for w in windows)
    assert mine["loss"] == pytest.approx(reference, abs=1e-5) and vulkan["loss"] == pytest.approx(reference, abs=1e-5)
    assert evals[-1]["loss"] == pytest.approx(mine["loss"], abs=1e-6)
    assert (mine["top1"], mine["top5"]) == pytest.approx((vulkan["top1"], vulkan["top5"]), abs=2 / mine["n_valid"])
    s = speedrun_tool().summarise(run)
    assert s["steps"] == 24 and s["loss"] == evals[-1]["loss"] and s["tokens_per_s"] > 0
    del torch


def test_a_budgeted_run_ends_inside_its_budget_on_catchats_pace(scenes, tmp_path):
    """train.time_budget_s: catchat's TimeBudget plans the steps (its eval probe included, free-running
    evals skipped with a note), the last step at lr_min, then the final save and eval inside the budget;
    `catchat scan` finds the lr on lr_at_progress of the progress column."""
    pytest.importorskip("torch")
    from catchat.analysis.scan import scan_run

    cfg = cfgmod.with_changes(small_config(scenes), train={"time_budget_s": 6.0, "total_steps": 0})
    assert cfg.eval.free_running
    run = tmp_path / "run"
    assert tt.train(cfg, run) == "done"  # the clock from now (the CLI's: from the process's start)
    start, end = events(run, "start")[0], events(run, "end")[-1]
    assert start["notes"] == ["eval.free_running skipped: the PyTorch row scores teacher-forced"]
    assert start["schedule"]["time_budget_s"] == 6.0 and events(run, "time_budget")
    assert end["progress"] == 1.0 and end["elapsed_s"] < 6.0 and end["global_step"] > 0
    assert events(run)[-2]["event"] == "eval" and events(run)[-2]["global_step"] == end["global_step"]
    last = (run / "metrics.csv").read_text().splitlines()[-1].split(",")
    assert float(last[4]) == pytest.approx(cfg.schedule.lr_min) and float(last[15]) == 1.0
    report = scan_run(run)
    assert report.status("lr vs schedule") == "ok", report.finding("lr vs schedule")
    assert "follow the WSD formula" in report.finding("lr vs schedule").detail and not report.defects


def test_speedrun_tool_prints_pytorch_rows_beside_catchats(tmp_path):
    """--budget 0 and 3 steps: catchat (lavapipe) and PyTorch (CPU), both FP32 from the same init on the same
    data, end at the same held-out loss; a budgeted PyTorch row ends inside its budget, start-up included."""
    pytest.importorskip("torch")
    sets = [a for s in SHRINK + ["train.time_budget_s=0", "train.total_steps=3", "train.precision=fp32",
                                    "eval.eval_every_seqs=1000"]
            for a in ("--set", s)]
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "speedrun.py"), "c", "--torch", "t", "--budget", "0",
                        "--runs-dir", str(tmp_path), *sets], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")] for line in r.stdout.splitlines()[2:])}
    assert rows["c"][1] == "-" and rows["t"][1] == "PyTorch" and rows["c"][2] == rows["t"][2] == "3", r.stdout
    assert float(rows["t"][4]) == pytest.approx(float(rows["c"][4]), abs=2e-4)
    assert cfgmod.load(tmp_path / "t" / "config.toml").train.total_steps == 3

    budget = 25.0
    sets = [a for s in SHRINK for a in ("--set", s)]
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "speedrun.py"), "--torch", "hot:train.lr=0.02",
                        "--budget", f"{budget:g}", "--runs-dir", str(tmp_path), *sets],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    name, changes, steps, _, loss, wall = [x.strip() for x in r.stdout.splitlines()[2].strip("|").split("|")]
    assert (name, changes) == ("hot", "PyTorch, train.lr=0.02") and int(steps.replace(",", "")) > 0
    assert 0 < float(loss) < math.log(101) and float(wall) <= budget + 2.5
    end = events(tmp_path / "hot", "end")[-1]
    assert end["reason"] == "done" and end["time_budget_s"] == budget and end["progress"] == 1.0
    assert events(tmp_path / "hot", "time_budget")
