"""A resume continues the plan the run recorded (issue 34 item 2): without --set it keeps the recorded
total_steps whatever the CONFIG file says, --set on the resume is printed (old -> new), logged as a
plan_change event and reported by `catchat scan`, an edited CONFIG is refused (exit 2, nothing
touched) unless --use-config-file adopts it, and keys a run cannot change are refused. The console's
loss (item 3): the step's own plus a labelled mean that goes on from metrics.csv on resume; piped
output's plain lines carry step/total, loss, tokens/s, lr, elapsed and ETA (item 5)."""

import csv
import io
import math
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from catchat import config as cfgmod
from catchat.analysis.scan import FAIL, OK, WARN, scan_run
from catchat.errors import UsageError
from catchat.run import checkpoint as ck
from catchat.run import runlog
from catchat.run.schedule import lr_at
from catchat.training import plan as planmod
from catchat.training.progress import AVERAGE_STEPS, TrainReporter
from catchat.vk.program.driver import StepStats

from support import assert_clean_error, catchat, snapshot

ROOT = Path(__file__).resolve().parents[1]
# configs/tiny.toml made small enough for lavapipe: ~0.1 s a step, no interval evals or checkpoints
SMALL = [arg for kv in ("model.hidden=12", "model.layers=1", "data.batch_lanes=4", "data.window=16",
                        "eval.eval_every_seqs=0", "checkpoint.checkpoint_every_seqs=0", "eval.eval_windows=1",
                        "eval.free_running=false", "eval.sample_chars=8") for arg in ("--set", kv)]
# what a plain (piped) progress line holds, in order
PLAIN = re.compile(r"^step (\d+)/(\d+)  loss (\d+\.\d{3}|skipped)(?: \(avg(\d+) (\d+\.\d{3})\))?  [\d,]+ tok/s  "
                   r"lr \d\.\d\de[-+]\d\d  elapsed \d+:\d\d:\d\d  eta (?:\d+:\d\d:\d\d|\?)$")


def events(run, kind):
    return [e for e in runlog.read_events(run / "events.jsonl").events if e["event"] == kind]


def rows(run):
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def plain_lines(out: str) -> dict[int, re.Match]:
    """step -> the match of its plain progress line."""
    found = {}
    for line in out.splitlines():
        m = PLAIN.match(line)
        if m:
            found[int(m.group(1))] = m
    return found


