"""`catchat scan RUN_DIR`: every check on a clean synthetic run, each defect and warning planted
on purpose, a real trainer run with a resume, damaged telemetry through the CLI (table, exit codes),
and a fuzz of the whole scan over mutated files. A run's lineage (resumes, branches, kills): test_scan_resumes.py."""

import copy
import csv
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catchat import config as cfgmod
from catchat.analysis.scan import FAIL, OK, WARN, scan_run
from catchat.run.runlog import EVENT_FIELDS
from catchat.run.runlog import METRICS_COLUMNS as COLUMNS
from catchat.run.schedule import lr_at

from scan_runs import SPC, SPS, make_run, plant, run_config, statuses, write


def test_clean_run_is_all_ok(tmp_path):
    make_run(tmp_path / "r", resumes=(40,))
    report = scan_run(tmp_path / "r")
    assert all(f.status == OK for f in report.findings), [(f.check, f.status, f.detail) for f in report.findings]
    assert report.rows == 90 and not report.defects
    assert "1 resume(s) at steps 40" in report.finding("resume signatures").detail
    assert "90 steps follow" in report.finding("lr vs schedule").detail


def test_lr_off_its_formula_is_a_defect(tmp_path):
    def rewarm(rows, events):  # lesson 2: the resumed half re-ran warmup
        for i, r in enumerate(rows[40:49]):
            r["lr"] = f"{0.01 * (i + 1) / 9:.6g}"

    f = plant(tmp_path, rewarm).finding("lr vs schedule")
    assert f.status == FAIL and f.steps[0] == 41 and "lesson 2" in f.detail


def test_tf_off_its_formula_is_a_defect(tmp_path):
    def tf(rows, events):
        rows[10]["tf"] = "0.9"

    f = plant(tmp_path, tf).finding("tf vs schedule")
    assert f.status == FAIL and f.steps == [11]


def test_non_finite_applied_step_is_a_defect_and_a_skipped_one_a_warning(tmp_path):
    def nan_applied(rows, events):
        rows[20]["loss"] = "nan"

    assert plant(tmp_path / "a", nan_applied).finding("non-finite steps").status == FAIL

    def nan_skipped(rows, events):
        rows[20].update(grad_norm="nan", skipped=1)
        events.insert(3, dict(event="skipped_step", global_step=21, reason="non-finite gradient norm (nan)"))

    r = plant(tmp_path / "b", nan_skipped)
    assert statuses(r)["non-finite steps"] == WARN and statuses(r)["skipped steps"] == OK
    assert not r.defects


def test_unlogged_skip_and_applied_empty_step_are_defects(tmp_path):
    def unlogged(rows, events):
        rows[5]["skipped"] = 1

    assert plant(tmp_path / "a", unlogged).finding("skipped steps").status == FAIL

    def empty_applied(rows, events):  # lesson 10: a step without valid targets must not be applied
        rows[5]["valid_tokens"] = 0

    f = plant(tmp_path / "b", empty_applied).finding("skipped steps")
    assert f.status == FAIL and "lesson 10" in f.detail


def test_rows_not_truncated_on_resume_or_lost(tmp_path):
    def duplicated(rows, events):  # the resumed process appended steps 38..40 again
        rows[40:40] = [dict(r) for r in rows[37:40]]

    f = plant(tmp_path / "a", duplicated).finding("step sequence")
    assert f.status == FAIL and "row 41 has step 38" in f.detail

    def lost(rows, events):
        del rows[50]

    assert plant(tmp_path / "b", lost).finding("step sequence").status == FAIL


def test_cursor_not_restored_is_a_defect(tmp_path):
    def seqs_jump(rows, events):  # the resumed run restarted its data: seqs and cycle go back
        for r in rows[40:]:
            r["seqs"] = (r["global_step"] - 40) * SPS
            r["cycle"] = r["seqs"] // SPC

    f = plant(tmp_path, seqs_jump).finding("seqs / tokens / cycle")
    assert f.status == FAIL and f.steps[0] == 41


