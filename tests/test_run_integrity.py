"""Runs never lose data off the straight path (issue 17): branching back to an older checkpoint,
keep_last across branches, two processes on one run, a refused resume, Ctrl-C during resume
start-up, edited state, identical saves, a second Ctrl-C, leftovers of a killed process.
Each through the real CLI; docs/reliability.md has the fault table."""

import json
import os
import signal

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.errors import UsageError
from catchat.run import checkpoint as ck
from catchat.run import faults, rundir
from catchat.train import Trainer

from support import (
    TOTAL,
    assert_clean_error,
    assert_same_as_straight,
    catchat,
    config_text,
    losses,
    resume_cli,
    rows_logged,
    snapshot,
    start_training,
    wait_for_rows,
)

EVERY = 3  # checkpoint_every_seqs 24 = 3 steps of 8 seqs; keep_last 2


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
def test_branch_moves_the_newer_history_aside_and_resume_stays_on_it(cfg_path, straight, exact_run_at, tmp_path):
    """Resuming from an older checkpoint is a branch: the newer checkpoints, rows and events move to
    branches/NN-after-step-S (nothing deleted), `latest` names the branch point at once, so a kill
    right after start-up and a plain --resume continue the new branch, not the abandoned one."""
    run = tmp_path / "run"
    exact_run_at(24, run)  # checkpoints 21, 24 (keep_last 2); an eval at 24
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


def test_keep_last_prunes_only_the_live_branch(dev, cfg_path, straight, exact_run_at, tmp_path):
    """keep_last after branching back: the new branch's checkpoints are kept, the resume source goes
    only once keep_last newer ones of its own branch are on disk; the abandoned ones stay aside."""
    run = tmp_path / "run"
    exact_run_at(24, run)  # live: 21, 24
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


def test_resume_from_a_pruned_checkpoint_is_refused(cfg_path, exact_run_at, tmp_path):
    run = tmp_path / "run"
    exact_run_at(24, run)
    before = snapshot(run)
    assert_clean_error(catchat("train", cfg_path, "--run-dir", run, "--resume", run / "checkpoints" / "step-0000018"),
                       2, "no checkpoint at")
    assert snapshot(run) == before


# ------------------------------------------------------------------------------ start-up (items 2, 5, 14)
@pytest.mark.parametrize("point", ["resume.config", "resume.trimmed"])
def test_ctrl_c_during_resume_start_up_loses_nothing(dev, cfg_path, straight, tmp_path, point):
    """Ctrl-C while a resume rewrites the telemetry (a crash tail after the last checkpoint is being
    dropped): the files change whole or not at all, never to 0 bytes; resuming then ends equal."""
    run = tmp_path / "run"
    crash(cfg_path, run, "save.written#5")  # killed inside step 15's save: rows 1..15, latest step 12
    assert steps_of(run) == list(range(1, 16)) and live_checkpoints(run) == ["step-0000009", "step-0000012"]
    r = crash(cfg_path, run, f"{point}:INT", "--resume", code=130)
    assert "interrupted" in r.stderr or "aborted" in r.stderr
    assert steps_of(run) == list(range(1, 13))  # the deferred Ctrl-C lands after the whole rewrite
    assert [e["global_step"] for e in events(run, "resume")] == [12]
    resume_cli(cfg_path, run)
    assert_same_as_straight(run, straight)


@pytest.mark.parametrize("args,needle", [
    (("--set", "model.hidden=16"), "does not match the model config"),
    (("--set", "data.batch_lanes=2"), "carried state (2, 4, 12) does not match data.batch_lanes"),
    (("--set", "train.optimizer=nadam"), "was trained with adamw"),
])
def test_a_refused_resume_writes_nothing(cfg_path, exact_run_at, tmp_path, args, needle):
    run = tmp_path / "run"
    exact_run_at(5, run)
    crash(cfg_path, run, "save.latest#1", "--resume")  # killed before pruning: step-0000003 stays there
    assert live_checkpoints(run) == ["step-0000003", "step-0000005", "step-0000006"]
    before = snapshot(run)
    assert_clean_error(catchat("train", cfg_path, "--run-dir", run, "--resume", *args), 2, needle)
    assert snapshot(run) == before