def test_resume_keeps_the_recorded_plan_and_a_change_is_shown_logged_and_scanned(tmp_path):
    config, run = tmp_path / "tiny.toml", tmp_path / "r"
    shutil.copy(ROOT / "configs" / "tiny.toml", config)  # its own plan: 250 steps
    first = catchat("train", config, "--run-dir", run, *SMALL, "--set", "train.total_steps=40", "--stop-after-steps", 3)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "training for 40 steps" in first.stdout and set(plain_lines(first.stdout)) >= {1, 2}

    # the same command without the --set: the run's 40 steps, not the file's 250, and not a word of change
    plain = catchat("train", config, "--run-dir", run, "--resume", "--stop-after-steps", 2)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "changed:" not in plain.stdout and not events(run, "plan_change")
    assert ck.load_checkpoint(run).state["schedule"]["total_steps"] == 40
    assert cfgmod.load(run / "config.toml").train.total_steps == 40
    lines = plain_lines(plain.stdout)
    assert lines[4].group(2) == "40"
    # item 3: the resumed process's first line averages the 3 rows the run had and its own step
    logged = [float(r["loss"]) for r in rows(run)]
    assert lines[4].group(4) == "4" and float(lines[4].group(5)) == pytest.approx(sum(logged[:4]) / 4, abs=1.1e-3)
    assert float(lines[4].group(3)) == pytest.approx(logged[3], abs=1e-3)  # the step's own loss

    changed = catchat("train", config, "--run-dir", run, "--resume", "--set", "train.total_steps=60",
                      "--stop-after-steps", 2)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert "changed: train.total_steps 40 -> 60" in changed.stdout
    assert "schedule from step 5: 60 planned steps (were 40)" in changed.stdout
    (event,) = events(run, "plan_change")
    assert event["global_step"] == 5
    assert event["changes"] == {"train.total_steps": {"old": 40, "new": 60, "by": "command line"}}
    assert event["schedule"]["total_steps"] == {"old": 40, "new": 60}
    assert ck.load_checkpoint(run).state["schedule"]["total_steps"] == 60
    # docs/training.md: from the change on, the lr is lr_at(step, new total) of the recorded schedule
    cfg = cfgmod.load(run / "config.toml")
    lrs = [float(r["lr"]) for r in rows(run)]
    assert lrs[:5] == pytest.approx([lr_at(s, 40, cfg) for s in range(5)], rel=1e-5)
    assert lrs[5:] == pytest.approx([lr_at(s, 60, cfg) for s in range(5, 7)], rel=1e-5)
    report = scan_run(run)
    assert not report.defects, [(f.check, f.detail) for f in report.defects]
    f = report.finding("plan changes")
    assert f.status == WARN and f.steps == [5] and "step 5: train.total_steps 40 -> 60" in f.detail
    assert report.finding("lr vs schedule").status == OK

    # an edited CONFIG: refused whole, nothing touched, the keys named
    config.write_text(config.read_text().replace("\nlr = 4e-3 ", "\nlr = 2e-3 "))
    before = snapshot(run)
    r = catchat("train", config, "--run-dir", run, "--resume", "--stop-after-steps", 1)
    assert_clean_error(r, 2, "was edited since the run last read it: train.lr 0.004 -> 0.002", "--use-config-file")
    assert snapshot(run) == before
    # keys a run keeps are refused even when asked for
    r = catchat("train", config, "--run-dir", run, "--resume", "--use-config-file", "--set", "data.micro_batches=2")
    assert_clean_error(r, 2, "data.micro_batches 1 -> 2")
    assert snapshot(run) == before

    adopted = catchat("train", config, "--run-dir", run, "--resume", "--use-config-file", "--stop-after-steps", 1)
    assert adopted.returncode == 0, adopted.stdout + adopted.stderr
    assert "changed: train.lr 0.004 -> 0.002 (from the edited config file)" in adopted.stdout
    assert events(run, "plan_change")[-1]["changes"] == {"train.lr": {"old": 0.004, "new": 0.002, "by": "config file"}}
    again = catchat("train", config, "--run-dir", run, "--resume", "--stop-after-steps", 1)  # the file is the run's now
    assert again.returncode == 0 and "changed:" not in again.stdout, again.stdout + again.stderr
    assert cfgmod.load(run / "config.toml").train.lr == 0.002 and len(events(run, "plan_change")) == 2

    # a plan shortened to the step reached: no step is left, and the new plan is recorded all the same
    short = catchat("train", config, "--run-dir", run, "--resume", "--set", "train.total_steps=9")
    assert short.returncode == 0, short.stdout + short.stderr
    assert "the run has taken its 9 planned steps: it ends without another" in short.stdout
    assert ck.load_checkpoint(run).state["schedule"]["total_steps"] == 9
    after = catchat("train", config, "--run-dir", run, "--resume")
    assert after.returncode == 0 and "changed:" not in after.stdout, after.stdout + after.stderr
    assert int(rows(run)[-1]["global_step"]) == 9
    f = scan_run(run).finding("plan changes")
    assert f.status == WARN and f.steps == [5, 7, 9] and "step 9: train.total_steps 60 -> 9" in f.detail


# ------------------------------------------------------------------------------ the plan without a GPU
def _checkpoint(tmp_path, config: dict, config_file: dict | None):
    state = {"config": config, "schedule": {"total_steps": 40}}
    if config_file is not None:
        state["config_file"] = config_file
    return SimpleNamespace(path=tmp_path / "checkpoints" / "step-0000010", state=state)


def _write(path, text):
    path.write_text(text)
    return path


BASE = '[data]\ncorpus = "x"\n[train]\ntotal_steps = 250\nlr = 0.004\n'


