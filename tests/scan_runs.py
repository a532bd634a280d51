"""Synthetic run directories for the `catchat scan` tests (tests/test_scan*.py): metrics.csv rows and
events as the trainer writes them for a healthy run, which a test then damages on purpose."""

import csv
import json
import math

import numpy as np

from catchat import config as cfgmod
from catchat.analysis.scan import scan_run
from catchat.run.runlog import METRICS_COLUMNS as COLUMNS
from catchat.run.schedule import lr_at

SPS, T = 8, 16  # seqs per step, window
SPC = 200  # seqs per cycle


def run_config(n):
    return cfgmod.from_dict({"model": {"hidden": 12, "layers": 2},
                             "data": {"corpus": "x", "batch_lanes": 4, "window": T, "micro_batches": 2},
                             "train": {"lr": 0.01, "total_steps": n},
                             "schedule": {"warmup_fraction": 0.1, "cooldown_fraction": 0.2, "lr_min": 0.001}})


def start_info(cfg, n):
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
    cfg = run_config(n)
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
    events = [dict(event="start", global_step=0, total_steps=n, **start_info(cfg, n))]
    for s in range(1, n + 1):
        if s % 10 == 0:
            events.append(dict(event="eval", global_step=s, seqs=s * SPS, loss=2.0, rss_mb=151.0, peak_rss_mb=151.0))
        if s % 20 == 0:
            events.append(dict(event="checkpoint", global_step=s, path=str(path / "checkpoints" / f"step-{s:07d}"),
                               reason="interval",
                               rss_mb=151.0, peak_rss_mb=151.0))
        if s in resumes:
            events.append(dict(event="end", global_step=s, reason="interrupted (SIGINT)"))
            events.append(dict(event="resume", global_step=s, seqs=s * SPS,
                               **{"from": str(path / "checkpoints" / f"step-{s:07d}")},
                               **start_info(cfg, n)))
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


def plant(tmp_path, mutate, resumes=(40,)):
    rows, events = make_run(tmp_path / "r", resumes=resumes)
    mutate(rows, events)
    write(tmp_path / "r", rows, events)
    return scan_run(tmp_path / "r")