def test_a_failed_start_leaves_no_new_run_directory(cfg_path, tmp_path):
    run = tmp_path / "runs" / "new"
    assert_clean_error(catchat("train", cfg_path, "--run-dir", run, "--set", f"data.corpus={tmp_path / 'nope'}"), 2)
    assert not run.exists()
    assert_clean_error(catchat("train", cfg_path, "--run-dir", run, "--resume"), 2, "no checkpoint at")
    assert not run.exists()


def test_leftovers_of_a_killed_process_are_cleaned_at_start(cfg_path, exact_run_at, tmp_path):
    run = tmp_path / "run"
    exact_run_at(6, run)
    leftovers = [run / "checkpoints" / ".step-0000009.k2j4", run / "checkpoints" / ".step-0000003.old.77",
                 run / "branches" / ".tmp-02-after-step-0000003"]
    for d in leftovers:
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"partial")
    for f in (run / "checkpoints" / ".latest.77.tmp", run / ".metrics.csv.77.tmp"):
        f.write_text("partial")
    notes = run / "NOTES.md"
    notes.write_text("my notes")
    r = catchat("train", cfg_path, "--run-dir", run, "--resume", "--stop-after-steps", 1)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p.name for p in run.rglob(".*") if p.name != ".lock"] == []
    assert notes.read_text() == "my notes"


def test_a_fresh_start_keeps_an_earlier_attempts_telemetry(dev, cfg_path, straight, tmp_path):
    """A run killed before its first checkpoint, started again: its rows and events move aside."""
    run = tmp_path / "run"
    crash(cfg_path, run, "save.written#1")  # rows 1..3, no checkpoint
    assert steps_of(run) == [1, 2, 3] and not live_checkpoints(run)
    old_rows = (run / "metrics.csv").read_text().splitlines()[1:]
    r = catchat("train", cfg_path, "--run-dir", run)
    assert r.returncode == 0, r.stdout + r.stderr
    side = run / "branches" / "01-before-fresh-start"
    assert (side / "metrics.csv").read_text().splitlines()[1:] == old_rows
    assert [e["event"] for e in events(run)][:2] == ["branch", "start"]
    assert_same_as_straight(run, straight)


# ------------------------------------------------------------------------------ another run's checkpoint
def test_a_checkpoint_of_another_run(cfg_path, straight, exact_run_at, tmp_path):
    """It may start a new run directory (the resume event says foreign); a run directory with its
    own history refuses it and writes nothing."""
    other = straight / "checkpoints" / "step-0000027"
    r = catchat("train", cfg_path, "--run-dir", tmp_path / "fork", "--resume", other)
    assert r.returncode == 0, r.stdout + r.stderr
    [res] = events(tmp_path / "fork", "resume")
    assert res["foreign"] is True and res["global_step"] == 27
    assert steps_of(tmp_path / "fork") == [28, 29, 30]
    assert losses(tmp_path / "fork") == losses(straight)[27:]
    run = tmp_path / "run"
    exact_run_at(4, run)
    before = snapshot(run)
    assert_clean_error(catchat("train", cfg_path, "--run-dir", run, "--resume", other), 2,
                       "belongs to another run", "new --run-dir")
    assert snapshot(run) == before


# ------------------------------------------------------------------------------ two processes (item 7)
def test_a_second_process_on_a_run_is_refused_naming_the_pid(corpus_dir, tmp_path):
    long_cfg = tmp_path / "long.toml"
    long_cfg.write_text(config_text(corpus_dir, total_steps=100_000))
    run = tmp_path / "run"
    proc = start_training(long_cfg, run)
    try:
        wait_for_rows(proc, run, 2)
        before_rows = rows_logged(run)
        for args in (("--resume",), ()):
            r = catchat("train", long_cfg, "--run-dir", run, *args)
            assert_clean_error(r, 2, f"{run} is in use by another catchat process (pid {proc.pid}", "kill -INT")
        wait_for_rows(proc, run, before_rows + 2)  # the first goes on undisturbed (fails if it died)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    assert proc.returncode == 130
    killer = start_training(long_cfg, tmp_path / "run2")
    wait_for_rows(killer, tmp_path / "run2", 4)
    killer.kill()
    killer.communicate(timeout=60)
    r = catchat("train", long_cfg, "--run-dir", tmp_path / "run2", "--resume", "--stop-after-steps", 1)
    assert r.returncode == 0, r.stdout + r.stderr  # the kernel dropped the dead holder's lock
    assert events(tmp_path / "run2", "resume")[-1]["stale_lock_pid"] == killer.pid


