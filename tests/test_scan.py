"""`catchat scan RUN_DIR`: every check on a clean synthetic run, each defect and warning planted
on purpose, a real trainer run with a resume, and the CLI (table, exit codes)."""

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np

from catchat import config as cfgmod
from catchat.scan import FAIL, OK, WARN, scan_run
from catchat.schedule import lr_at

SPS, T = 8, 16  # seqs per step, window
SPC = 200  # seqs per cycle
COLUMNS = ("global_step", "seqs", "cycle", "tokens", "lr", "tf", "loss", "grad_norm", "clipped", "valid_tokens",
           "tokens_per_s", "step_ms", "gradh_clamp_hits", "skipped")


def _cfg(n):
    return cfgmod.from_dict({"model": {"hidden": 12, "layers": 2},
                             "data": {"corpus": "x", "batch_lanes": 4, "window": T, "micro_batches": 2},
                             "train": {"lr": 0.01, "total_steps": n},
                             "schedule": {"warmup_fraction": 0.1, "cooldown_fraction": 0.2, "lr_min": 0.001}})


def _info(cfg, n):
    s = cfg.schedule
    info = dict(schedule=dict(total_steps=n, lr=cfg.train.lr, warmup_fraction=s.warmup_fraction,
                              cooldown_fraction=s.cooldown_fraction, cooldown_shape=s.cooldown_shape, lr_min=s.lr_min),
                seqs_per_step=SPS, tokens_per_step=SPS * T, seqs_per_cycle=SPC, rss_mb=150.0, peak_rss_mb=150.0)
    if hasattr(cfg, "teacher_forcing"):
        info["teacher_forcing"] = cfgmod.to_dict(cfg)["teacher_forcing"]
    return info


def make_run(path, n=90, resumes=(), seed=0):
    """A run directory as the trainer writes it: n healthy steps, evals every 10, checkpoints every
    20, resumes (at checkpoint steps) after which rows continue."""
    rng = np.random.default_rng(seed)
    cfg = _cfg(n)
    path.mkdir(parents=True)
    (path / "config.toml").write_text(cfgmod.resolved_toml(cfg))
    rows = []
    for s in range(1, n + 1):
        rows.append(dict(global_step=s, seqs=s * SPS, cycle=s * SPS // SPC, tokens=s * SPS * T,
                         lr=f"{lr_at(s - 1, n, cfg):.6g}", tf="1",
                         loss=f"{4.6 * math.exp(-s / 30) + 1 + 0.02 * rng.standard_normal():.6f}",
                         grad_norm=f"{1 + 0.1 * rng.standard_normal():.6g}", clipped=0, valid_tokens=128,
                         tokens_per_s=f"{4000 + 100 * rng.standard_normal():.1f}", step_ms="30.00",
                         gradh_clamp_hits=0, skipped=0))
    events = [dict(event="start", global_step=0, total_steps=n, **_info(cfg, n))]
    for s in range(1, n + 1):
        if s % 10 == 0:
            events.append(dict(event="eval", global_step=s, seqs=s * SPS, loss=2.0, rss_mb=151.0, peak_rss_mb=151.0))
        if s % 20 == 0:
            events.append(dict(event="checkpoint", global_step=s, path=f"x/step-{s:07d}", reason="interval",
                               rss_mb=151.0, peak_rss_mb=151.0))
        if s in resumes:
            events.append(dict(event="end", global_step=s, reason="interrupted (SIGINT)"))
            events.append(dict(event="resume", global_step=s, seqs=s * SPS, **{"from": f"x/step-{s:07d}"},
                               **_info(cfg, n)))
    events.append(dict(event="end", global_step=n, reason="done", skipped_steps=0, applied_steps=n))
    write(path, rows, events)
    return rows, events


def write(path, rows, events):
    with open(path / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def statuses(report):
    return {f.check: f.status for f in report.findings}


def test_clean_run_is_all_ok(tmp_path):
    make_run(tmp_path / "r", resumes=(40,))
    report = scan_run(tmp_path / "r")
    assert all(f.status == OK for f in report.findings), [(f.check, f.status, f.detail) for f in report.findings]
    assert report.rows == 90 and not report.defects
    assert "1 resume(s) at steps 40" in report.finding("resume signatures").detail
    assert "90 steps follow" in report.finding("lr vs schedule").detail


def plant(tmp_path, mutate, resumes=(40,)):
    rows, events = make_run(tmp_path / "r", resumes=resumes)
    mutate(rows, events)
    write(tmp_path / "r", rows, events)
    return scan_run(tmp_path / "r")


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
    rows[3]["lr"] = f"{lr_at(3, 90, _cfg(90)):.6g}"
    write(tmp_path / "bad", rows, events)
    assert _catchat("scan", str(tmp_path / "bad")).returncode == 0  # a warning alone passes
    assert _catchat("scan", "--strict", str(tmp_path / "bad")).returncode == 1
    r = _catchat("scan", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "no metrics.csv" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2


def test_real_run_with_a_resume_scans_clean(dev, tmp_path):
    """A trainer run stopped and resumed (with a changed lr: allowed on resume) scans without defects:
    the lr check follows the schedule each process logged, memory is measured from the events."""
    from catchat import corpus as corpus_mod
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