def test_resume_plan_from_the_command_line(tmp_path):
    config = _write(tmp_path / "c.toml", BASE)
    file_values = cfgmod.load_values(config)
    recorded = cfgmod.to_dict(cfgmod.load(config, ["train.total_steps=40"]))
    ckpt = _checkpoint(tmp_path, recorded, file_values)
    plan = planmod.resume_plan(planmod.ConfigSource.read(config), None, ckpt, print)
    assert plan.cfg.train.total_steps == 40 and plan.changes == [] and plan.notes == []
    plan = planmod.resume_plan(planmod.ConfigSource.read(config, ["train.total_steps=300"]), None, ckpt, print)
    assert plan.changes == [("train.total_steps", 40, 300, "command line")]
    assert plan.event({"total_steps": 40, "lr_next": 0.004}, {"total_steps": 300, "lr_next": 0.004}) == {
        "changes": {"train.total_steps": {"old": 40, "new": 300, "by": "command line"}},
        "schedule": {"total_steps": {"old": 40, "new": 300}}}
    # an edit the --set overrides, or one that agrees with the recorded plan, is no edit to refuse
    _write(config, BASE.replace("lr = 0.004", "lr = 0.002"))
    with pytest.raises(UsageError, match=r"train.lr 0.004 -> 0.002"):
        planmod.resume_plan(planmod.ConfigSource.read(config), None, ckpt, print)
    plan = planmod.resume_plan(planmod.ConfigSource.read(config, ["train.lr=0.003"]), None, ckpt, print)
    assert plan.changes == [("train.lr", 0.004, 0.003, "command line")]
    _write(config, BASE.replace("total_steps = 250", "total_steps = 40"))
    plan = planmod.resume_plan(planmod.ConfigSource.read(config), None, ckpt, print)
    assert plan.changes == [] and plan.file_values["train"]["total_steps"] == 40  # the new baseline is recorded
    # a checkpoint of an older catchat does not say what the file said: the recorded plan is kept, with a note
    _write(config, BASE)
    old = _checkpoint(tmp_path, recorded, None)
    plan = planmod.resume_plan(planmod.ConfigSource.read(config), None, old, print)
    assert plan.cfg.train.total_steps == 40 and plan.changes == []
    assert "recorded -> file: train.total_steps 40 -> 250" in plan.notes[0] and "--use-config-file" in plan.notes[0]
    plan = planmod.resume_plan(planmod.ConfigSource.read(config, use_config_file=True), None, old, print)
    assert plan.changes == [("train.total_steps", 40, 250, "config file")]


def test_a_file_that_only_overrides_complete_is_a_valid_source(tmp_path):
    """A CONFIG that sets neither total_steps nor cycles is fine when --set sets one (the fresh start
    records its values as they are); a bad override is refused before anything else."""
    config = _write(tmp_path / "c.toml", '[data]\ncorpus = "x"\n')
    source = planmod.ConfigSource.read(config, ["train.total_steps=5"])
    assert source.fresh().train.total_steps == 5
    assert planmod.fresh_plan(source, None).file_values["train"]["total_steps"] == 0
    with pytest.raises(UsageError, match="unknown key train.totl_steps"):
        planmod.ConfigSource.read(config, ["train.totl_steps=5"])
    with pytest.raises(UsageError, match="norm_eps"):
        recorded = cfgmod.to_dict(source.fresh())
        planmod.resume_plan(planmod.ConfigSource.read(config, ["train.total_steps=5", "model.norm_eps=1e-5"]), None,
                            _checkpoint(tmp_path, recorded, cfgmod.load_values(config)), print)


# ------------------------------------------------------------------------------ the console's loss
def _stats(loss, skipped=False):
    return StepStats(loss=loss, n_valid=0 if skipped else 64, top1=0, top5=0, grad_norm=1.0, skipped=skipped)


def _reporter():
    from rich.console import Console

    con = Console(file=io.StringIO(), width=200, force_terminal=False)
    return TrainReporter(con), con


def _step(rep, step, loss, total=40, skipped=False):
    rep("step", stats=_stats(loss, skipped), lr=1e-3, tf=1.0, seconds=0.01, global_step=step, total_steps=total,
        tokens_per_s=1000.0)