def test_a_deleted_lock_file_does_not_let_a_second_process_in(corpus_dir, tmp_path):
    """Issue 39 item 4: with `.lock` deleted under a running run, a second `train` is still refused
    (the directory's own flock), naming the pid or saying the .lock is gone; it moves and writes
    nothing; the branch and prune code refuse to touch the live writer's checkpoints; the first run
    then finishes with each step logged once."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text(corpus_dir, total_steps=12, checkpoint={"checkpoint_every_seqs": 8, "keep_last": 1}))
    run = tmp_path / "run"
    # the run stops itself at step 4's start (a crash point: no timing), so the snapshot below is its
    # files as they stay while it is alive
    proc = start_training(cfg, run, env={faults.CRASH_ENV: "train.step#4:STOP"})
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status
        assert live_checkpoints(run)
        r = catchat("train", cfg, "--run-dir", run, "--resume")
        assert_clean_error(r, 2, f"pid {proc.pid}")  # with .lock there: named from it
        (run / ".lock").unlink()
        before = snapshot(run)
        for args in (("--resume",), ("--resume", run / "checkpoints" / live_checkpoints(run)[0]), ()):
            r = catchat("train", cfg, "--run-dir", run, *args)
            assert_clean_error(r, 2, f"{run} is in use by another catchat process", ".lock file", "kill -INT")
        with pytest.raises(UsageError, match="in use by another catchat process"):
            ck.prune(run / "checkpoints", 1)
        with pytest.raises(UsageError, match="in use by another catchat process"):
            rundir.recover(rundir.RunFiles(run))
        assert snapshot(run) == before and not (run / ".lock").exists()
    finally:
        proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert steps_of(run) == list(range(1, 13))
    assert live_checkpoints(run) == ["step-0000012"]


# ------------------------------------------------------------------------------ identical saves (item 8)
def test_identical_runs_write_byte_identical_checkpoints(dev, cfg_path, tmp_path):
    for name in ("a", "b"):
        train_to(dev, cfg_path, tmp_path / name, 6)
    for f in (ck.MODEL_FILE, ck.OPTIMIZER_FILE, ck.STATE_FILE):
        a, b = (tmp_path / n / "checkpoints" / "step-0000006" / f for n in ("a", "b"))
        assert a.read_bytes() == b.read_bytes(), f


# ------------------------------------------------------------------------------ skipped steps (item 6)
def test_consecutive_skipped_steps_stop_the_run(cfg_path, tmp_path):
    run = tmp_path / "run"
    r = catchat("train", cfg_path, "--run-dir", run, "--set", "train.max_consecutive_skips=3",
                env={faults.ENV: "nan_grad@step=2,nan_grad@step=5,nan_grad@step=6,nan_grad@step=7"})
    assert_clean_error(r, 1, "stopped at step 7: 3 consecutive steps were skipped", "lower train.lr",
                       "step-0000006 is intact")
    end = events(run)[-1]
    assert end["event"] == "end" and end["reason"] == "stopped: 3 consecutive skipped steps"
    assert [e["consecutive"] for e in events(run, "skipped_step")] == [1, 1, 2, 3]


# ------------------------------------------------------------------------------ damaged telemetry (item 10)
def test_resume_over_damaged_telemetry_keeps_what_it_cannot_read(cfg_path, straight, exact_run_at, tmp_path):
    """Invalid UTF-8 and a 200 KiB line in metrics.csv, a wrong-typed event: resume, scan and plot
    go on; the damaged lines stay where they were (scan names them), the good rows are untouched."""
    run = tmp_path / "run"
    exact_run_at(6, run)
    lines = (run / "metrics.csv").read_bytes().splitlines(keepends=True)
    damaged = [b"\xff\xfe not utf-8\n", b"9" * 200_000 + b"\n"]
    (run / "metrics.csv").write_bytes(b"".join(lines[:3] + damaged + lines[3:]))
    with open(run / "events.jsonl", "a") as f:
        f.write('{"event": "eval", "global_step": "x", "loss": [1]}\n')
    r = catchat("train", cfg_path, "--run-dir", run, "--resume")
    assert r.returncode == 0, r.stdout + r.stderr
    data = (run / "metrics.csv").read_bytes()
    assert all(d in data for d in damaged)
    from catchat.run import runlog

    log = runlog.read_metrics(run / "metrics.csv")
    assert [int(row[0]) for row in log.rows] == list(range(1, TOTAL + 1)) and len(log.bad) == 2
    assert [row[6] for row in log.rows] == losses(straight)
    s = catchat("scan", run)
    assert s.returncode == 1 and "Traceback" not in s.stdout + s.stderr and "line 4" in s.stdout, s.stdout
    p = catchat("plot", run)
    assert p.returncode == 0 and "Traceback" not in p.stdout + p.stderr, p.stdout + p.stderr


# ------------------------------------------------------------------------------ metrics.csv cut from outside
def _cut_rows(run, steps):
    """metrics.csv without the rows of `steps`, as an editor or `head -n` would leave it."""
    lines = (run / "metrics.csv").read_text().splitlines(keepends=True)
    (run / "metrics.csv").write_text("".join(x for i, x in enumerate(lines) if i == 0 or i not in steps))


def _equal_but_for(run, straight, missing: set[int]):
    """The resumed run equals the straight one bitwise (weights, moments, cursor), and its rows are the
    straight run's rows but the `missing` ones."""
    assert_same_as_straight(run, straight, missing)
    assert steps_of(run) == [s for s in range(1, TOTAL + 1) if s not in missing]


