"""The live view of a run (issue 34 item 8): TensorBoard event files read back with TensorBoard's own
reader, a run without tensorboardX, a writer that fails, and `catchat watch` on a run in progress.
No test here depends on how fast the machine is: timeouts are hang guards only."""

import csv
import json
import os
import select
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from catchat import config as cfgmod
from catchat.analysis.termchart import braille_chart
from catchat.analysis.watch import RunWatch, plain_status, render
from catchat.run import checkpoint as ck
from catchat.run import tensorboard as tb
from catchat.run.rundir import HEADER
from catchat.train import Trainer

from support import assert_clean_error, build_scene_corpus, catchat, small_config, start_training, wait_for_rows

ROW_TAGS = ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/teacher_forcing"]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    return build_scene_corpus(tmp_path_factory.mktemp("scenes"))


def board(run):
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def metrics(run):
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def events(run):
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def warnings_of(messages):
    return [f["text"] for kind, f in messages if kind == "warning"]


def recorder(messages):
    return lambda kind, **f: messages.append((kind, f))


# ------------------------------------------------------------------------------ event files
def test_event_files_hold_the_runs_scalars_samples_and_histograms(dev, small_corpus, tmp_path):
    """Stopped after 5 steps and resumed: TensorBoard's reader finds every metrics.csv value under its
    tag at its step (once), the evals of events.jsonl, the samples as text, a histogram of every
    weight at every checkpoint; and the training is bitwise the same as without the event files."""
    cfg = small_config(small_corpus)
    run, said = tmp_path / "run", []
    Trainer(cfg, run, dev, reporter=recorder(said)).run(stop_after_steps=5)
    Trainer(cfg, run, dev, resume="", reporter=recorder(said)).run()
    assert warnings_of(said) == []
    files = sorted(p.name for p in (run / "tensorboard").iterdir())
    assert files == ["events.out.tfevents.00001.step-0000000.catchat", "events.out.tfevents.00002.step-0000005.catchat"]

    acc, rows = board(run), metrics(run)
    tags = acc.Tags()
    assert set(ROW_TAGS) <= set(tags["scalars"]) and "train/loss_scale" not in tags["scalars"]  # fp32
    for tag, column in zip(ROW_TAGS, ["loss", "lr", "grad_norm", "tokens_per_s", "tf"]):
        got = acc.Scalars(tag)
        assert [e.step for e in got] == [int(r["global_step"]) for r in rows], tag  # each step once
        np.testing.assert_allclose([e.value for e in got], [float(r[column]) for r in rows], rtol=1e-6, err_msg=tag)

    evals = [e for e in events(run) if e["event"] == "eval"]
    assert [e.step for e in acc.Scalars("eval/loss")] == [e["global_step"] for e in evals] and evals
    np.testing.assert_allclose([e.value for e in acc.Scalars("eval/loss")], [e["loss"] for e in evals], rtol=1e-6)
    np.testing.assert_allclose([e.value for e in acc.Scalars("eval/free_running/top1")],
                               [e["free_running"]["top1"] for e in evals], rtol=1e-6)
    samples = acc.Tensors("samples/text_summary")
    assert [s.step for s in samples] == [e["global_step"] for e in evals]
    last = samples[-1].tensor_proto.string_val[0].decode()
    assert "=== greedy" in last and last.startswith("    ")  # verbatim: indented as code

    saved = [e["global_step"] for e in events(run) if e["event"] == "checkpoint"]
    params = ck.load_checkpoint(run).params
    for name in params:
        hist = acc.Histograms(f"weights/{name}")
        assert [h.step for h in hist] == saved, name
        assert hist[-1].histogram_value.num == params[name].size
        np.testing.assert_allclose(hist[-1].histogram_value.max, params[name].max(), rtol=1e-6)
    config_text = acc.Tensors("run/config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "tensorboard = true" in config_text

    plain = tmp_path / "plain"  # the same run without event files: bitwise the same training
    off = cfgmod.with_changes(cfg, log={"tensorboard": False})
    Trainer(off, plain, dev).run(stop_after_steps=5)
    Trainer(off, plain, dev, resume="").run()
    assert not (plain / "tensorboard").exists()
    assert [r["loss"] for r in metrics(plain)] == [r["loss"] for r in rows]
    other = ck.load_checkpoint(plain).params
    for name in params:
        np.testing.assert_array_equal(params[name], other[name], err_msg=name)


def test_a_resume_from_an_older_checkpoint_shows_each_step_once(dev, small_corpus, tmp_path):
    """Back to checkpoint 6 of an 8-step run: the new file's purge step makes TensorBoard drop what the
    first file holds after step 6, so steps 7 and 8 appear once, as the live branch logged them."""
    cfg = small_config(small_corpus)
    run = tmp_path / "run"
    Trainer(cfg, run, dev).run()
    Trainer(cfg, run, dev, resume=run / "checkpoints" / "step-0000006").run()
    acc, rows = board(run), metrics(run)
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == list(range(1, 9)) == [int(r["global_step"]) for r in rows]
    np.testing.assert_allclose([e.value for e in loss], [float(r["loss"]) for r in rows], rtol=1e-6)
    assert len(list((run / "tensorboard").iterdir())) == 2


def test_without_tensorboardx_the_run_says_how_to_turn_it_on_once(dev, small_corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # `import tensorboardX` raises ImportError
    said = []
    run = tmp_path / "run"
    assert Trainer(small_config(small_corpus), run, dev, reporter=recorder(said)).run() == "done"
    (hint,) = warnings_of(said)
    assert "tensorboardX is not installed" in hint and "pip install tensorboardX" in hint
    assert "catchat[live]" in hint and "log.tensorboard = false" in hint
    assert not (run / "tensorboard").exists() and len(metrics(run)) == 8

    quiet = []  # switched off: not a word
    off = cfgmod.with_changes(small_config(small_corpus), log={"tensorboard": False})
    Trainer(off, tmp_path / "off", dev, reporter=recorder(quiet)).run()
    assert warnings_of(quiet) == []


def test_a_failing_writer_costs_one_warning_line_and_never_the_run(dev, small_corpus, tmp_path, monkeypatch):
    def full_disk(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tb.EventFile, "scalars", full_disk)
    said = []
    run = tmp_path / "run"
    assert Trainer(small_config(small_corpus), run, dev, reporter=recorder(said)).run() == "done"
    (line,) = warnings_of(said)
    assert "TensorBoard logging stopped" in line and "No space left on device" in line and "training goes on" in line
    assert len(metrics(run)) == 8 and events(run)[-1]["event"] == "end"


# ------------------------------------------------------------------------------ catchat watch
def test_watch_follows_a_run_in_progress_and_exits_when_it_ends(small_corpus, tmp_path):
    """The trainer is held (SIGSTOP) so the run is certainly in progress: `watch --once` shows it,
    `watch` follows it; let go and stopped with Ctrl-C, the run ends and watch exits 0 after it."""
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(cfgmod.resolved_toml(small_config(small_corpus, total_steps=400)))
    run = tmp_path / "run"
    trainer = start_training(cfg_path, run)
    watcher = None
    try:
        wait_for_rows(trainer, run, 1, timeout=600)
        trainer.send_signal(signal.SIGSTOP)
        assert not [e for e in events(run) if e["event"] == "end"]

        r = catchat("watch", run, "--once")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith("step ") and "/400" in r.stdout and "run ended" not in r.stdout

        watcher = subprocess.Popen([sys.executable, "-m", "catchat.cli", "watch", str(run), "--interval", "0.05"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        ready, _, _ = select.select([watcher.stdout], [], [], 300)  # hang guard
        assert ready, "watch printed nothing"
        first = watcher.stdout.readline()
        assert first.startswith("step ") and "/400" in first, first
        assert watcher.poll() is None  # the run has not ended: watch goes on

        trainer.send_signal(signal.SIGCONT)
        wait_for_rows(trainer, run, 3, timeout=600)  # the eval at step 2 is logged before row 3
        trainer.send_signal(signal.SIGINT)
        assert trainer.wait(timeout=600) == 130
        rest, _ = watcher.communicate(timeout=300)
    finally:
        for proc in (trainer, watcher):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
    out = first + rest
    assert watcher.returncode == 0, out
    assert "eval step 2: loss" in out and "Traceback" not in out
    end = events(run)[-1]
    assert out.rstrip().splitlines()[-1] == f"run ended at step {end['global_step']}: interrupted (SIGINT)"


def test_watch_refuses_what_is_not_a_run(tmp_path):
    assert_clean_error(catchat("watch", tmp_path), 2, "not a catchat run directory")
    assert_clean_error(catchat("watch", tmp_path / "nope"), 2, "is not a directory")
    assert_clean_error(catchat("watch", tmp_path, "--interval", "0"), 2, "--interval")
    assert list(tmp_path.iterdir()) == []


def _fake_run(run, rows=5, end=None):
    """A run directory as the trainer writes it: a start event, `rows` metrics rows, maybe an end."""
    run.mkdir(exist_ok=True)
    start = {"event": "start", "global_step": 0, "time": 1.0, "total_steps": 10}
    (run / "events.jsonl").write_text(json.dumps(start) + "\n" + (json.dumps(end) + "\n" if end else ""))
    (run / "metrics.csv").write_bytes(HEADER + b"\n" + b"".join(_row(s) for s in range(1, rows + 1)))


def _row(step, loss=None):
    loss = 4.0 - 0.1 * step if loss is None else loss
    return (f"{step},{4 * step},0,{64 * step},0.01,1,{loss:.6f},0.5,0,64,1000.0,64.0,0,0,"
            f"{0.5 * step:.3f},{step / 10},1\n").encode()


def test_watch_exits_1_when_the_training_process_is_gone(tmp_path):
    run = tmp_path / "run"
    _fake_run(run)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run / ".lock").write_text(f"{dead.pid} {socket.gethostname()} 2026-12-03T00:00:00\n")
    r = catchat("watch", run, "--interval", "0.05", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"pid {dead.pid}) is gone without an end event" in r.stdout and "Traceback" not in r.stdout + r.stderr

    _fake_run(run, end={"event": "end", "global_step": 5, "time": 2.0, "reason": "failed: device lost"})
    r = catchat("watch", run, timeout=300)
    assert r.returncode == 1 and "run ended at step 5: failed: device lost" in r.stdout
    r = catchat("watch", run, "--timeout", "0.01", "--once", timeout=300)
    assert r.returncode == 0


def test_watch_times_out_with_124(tmp_path):
    run = tmp_path / "run"
    _fake_run(run)  # no lock: whether it runs cannot be told, so only --timeout ends the watch
    r = catchat("watch", run, "--timeout", "0.2", "--interval", "0.05", timeout=300)
    assert r.returncode == 124 and "still going after --timeout 0.2 s" in r.stdout


def test_the_watch_state_follows_appends_rewinds_and_replaced_files(tmp_path):
    run = tmp_path / "run"
    _fake_run(run, rows=3)
    w = RunWatch(run)
    assert w.poll() and w.state.step == 3 and w.state.total_steps == 10
    assert not w.poll()  # nothing new
    with open(run / "metrics.csv", "ab") as f:
        f.write(_row(4) + _row(5)[:9])  # row 5 cut short: a write in flight
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": "eval", "global_step": 4, "loss": 3.5, "bpc": 5.0, "top1": 0.2,
                            "top5": 0.5, "tokens": 256}) + "\n")
    assert w.poll() and w.state.step == 4 and [e.step for e in w.state.evals] == [4]
    with open(run / "metrics.csv", "ab") as f:
        f.write(_row(5)[9:] + _row(4, loss=9.0))  # row 5 completed; then a rewind to step 4 (the later wins)
    w.poll()
    assert list(w.state.steps) == [1, 2, 3, 4] and w.state.losses[-1] == 9.0

    # a resume from checkpoint 2 replaces both files (written aside, renamed): read again from the start
    resume = {"event": "resume", "global_step": 2, "time": 3.0, "total_steps": 10, "from": "step-0000002"}
    (run / "m.tmp").write_bytes(HEADER + b"\n" + _row(1) + _row(2))
    (run / "e.tmp").write_text((run / "events.jsonl").read_text() + json.dumps(resume) + "\n")
    os.replace(run / "m.tmp", run / "metrics.csv")
    os.replace(run / "e.tmp", run / "events.jsonl")
    assert w.poll() and list(w.state.steps) == [1, 2] and w.state.evals == [] and w.state.process_from == 2
    assert plain_status(w.state).startswith("step 2/10 (20%)  loss ")
    with open(run / "events.jsonl", "a") as f:
        f.write("not json\n" + json.dumps({"event": "end", "global_step": 2, "time": 4.0, "reason": "done"}) + "\n")
    w.poll()
    assert w.state.ended["reason"] == "done" and w.state.bad_lines == 1


def test_braille_chart_draws_any_series():
    steps = np.arange(1, 301, dtype=np.float64)
    lines = braille_chart([(steps, 4 - np.log(steps), "cyan"), (np.array([150.0, 300.0]), np.array([2.0, 1.5]), "m")],
                          width_cells=40, height_cells=6)
    assert len(lines) == 7 and all(len(t.plain) == len(lines[0].plain) for t in lines[:-1])
    assert lines[-1].plain.strip().startswith("└1") and lines[-1].plain.endswith("300")
    assert any(ch != "\u2800" for ch in lines[0].plain[8:])  # the curve starts at the top
    flat = braille_chart([(steps, np.full(300, 2.0), "cyan")], 20, 4)
    assert len(flat) == 5
    assert braille_chart([(steps, np.full(300, np.nan), "cyan")], 20, 4)[0].plain == "(no finite values yet)"


def test_the_terminal_view_shows_status_curve_evals_anomalies_and_end(tmp_path):
    from rich.console import Console

    run = tmp_path / "run"
    _fake_run(run, rows=5, end={"event": "end", "global_step": 5, "time": 2.0, "reason": "done"})
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": "eval", "global_step": 4, "loss": 3.5, "bpc": 5.05, "top1": 0.2, "top5": 0.5,
                            "tokens": 256, "free_running": {"loss": 4.1, "bpc": 5.9, "top1": 0.1, "top5": 0.3}}) + "\n")
    w = RunWatch(run)
    w.poll()
    w.scan(0.0)
    console = Console(record=True, width=90, force_terminal=True, color_system=None)
    console.print(render(w, 90))
    text = console.export_text()
    assert "step 5/10 (50%)" in text and "┤" in text and "└1" in text
    assert "3.5000" in text and "4.1000" in text and "20.0%" in text  # the eval row, both halves
    assert "anomalies" in text and "run ended at step 5: done" in text