def test_resume_signature_defects(tmp_path):
    def wrong_seqs(rows, events):
        next(e for e in events if e["event"] == "resume")["seqs"] = 0

    f = plant(tmp_path / "a", wrong_seqs).finding("resume signatures")
    assert f.status == FAIL and "resumed at 0 seqs, the run was at 320" in f.detail

    def loss_jump(rows, events):  # lesson 8: optimizer state not restored -> a loss spike after resuming
        for r in rows[40:43]:
            r["loss"] = "4.500000"

    f = plant(tmp_path / "b", loss_jump).finding("resume signatures")
    assert f.status == WARN and "loss jumped" in f.detail

    def foreign(rows, events):
        events[:] = [e for e in events if not (e["event"] == "checkpoint" and e["global_step"] == 40)]

    assert plant(tmp_path / "c", foreign).finding("resume signatures").status == WARN


def test_grad_spikes_throughput_and_memory_are_warnings(tmp_path):
    def spikes(rows, events):
        rows[30]["grad_norm"] = "6.5"
        rows[60]["grad_norm"] = "9"
        for r in rows[70:77]:
            r["tokens_per_s"] = "1500.0"
        for e in events:
            if e["event"] in ("eval", "checkpoint") and e["global_step"] >= 60:
                e["rss_mb"] = 150.0 + 3 * e["global_step"]

    r = plant(tmp_path, spikes)
    st = statuses(r)
    assert st["grad-norm spikes"] == WARN and r.finding("grad-norm spikes").steps == [31, 61]
    assert st["throughput"] == WARN and r.finding("throughput").steps == [71]
    assert st["memory growth"] == WARN and "grew 151 -> 420 MiB" in r.finding("memory growth").detail
    assert not r.defects


def test_one_slow_step_or_a_new_process_is_not_a_drop(tmp_path):
    def blips(rows, events):
        rows[30]["tokens_per_s"] = "900.0"  # one slow step
        for r in rows[40:]:  # the resumed process runs on a slower machine: its own baseline
            r["tokens_per_s"] = f"{float(r['tokens_per_s']) / 3:.1f}"

    assert statuses(plant(tmp_path, blips))["throughput"] == OK


def test_running_loss_rise_and_divergence(tmp_path):
    def rise(rows, events):
        for r in rows[50:60]:
            r["loss"] = f"{float(r['loss']) * 1.5:.6f}"

    f = plant(tmp_path / "a", rise, resumes=()).finding("running loss")
    assert f.status == WARN and 60 in f.steps

    def diverge(rows, events):
        for r in rows[60:]:
            r["loss"] = f"{3 + (r['global_step'] - 60) * 0.1:.6f}"

    assert plant(tmp_path / "b", diverge, resumes=()).finding("running loss").status == FAIL


def test_damaged_records(tmp_path):
    make_run(tmp_path / "r")
    with open(tmp_path / "r" / "events.jsonl", "a") as f:
        f.write('{"event": "eval", "glob')  # a crash while writing the last line
    assert statuses(scan_run(tmp_path / "r"))["events.jsonl"] == WARN
    with open(tmp_path / "r" / "metrics.csv", "a") as f:
        f.write("91,728,3,x\n")
    r = scan_run(tmp_path / "r")
    assert r.finding("metrics.csv").status == FAIL and "line 92" in r.finding("metrics.csv").detail