@pytest.mark.parametrize("where, missing", [("end", range(7, 13)), ("middle", range(3, 5))])
def test_resume_notices_metrics_cut_from_outside(cfg_path, straight, exact_run_at, tmp_path, where, missing):
    """metrics.csv lost rows of steps the checkpoint has done (cut at the end, or from the middle, while
    the run was stopped): --resume says so in one stderr line, records a metrics_gap event, and trains
    on bitwise; `catchat scan` then warns of a known gap instead of failing on an unexplained one. A
    later resume does not report the recorded gap again."""
    run = tmp_path / "run"
    exact_run_at(12, run)  # latest step-0000012, rows 1..12
    _cut_rows(run, set(missing))
    lo, hi = missing[0], missing[-1]
    if where == "middle":  # unexplained: a defect (a cut at the end shows only once a resume goes past it)
        scan = catchat("scan", run)
        assert scan.returncode == 1 and "rows lost" in scan.stdout, scan.stdout
    r = catchat("train", cfg_path, "--run-dir", run, "--resume", "--stop-after-steps", 6)
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    said = [x for x in r.stderr.splitlines() if "lacks steps" in x]
    assert said == [f"warning: {run / 'metrics.csv'} lacks steps {lo}-{hi} ({hi - lo + 1} of the 12 steps the "
                    "checkpoint has done: truncated or edited outside catchat); training goes on, the gap stays "
                    "in the file"], r.stderr
    [gap] = events(run, "metrics_gap")
    assert gap["global_step"] == 12 and gap["missing"] == [[lo, hi]] and gap["note"] in said[0]
    assert [e["event"] for e in events(run)].index("metrics_gap") == [e["event"] for e in events(run)].index(
        "resume") + 1
    r = resume_cli(cfg_path, run)  # the gap is known now: nothing said again
    assert "lacks steps" not in r.stdout + r.stderr and len(events(run, "metrics_gap")) == 1
    _equal_but_for(run, straight, set(missing))
    scan = catchat("scan", run)
    assert scan.returncode == 0, scan.stdout
    row = next(x for x in scan.stdout.splitlines() if "step sequence" in x)
    assert "warn" in row and f"steps {lo}..{hi} missing, recorded at the resume at step 12" in row, row
    assert "lacks steps" in row and "FAIL" not in scan.stdout, scan.stdout
