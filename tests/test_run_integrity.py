"""Runs never lose data off the straight path (issue 17): branching back to an older checkpoint,
keep_last across branches, two processes on one run, a refused resume, Ctrl-C during resume
start-up, edited state, identical saves, a second Ctrl-C, leftovers of a killed process.
Each through the real CLI; docs/reliability.md has the fault table."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from catchat import checkpoint as ck
from catchat import config as cfgmod
from catchat import faults
from catchat.train import Trainer

from support import (TOTAL, assert_clean_error, assert_same_as_straight, build_scene_corpus, catchat, config_text,
                     losses, resume_cli, rows_logged, snapshot, start_training, wait_for_rows)

EVERY = 3  # checkpoint_every_seqs 24 = 3 steps of 8 seqs; keep_last 2


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return build_scene_corpus(tmp_path_factory.mktemp("scenes"))


@pytest.fixture(scope="module")
def cfg_path(corpus_dir, tmp_path_factory):
    p = tmp_path_factory.mktemp("cfg") / "exact.toml"
    p.write_text(config_text(corpus_dir))
    return p


@pytest.fixture(scope="module")
def straight(dev, cfg_path, tmp_path_factory):
    run = tmp_path_factory.mktemp("straight") / "run"
    with Trainer(cfgmod.load(cfg_path), run, dev) as t:
        assert t.run() == "done"
    return run


def train_to(dev, cfg_path, run, steps, resume=None):
    """In-process training of `steps` more steps (fast): the setup of a scenario."""
    with Trainer(cfgmod.load(cfg_path), run, dev, resume=resume) as t:
        t.run(stop_after_steps=steps)


def events(run, kind=None):
    evs = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    return [e for e in evs if kind is None or e["event"] == kind]


def steps_of(run):
    return [int(x.split(",")[0]) for x in (run / "metrics.csv").read_text().splitlines()[1:]]


def live_checkpoints(run):
    return [p.name for p in ck.list_checkpoints(run / "checkpoints")]


def crash(cfg_path, run, point, *args, code=-signal.SIGKILL):
    """`catchat train` stopped at a crash point (faults.CRASH_ENV); returns the finished process."""
    r = catchat("train", cfg_path, "--run-dir", run, *args, env={faults.CRASH_ENV: point})
    assert r.returncode == code, (point, r.returncode, r.stdout + r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
    return r


# ------------------------------------------------------------------------------ branches (items 3, 4, 14)
def test_branch_moves_the_newer_history_aside_and_resume_stays_on_it(dev, cfg_path, straight, tmp_path):
    """Resuming from an older checkpoint is a branch: the newer checkpoints, rows and events move to
    branches/NN-after-step-S (nothing deleted), `latest` names the branch point at once, so a kill
    right after start-up and a plain --resume continue the new branch, not the abandoned one."""
    run = tmp_path / "run"
    train_to(dev, cfg_path, run, 24)  # checkpoints 21, 24 (keep_last 2); an eval at 24
    abandoned_rows = (run / "metrics.csv").read_text().splitlines()[22:]
    crash(cfg_path, run, "resume.trimmed", "--resume", run / "checkpoints" / "step-0000021")
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-0000021"
    assert live_checkpoints(run) == ["step-0000021"]
    assert steps_of(run) == list(range(1, 22))
    side = run / "branches" / "01-after-step-0000021"
    assert [p.name for p in ck.list_checkpoints(side / "checkpoints")] == ["step-0000024"]
    assert (side / "metrics.csv").read_text().splitlines()[1:] == abandoned_rows
    side_events = [json.loads(x) for x in (side / "events.jsonl").read_text().splitlines()]
    assert {(e["event"], e["global_step"]) for e in side_events} >= {("eval", 24), ("checkpoint", 24)}
    assert not (side / "PENDING").exists()
    [br] = events(run, "branch")
    assert (br["branch_step"], br["abandoned_step"], br["side_dir"]) == (21, 24, "branches/01-after-step-0000021")
    assert all(e["global_step"] <= 21 for e in events(run))
    resume_cli(cfg_path, run)
    assert_same_as_straight(run, straight)
    assert [e["global_step"] for e in events(run, "resume")] == [21]
    ck.load_checkpoint(side / "checkpoints" / "step-0000024", with_optimizer=True)  # kept whole
    assert catchat("scan", run).returncode == 0


def test_keep_last_prunes_only_the_live_branch(dev, cfg_path, straight, tmp_path):
    """keep_last after branching back: the new branch's checkpoints are kept, the resume source goes
    only once keep_last newer ones of its own branch are on disk; the abandoned ones stay aside."""
    run = tmp_path / "run"
    train_to(dev, cfg_path, run, 24)  # live: 21, 24
    side = run / "branches" / "01-after-step-0000021" / "checkpoints"
    r = catchat("train", cfg_path, "--run-dir", run, "--resume", run / "checkpoints" / "step-0000021",
                "--stop-after-steps", EVERY)
    assert r.returncode == 0, r.stdout + r.stderr
    assert live_checkpoints(run) == ["step-0000021", "step-0000024"]  # the source is still there
    assert [p.name for p in ck.list_checkpoints(side)] == ["step-0000024"]
    train_to(dev, cfg_path, run, EVERY, resume="")
    assert live_checkpoints(run) == ["step-0000024", "step-0000027"]  # 21 went only now
    assert [p.name for p in ck.list_checkpoints(side)] == ["step-0000024"]
    live24 = ck.load_checkpoint(run / "checkpoints" / "step-0000024")
    old24 = ck.load_checkpoint(side / "step-0000024")
    for name in live24.params:  # the same data and seeds: the branch re-made the same step 24
        np.testing.assert_array_equal(live24.params[name], old24.params[name])
    assert losses(run) == losses(straight)[:27]


def test_resume_from_a_pruned_checkpoint_is_refused(dev, cfg_path, tmp_path):
    run = tmp_path / "run"
    train_to(dev, cfg_path, run, 24)
    before = snapshot(run)
    assert_clean_error(catchat("train", cfg_path, "--run-dir", run, "--resume", run / "checkpoints" / "step-0000018"),
                       2, "no checkpoint at")
    assert snapshot(run) == before
