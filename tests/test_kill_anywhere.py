"""Kill anywhere (issue 17): `catchat train` is SIGKILLed at 24 exact points across checkpoint
saves, pruning, resume start-up and branching (faults.CRASH_ENV; the K of each save/prune point
is drawn from a seeded generator). After every kill an invariant checker looks at the run as the
user left it and as the next catchat sees it; then the run is continued and must end bitwise equal
to a run never stopped."""

import csv
import json

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.run import checkpoint as ck
from catchat.run import rundir
from catchat.train import Trainer

from support import TOTAL, assert_same_as_straight, catchat, losses, snapshot

RNG = np.random.default_rng(17)
K = lambda lo, hi: int(RNG.integers(lo, hi + 1))  # noqa: E731  a seeded hit count

# (setup, crash point). Setups: "fresh" a new run; "tail" a run killed inside step 15's save (rows
# 1..15, latest 12) then resumed; "branch" a run stopped at 24 then resumed from step-0000021;
# "attempt" a run killed before its first checkpoint, then started afresh.
SCENARIOS = [
    ("fresh", f"save.written#{K(1, 9)}"), ("fresh", f"save.written#{K(1, 9)}"),
    ("fresh", f"save.renamed#{K(1, 9)}"), ("fresh", f"save.renamed#{K(1, 9)}"),
    ("fresh", f"save.latest#{K(1, 9)}"), ("fresh", f"save.latest#{K(1, 9)}"),
    ("fresh", f"prune.retired#{K(1, 7)}"), ("fresh", f"prune.retired#{K(1, 7)}"),
    ("tail", "resume.config"), ("tail", "resume.trimmed"), ("tail", f"save.renamed#{K(1, 5)}"),
    ("branch", "branch.side_written"), ("branch", "branch.committed"), ("branch", "branch.latest"),
    ("branch", "branch.moved"), ("branch", "branch.metrics"), ("branch", "branch.events"),
    ("branch", "resume.config"), ("branch", "resume.trimmed"), ("branch", "save.latest#1"),
    ("branch", "prune.retired#1"), ("branch", f"save.written#{K(1, 3)}"),
    ("attempt", "branch.committed"), ("attempt", "branch.metrics"),
]

# The same kills on runs whose resume has more to restore (issue 39): fp16 GEMMs (on lavapipe gemm.comp's
# ROUND_HALF path) with the dynamic loss scale, and every regulariser on, the teacher-forcing decay
# (tf < 1: scheduled sampling draws from the RNG per timestep) and the prefix masks included. A few
# points each, not all 24: a save and a step mid-run each, and a resume over a crash tail at fp16 (the
# state a resume restores; the branch and recovery paths do not depend on the config and are the 24's).
# The K are drawn after SCENARIOS', so theirs stay as they were.
VARIANTS = {
    "fp16": {"train": {"precision": "fp16"}},
    "regularised": {"train": {"weight_decay": 0.01, "gradh_clamp": 0.002, "spectral_bound": 0.8,
                              "dropout_hidden": 0.2, "dropout_embedding": 0.1, "label_smoothing": 0.1},
                    "data": {"prefix_dropout": 0.3},
                    "teacher_forcing": {"start": 0.9, "floor": 0.7, "schedule": "linear", "decay_cycles": 1.0}},
}
# fp16 with the loss scale moved before the checkpoints: two injected NaN gradients skip steps 2 and 5,
# each halving S (65536 -> 32768 -> 16384), so checkpoint 6 holds S = 16384 with 1 good step, where the
# "fp16" variant's S stays 65536 and a resume that lost it would not show.
VARIANTS["fp16-moved-scale"] = VARIANTS["fp16"]
MOVED_SCALE_FAULTS = "nan_grad@step=2,nan_grad@step=5"
VARIANT_SCENARIOS = [
    ("fp16", "fresh", f"save.renamed#{K(1, 9)}"), ("fp16", "fresh", f"train.step#{K(2, 29)}"),
    ("fp16", "tail", "resume.trimmed"),
    ("regularised", "fresh", f"save.latest#{K(1, 9)}"), ("regularised", "fresh", f"train.step#{K(2, 29)}"),
]