def test_console_loss_is_the_steps_own_with_a_labelled_mean_that_goes_on_from_metrics(tmp_path):
    metrics = tmp_path / "metrics.csv"
    header = ",".join(runlog.WRITTEN_COLUMNS)
    n = 2000  # ~140 KB: more than one read from the end (runlog.CHUNK), which starts mid-line
    body = [f"{s},{4 * s},0,{64 * s},0.001,1,{3 + s / 1000:.6f},1,0,64,1000.0,10.00,0,0,1.0,0.1,1" for s in range(1, n)]
    skipped = f"{n},{4 * n},0,{64 * n},0.001,1,,nan,0,0,1000.0,10.00,0,1,1.0,0.1,1"  # no valid targets
    metrics.write_text(header + "\n" + "\n".join(body + [skipped]) + f"\n{n + 1},604,0,96")  # a last line cut short
    assert metrics.stat().st_size > runlog.CHUNK
    want = [3 + s / 1000 for s in range(n - AVERAGE_STEPS, n)]
    assert runlog.recent_losses(metrics, AVERAGE_STEPS) == pytest.approx(want)
    assert runlog.recent_losses(metrics, 5000) == pytest.approx([3 + s / 1000 for s in range(1, n)])
    rep, con = _reporter()
    rep("history", metrics=metrics)
    _step(rep, n + 1, 2.0, total=3000)
    _step(rep, n + 2, float("nan"), total=3000, skipped=True)
    lines = con.file.getvalue().splitlines()
    mean = (sum(want[1:]) + 2.0) / 100  # the window holds the last 100 applied steps
    assert lines[0].startswith(f"step {n + 1}/3000  loss 2.000 (avg100 {mean:.3f})  1,000 tok/s  lr 1.00e-03  elapsed ")
    assert PLAIN.match(lines[0]), lines[0]

    fresh, con = _reporter()  # a new run: the mean holds what there is, and says how many
    _step(fresh, 1, 4.0)
    _step(fresh, 2, 3.0)
    assert "loss 4.000 (avg1 4.000)" in con.file.getvalue() and "loss 3.000 (avg2 3.500)" in con.file.getvalue()


def test_piped_output_gets_plain_lines_with_eta_through_the_run():
    """A line for the first and last step and every 5% of the run, each with step/total, the step's
    loss and the labelled mean, tokens/s, lr, elapsed and ETA (lines the clock adds may come too)."""
    rep, con = _reporter()
    for step in range(1, 101):
        _step(rep, step, 5.0 - step / 100, total=100)
    lines = con.file.getvalue().splitlines()
    assert all(PLAIN.match(line) for line in lines), lines
    steps = plain_lines("\n".join(lines))
    assert {1, 100, *range(5, 101, 5)} <= set(steps)
    assert steps[100].group(4) == "100" and math.isclose(float(steps[100].group(5)), 5.0 - 50.5 / 100, abs_tol=1e-3)


def test_scan_of_a_plan_change_without_its_event_or_with_a_wrong_one(tmp_path):
    """The trainer's run above is the recorded case; here a resume whose schedule moved with no
    plan_change event (a catchat before them: warn) and an event the schedules contradict (FAIL)."""
    from test_scan import make_run, write

    run_rows, run_events = make_run(tmp_path / "a", resumes=(40,))
    resume = next(e for e in run_events if e["event"] == "resume")
    resume["schedule"] = {**resume["schedule"], "lr_min": 0.002}
    write(tmp_path / "a", run_rows, run_events)
    f = scan_run(tmp_path / "a").finding("plan changes")
    assert f.status == WARN and "step 40: schedule.lr_min 0.001 -> 0.002 with no plan_change event" in f.detail
    i = run_events.index(resume)
    run_events.insert(i + 1, {"event": "plan_change", "global_step": 40,
                              "changes": {"schedule.lr_min": {"old": 0.001, "new": 0.003, "by": "command line"}}})
    write(tmp_path / "a", run_rows, run_events)
    f = scan_run(tmp_path / "a").finding("plan changes")
    assert f.status == FAIL and "schedule.lr_min 0.001 -> 0.002, which its plan_change event does not say" in f.detail
    run_events[i + 1]["changes"]["schedule.lr_min"]["new"] = 0.002
    write(tmp_path / "a", run_rows, run_events)
    f = scan_run(tmp_path / "a").finding("plan changes")
    assert f.status == WARN and f.detail == "changed on resume: step 40: schedule.lr_min 0.001 -> 0.002"
    make_run(tmp_path / "b", resumes=(40,))
    assert scan_run(tmp_path / "b").finding("plan changes").status == OK