def _catchat(*args):
    return subprocess.run([sys.executable, "-m", "catchat.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=120)


def test_cli_table_and_exit_codes(tmp_path):
    make_run(tmp_path / "good")
    r = _catchat("scan", str(tmp_path / "good"))
    assert r.returncode == 0 and "lr vs schedule" in r.stdout and "0 defect(s), 0 warning(s)" in r.stdout, r.stdout
    rows, events = make_run(tmp_path / "bad")
    rows[3]["lr"] = "0.5"
    rows[30]["grad_norm"] = "50"
    write(tmp_path / "bad", rows, events)
    r = _catchat("scan", str(tmp_path / "bad"))
    assert r.returncode == 1 and "FAIL" in r.stdout and "1 defect(s), 1 warning(s)" in r.stdout, r.stdout
    rows[3]["lr"] = f"{lr_at(3, 90, run_config(90)):.6g}"
    write(tmp_path / "bad", rows, events)
    assert _catchat("scan", str(tmp_path / "bad")).returncode == 0  # a warning alone passes
    assert _catchat("scan", "--strict", str(tmp_path / "bad")).returncode == 1
    r = _catchat("scan", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no metrics.csv" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2


def test_real_run_with_a_resume_scans_clean(dev, tmp_path):
    """A trainer run stopped and resumed (with a changed lr: allowed on resume) scans without defects:
    the lr check follows the schedule each process logged, memory is measured from the events."""
    from catchat.data import corpus as corpus_mod
    from catchat.train import Trainer

    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"s{i}.txt").write_text("ALICE: Where is the cat?\nBOB: Asleep.\n" * (1 + i % 3))
    corpus_mod.build([src], tmp_path / "c", eval_fraction=0.2, delimiter=None)
    body = {"model": {"hidden": 8, "layers": 1},
            "data": {"corpus": str(tmp_path / "c"), "batch_lanes": 4, "window": 16},
            "train": {"lr": 0.01, "total_steps": 24}, "schedule": {"warmup_fraction": 0.25},
            "eval": {"eval_every_seqs": 16, "eval_windows": 1}, "checkpoint": {"checkpoint_every_seqs": 16}}
    Trainer(cfgmod.from_dict(body), tmp_path / "run", dev).run(stop_after_steps=10)
    body["train"]["lr"] = 0.005
    Trainer(cfgmod.from_dict(body), tmp_path / "run", dev, resume="").run()
    report = scan_run(tmp_path / "run")
    assert not report.defects, [(f.check, f.detail) for f in report.defects]
    st = statuses(report)
    assert st["lr vs schedule"] == OK and st["resume signatures"] in (OK, WARN) and st["step sequence"] == OK
    assert "no growth" in report.finding("memory growth").detail
    assert st["plan changes"] == WARN and "step 10: train.lr 0.01 -> 0.005" in report.finding("plan changes").detail


# ---------------------------------------------------------------------------------------------
# divergence from the start, gaps, foreign resumes, branches, end reasons (issue 17, item 13)
# ---------------------------------------------------------------------------------------------

def test_divergence_from_the_first_rows(tmp_path):
    """lr = 10: the loss is 1428 from the first rows on, so no block is ever better than another and
    the block comparison never fires; a loss far above a uniform prediction's (ln 101) does."""
    rows, events = make_run(tmp_path / "r", n=8)
    for r in rows:
        r["loss"] = f"{1428.0 * r['global_step']:.6f}"
    write(tmp_path / "r", rows, events)
    f = scan_run(tmp_path / "r").finding("running loss")
    assert f.status == FAIL and f.detail.startswith("diverged: loss above 2 x ln 101 = 9.23 nats"), f.detail
    assert f.steps == list(range(1, 9)) and "highest 11424 at step 8" in f.detail

    def two_spikes(rows, events):  # two absurd steps in a healthy run: worth a look, not a verdict
        rows[30]["loss"] = rows[31]["loss"] = "12.000000"

    f = plant(tmp_path / "b", two_spikes).finding("running loss")
    assert f.status == WARN and f.steps == [31, 32]


def test_a_gap_in_the_steps_names_the_missing_ones(tmp_path):
    rows, events = make_run(tmp_path / "r", n=20)
    del rows[10:14]  # steps 1..10, then 15..20
    write(tmp_path / "r", rows, events)
    f = scan_run(tmp_path / "r").finding("step sequence")
    assert f.status == FAIL and "4 step(s) missing: 11..14 (rows lost)" in f.detail, f.detail
    assert f.steps == [11, 12, 13, 14] and f.count == 4

    def out_of_order(rows, events):
        rows[4], rows[5] = rows[5], rows[4]

    f = plant(tmp_path / "b", out_of_order).finding("step sequence")
    assert f.status == FAIL and "row 6 has step 5 after step 6" in f.detail and "missing" not in f.detail


def test_a_huge_gap_stays_cheap(tmp_path):
    rows, events = make_run(tmp_path / "r", n=20)
    rows[-1]["global_step"] = 2**62  # a damaged step number: the gap is listed, not enumerated
    write(tmp_path / "r", rows, events)
    f = scan_run(tmp_path / "r").finding("step sequence")
    assert f.status == FAIL and f"{2**62 - 20} step(s) missing: 20..{2**62 - 1}" in f.detail
    assert len(f.steps) == 1000 and f.count == 2**62 - 20


@pytest.mark.parametrize("reason,status", [
    ("done", OK), ("interrupted (SIGINT)", OK), ("stop-after-steps", OK),
    ("interrupted twice (SIGINT): no final checkpoint", WARN),
    ("stopped: 10 consecutive skipped steps", WARN),
    ("failed: device lost: vk::Queue::submit: ErrorDeviceLost", WARN),
])
def test_end_reasons(tmp_path, reason, status):
    def end(rows, events):
        events[-1]["reason"] = reason

    f = plant(tmp_path, end, resumes=()).finding("run end")
    assert f.status == status and f.detail.startswith(f"ended at step 90: {reason}")


def test_a_damaged_schedule_is_not_checked_rather_than_a_crash(tmp_path):
    def damage(rows, events):
        events[0]["schedule"]["total_steps"] = -5
        events[0]["teacher_forcing"].update(schedule="linear", start=1.0, floor=0.5, decay_cycles=0.0)

    report = plant(tmp_path, damage, resumes=())
    lr, tf = report.finding("lr vs schedule"), report.finding("tf vs schedule")
    assert lr.status == WARN and "90 step(s) not checked: the schedule logged for them cannot be evaluated" in lr.detail
    assert tf.status == WARN and "teacher-forcing schedule logged for them cannot be evaluated" in tf.detail


# ---------------------------------------------------------------------------------------------
# damaged telemetry through the CLI: findings with line numbers, never a traceback
# ---------------------------------------------------------------------------------------------

def test_damaged_telemetry_through_the_cli(dev, tmp_path):
    """Invalid UTF-8 and a 200 KiB line in metrics.csv, a wrong-typed event: each crashed `catchat
    scan` before (UnicodeDecodeError, csv's field limit, TypeError); now they are FAIL findings naming
    the lines, and the rest of the run is scanned."""
    from support import catchat, make_tiny_run

    run = make_tiny_run(tmp_path, dev)  # 5 rows: lines 2..6
    with open(run / "metrics.csv", "ab") as f:
        f.write(b"6,48,0,\xff\xfe,0.02\n" + b"7," * 100_000 + b"\n")
    r = catchat("scan", run, env={"COLUMNS": "1000"})
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert "2 unusable line(s) (line 7: not valid UTF-8 (byte 7); line 8: longer than 128 KiB), skipped" in out
    assert "(5 steps)" in out and "steps 1..5, none missing" in out

    clean = run.parent / "clean"
    make_tiny_run(clean, dev)
    with open(clean / "run" / "events.jsonl", "a") as f:
        f.write('{"event": "eval", "global_step": "x", "loss": [1]}\n'
                '{"event": "eval", "global_step": 5, "loss": [1]}\n')
    r = catchat("scan", clean / "run", env={"COLUMNS": "1000"})
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    n = len((clean / "run" / "events.jsonl").read_text().splitlines())
    assert f'line {n - 1}: global_step is "x", not a step number; line {n}: "eval" event: loss is [1], not a number' \
        in out


# ---------------------------------------------------------------------------------------------
# fuzz: a scan of mutated telemetry never raises
# ---------------------------------------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)
KEYS = sorted({"event", "global_step", "time", "rss_mb"} | {k for fields in EVENT_FIELDS.values() for k in fields})


_BASE: dict = {}


@st.composite
def damaged_run(draw):
    """make_run's events with fields set to arbitrary JSON, events renamed, rows' cells replaced."""
    edits = draw(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(KEYS),
                                    JSON | st.sampled_from(sorted(EVENT_FIELDS))), min_size=1, max_size=6))
    cells = draw(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(COLUMNS),
                                    st.sampled_from(["", "nan", "inf", "-1", "0", "1e300", "9" * 19, "x"])),
                          max_size=4))
    return edits, cells


@settings(derandomize=True, database=None, max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(damage=damaged_run())
def test_fuzz_scan_of_damaged_telemetry(tmp_path, damage):
    path = tmp_path / "r"
    if path not in _BASE:  # one run per test (tmp_path is the same for every example)
        _BASE[path] = make_run(path, resumes=(40,))
    rows, events = copy.deepcopy(_BASE[path])
    edits, cells = damage
    for i, key, value in edits:
        events[i % len(events)][key] = value
    for i, col, value in cells:
        rows[i % len(rows)][col] = value
    with open(path / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    report = scan_run(path)
    assert {f.status for f in report.findings} <= {OK, WARN, FAIL}