def train_cli(cfg_path, run, *args, crash=None):
    env = {"CATCHAT_CRASH_AT": crash} if crash else {}
    return catchat("train", cfg_path, "--run-dir", run, *args, env=env)


def set_up(kind, cfg_path, run, exact_run_at=None) -> tuple:
    """Bring the run to the scenario's starting point; returns the arguments of the command to kill.
    "branch" (the exact config only): the run stopped at 24, trained once a session (conftest.py)."""
    if kind == "fresh":
        return ()
    if kind == "tail":
        assert train_cli(cfg_path, run, crash="save.written#5").returncode == -9
        return ("--resume",)
    if kind == "branch":
        exact_run_at(24, run)
        return ("--resume", run / "checkpoints" / "step-0000021")
    assert train_cli(cfg_path, run, crash="save.written#1").returncode == -9  # "attempt"
    return ()


def check_invariants(run, straight, foreign: dict) -> None:
    """What must hold right after a kill, and after the next catchat's recovery."""
    assert snapshot(run / "user") == foreign, "a user's file was touched"
    pending = [p for p in (run / "branches").glob("*/PENDING")] if (run / "branches").exists() else []
    assert len(pending) <= 1
    rows = losses(run)  # contiguous from step 1, each equal to the uninterrupted run's row
    assert rows == losses(straight)[:len(rows)]
    steps = [int(x.split(",")[0]) for x in (run / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == list(range(1, len(steps) + 1))
    for p in ck.list_checkpoints(run / "checkpoints"):  # nothing listed is partial
        ck.load_checkpoint(p, with_optimizer=True)
    if ck.list_checkpoints(run / "checkpoints"):
        latest = ck.load_checkpoint(run, with_optimizer=True)  # loads and verifies
        assert latest.global_step <= len(steps)
    files = rundir.RunFiles(run)
    lock = rundir.RunLock(files.lock)  # what the next catchat does first
    try:
        rundir.recover(files)
    finally:
        lock.release()
    assert not list(run.glob("branches/*/PENDING"))
    live = ck.list_checkpoints(run / "checkpoints")
    if live:
        assert ck.resolve(run) == live[-1], "latest must name the live branch's newest checkpoint"
        assert ck.dir_step(live[-1]) <= len(losses(run))
    evs = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()] if files.events.exists() else []
    assert all(e["global_step"] <= len(losses(run)) for e in evs)
    assert len([e for e in evs if e["event"] == "branch"]) <= 1


@pytest.mark.parametrize("kind,point", SCENARIOS, ids=[f"{k}-{p}" for k, p in SCENARIOS])
def test_kill_anywhere(dev, cfg_path, straight, exact_run_at, tmp_path, kind, point):
    kill_and_continue(dev, cfg_path, straight, tmp_path, kind, point, exact_run_at)


_VARIANT_RUNS: dict = {}


@pytest.fixture
def variant_run(dev, corpus_dir, tmp_path_factory):
    """(config path, the uninterrupted run) of a variant, made once per session."""
    from support import config_text

    def get(name):
        if name not in _VARIANT_RUNS:
            root = tmp_path_factory.mktemp(f"variant-{name}")
            cfg = root / f"{name}.toml"
            cfg.write_text(config_text(corpus_dir, **VARIANTS[name]))
            with Trainer(cfgmod.load(cfg), root / "straight", dev) as t:
                assert t.run() == "done"
            _VARIANT_RUNS[name] = cfg, root / "straight"
        return _VARIANT_RUNS[name]
    return get


@pytest.mark.parametrize("variant,kind,point", VARIANT_SCENARIOS, ids=[f"{v}-{k}-{p}" for v, k, p in VARIANT_SCENARIOS])
def test_kill_anywhere_variants(dev, variant_run, tmp_path, variant, kind, point):
    cfg_path, straight = variant_run(variant)
    kill_and_continue(dev, cfg_path, straight, tmp_path, kind, point)


def kill_and_continue(dev, cfg_path, straight, tmp_path, kind, point, exact_run_at=None):
    """Bring a run to the scenario, kill it at `point`, check it, continue it: bitwise the straight run."""
    run = tmp_path / "run"
    (run / "user").mkdir(parents=True)
    (run / "user" / "notes.md").write_text("my notes on this run\n")
    foreign = snapshot(run / "user")
    args = set_up(kind, cfg_path, run, exact_run_at)
    r = train_cli(cfg_path, run, *args, crash=point)
    assert r.returncode == -9, f"{point} was never reached: {r.stdout + r.stderr}"
    check_invariants(run, straight, foreign)
    resume = "" if ck.list_checkpoints(run / "checkpoints") else None
    with Trainer(cfgmod.load(cfg_path), run, dev, resume=resume) as t:
        assert t.run() == "done"
    assert_same_as_straight(run, straight)
    assert len(losses(run)) == TOTAL
    assert snapshot(run / "user") == foreign
    assert '"metrics_gap"' not in (run / "events.jsonl").read_text()  # a kill's own tail is no gap to report


def _loss_scales(run) -> list[str]:
    with open(run / "metrics.csv") as f:
        return [r["loss_scale"] for r in csv.DictReader(f)]


@pytest.mark.parametrize("point", ["train.step#9", "save.renamed#2"])
def test_fp16_loss_scale_moved_before_the_kill_is_restored(dev, variant_run, tmp_path, monkeypatch, point):
    """The loss scale changed before the checkpoint a kill leaves (S = 16384, not the start's 65536):
    the resumed run equals the uninterrupted one bitwise, its loss_scale column and final scale too.
    train.step#9: killed at step 9's start (latest step 6); save.renamed#2: inside step 6's save."""
    monkeypatch.setenv("CATCHAT_FAULT", MOVED_SCALE_FAULTS)  # the straight run, the CLI and the continuation
    cfg_path, straight = variant_run("fp16-moved-scale")
    scales = _loss_scales(straight)
    assert scales[:6] == ["65536", "65536", "32768", "32768", "32768", "16384"], scales
    run = tmp_path / "run"
    r = train_cli(cfg_path, run, crash=point)
    assert r.returncode == -9, r.stdout + r.stderr
    resumed_from = ck.load_checkpoint(run / "checkpoints" / "step-0000006")  # what the next trainer takes
    assert resumed_from.state["loss_scale"] == {"scale": 16384.0, "good_steps": 1}
    with Trainer(cfgmod.load(cfg_path), run, dev, resume="") as t:
        assert t.run() == "done"
    assert_same_as_straight(run, straight)
    assert _loss_scales(run) == scales
    assert ck.load_checkpoint(run).state["loss_scale"] == ck.load_checkpoint(straight).state["loss_scale"]


def test_a_resume_that_lost_the_loss_scale_would_show(dev, variant_run, tmp_path, monkeypatch):
    """The check above has teeth: the same resume with the checkpoint's scale dropped (a fresh 65536)
    differs from the uninterrupted run."""
    from catchat.precision import LossScaler
    from catchat.training import checkpoints

    monkeypatch.setenv("CATCHAT_FAULT", MOVED_SCALE_FAULTS)
    cfg_path, straight = variant_run("fp16-moved-scale")
    run = tmp_path / "run"
    with Trainer(cfgmod.load(cfg_path), run, dev) as t:
        t.run(stop_after_steps=6)
    monkeypatch.setattr(checkpoints, "_restore_precision", lambda *a: LossScaler())
    with Trainer(cfgmod.load(cfg_path), run, dev, resume="") as t:
        assert t.run() == "done"
    assert _loss_scales(run)[6] == "65536" != _loss_scales(straight)[6]
    assert ck.load_checkpoint(run).state["loss_scale"] != ck.load_checkpoint(straight).state["loss_scale"]
