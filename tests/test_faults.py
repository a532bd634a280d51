"""Faults during training and on the device (issue 8): signals, kills, full disks, NaN gradients,
empty batches, a lost device, too little device memory. Each run that is stopped and resumed must
end bitwise equal to a straight run: nothing is lost. docs/reliability.md has the table."""

import csv
import dataclasses
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.data import corpus as corpus_mod
from catchat.errors import CatchatError, CheckpointWriteError, DeviceLost, UsageError, VulkanUnavailable
from catchat.model import ModelSpec, ParamLayout
from catchat.parity.model import random_window
from catchat.run import checkpoint as ck
from catchat.run import faults
from catchat.train import Trainer
from catchat.vk.device import Device, format_bytes
from catchat.vk.kernels import gru
from catchat.vk.program import Program, StepHyper

from support import (
    TOTAL,
    assert_clean_error,
    assert_same_as_straight,
    catchat,
    losses,
    resume_cli,
    rows_logged,
    saveable_model,
    start_training,
    wait_for_rows,
)

# ----------------------------------------------------------------------------------------- signals

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigint_at_a_random_moment_then_resume_is_bitwise_identical(cfg_path, straight, tmp_path, seed):
    """Ctrl-C at a seeded random moment (mostly inside a step: steps are most of the time): the step
    finishes, a checkpoint of exactly the steps logged is written, exit 130; --resume ends equal."""
    rng = np.random.default_rng(seed)
    run = tmp_path / "run"
    proc = start_training(cfg_path, run)
    wait_for_rows(proc, run, int(rng.integers(1, 22)))
    time.sleep(float(rng.uniform(0, 0.04)))
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "interrupted (SIGINT)" in out
    ckpt = ck.load_checkpoint(run)
    assert 0 < ckpt.global_step < TOTAL and ckpt.global_step == rows_logged(run)
    assert (run / "checkpoints" / "latest").read_text().strip() == ckpt.path.name
    assert ckpt.state["reason"] in ("interrupted (SIGINT)", "interval")  # the stop step may have had one
    resume_cli(cfg_path, run)
    assert_same_as_straight(run, straight)


def test_double_sigint_stops_at_once_and_nothing_is_lost(cfg_path, straight, tmp_path):
    """A second Ctrl-C stops at once, wherever it lands (even inside the final save): exit 130, no
    traceback; whatever `latest` names is complete, and resuming from it ends equal."""
    run = tmp_path / "run"
    proc = start_training(cfg_path, run)
    wait_for_rows(proc, run, 7)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in out, out
    assert ck.load_checkpoint(run).global_step >= 3  # the interval checkpoint at step 3 at least
    end = json.loads((run / "events.jsonl").read_text().splitlines()[-1])  # the stop is on record
    assert end["event"] == "end" and end["reason"].startswith("interrupted"), end
    resume_cli(cfg_path, run)
    assert_same_as_straight(run, straight)


def test_sigkill_mid_run_then_resume_is_bitwise_identical(cfg_path, straight, tmp_path):
    """kill -9 (no handler runs): the last checkpoint loads, rows logged after it are dropped on
    resume and logged again, and the run ends equal to the straight one."""
    run = tmp_path / "run"
    proc = start_training(cfg_path, run)
    wait_for_rows(proc, run, 11)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    saved = ck.load_checkpoint(run).global_step
    assert 0 < saved <= rows_logged(run)
    resume_cli(cfg_path, run)
    assert_same_as_straight(run, straight)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e["global_step"] for e in events if e["event"] == "resume"] == [saved]


SAVER = textwrap.dedent("""
    import sys
    import numpy as np
    from catchat.run import checkpoint as ck
    from support import saveable_model
    root = sys.argv[1]
    done = ck.list_checkpoints(root)
    step = int(done[-1].name.split("-")[1]) + 1 if done else 1
    params, state = saveable_model(hidden=256, seed=int(sys.argv[2]))  # 1.8 MB of weights
    opt = {f"exp_avg.{k}": v * 0.5 for k, v in params.items()}
    opt.update({f"exp_avg_sq.{k}": v * v for k, v in params.items()})
    print("ready", flush=True)
    while True:
        params["embedding.weight"][0, 0] = step
        ck.save_checkpoint(root, step, params, opt, state, keep_last=2)
        step += 1
""")


def test_sigkill_while_checkpoints_are_written(tmp_path):
    """A writer saving 2.5 MB checkpoints in a loop (keep_last=2: pruning too) is killed at seeded
    random moments, 8 times. After every kill: `latest` names a complete checkpoint that loads and
    verifies, every step-N directory listed is complete, and the next writer carries on."""
    root = tmp_path / "checkpoints"
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    rng = np.random.default_rng(8)
    newest = 0
    for round_ in range(8):
        proc = subprocess.Popen([sys.executable, str(script), str(root), str(round_)], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.02, 0.25)))
        proc.kill()
        proc.wait(timeout=30)
        listed = ck.list_checkpoints(root)
        if not listed:
            continue
        for p in listed:  # nothing listed is partial (pruning renames a directory away before deleting it)
            c = ck.load_checkpoint(p)
            assert c.params["embedding.weight"][0, 0] == c.global_step
        latest = (root / "latest").read_text().strip()
        assert ck.load_checkpoint(root).path.name == latest
        newest_now = int(listed[-1].name.split("-")[1])
        assert newest_now >= newest
        newest = newest_now
    assert newest >= 3, "the writer never finished a checkpoint: kill times too early"
    # the next save cleans up whatever the kills left behind
    params, state = saveable_model()
    ck.save_checkpoint(root, newest + 1, params, {}, state, keep_last=2)
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_resaving_a_step_swaps_atomically(tmp_path):
    """Re-saving step N (a resumed run reaching it again) never deletes the directory `latest` names
    in place: it is renamed away after `latest` points elsewhere, then replaced."""
    root = tmp_path / "checkpoints"
    params, state = saveable_model()
    for step in (1, 2):
        params["embedding.weight"][0, 0] = step
        ck.save_checkpoint(root, step, params, {}, state)
    params["embedding.weight"][0, 0] = 7.0
    ck.save_checkpoint(root, 2, params, {}, state)
    assert (root / "latest").read_text().strip() == "step-0000002"
    assert ck.load_checkpoint(root).params["embedding.weight"][0, 0] == 7.0
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------------- full disk

def test_disk_full_while_checkpointing_cli(dev, cfg_path, straight, tmp_path):
    """A real write failure from the kernel (RLIMIT_FSIZE: writes past 12 KiB fail with EFBIG, as a
    full disk fails with ENOSPC) in the middle of a checkpoint: one clear error naming the
    checkpoint and the reason, exit 1; the previous checkpoint stays intact and `latest` names it;
    no temporary directory is left; resuming later ends equal to the straight run."""
    run = tmp_path / "run"
    Trainer(cfgmod.load(cfg_path), run, dev).run(stop_after_steps=4)

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (12 << 10, 12 << 10))

    r = catchat("train", str(cfg_path), "--run-dir", str(run), "--resume", "--stop-after-steps", "3",
                preexec_fn=small_files)
    assert_clean_error(r, 1, "could not write checkpoint step-0000006", "File too large",
                       "a checkpoint needs 116 KiB there", " is free", "make room for 116 KiB in",
                       "step-0000004 is intact", "--resume")
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-0000004"
    assert ck.load_checkpoint(run).global_step == 4
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    end = json.loads((run / "events.jsonl").read_text().splitlines()[-1])
    assert end["event"] == "end" and end["reason"].startswith("failed: could not write checkpoint")
    Trainer(cfgmod.load(cfg_path), run, dev, resume="").run()
    assert_same_as_straight(run, straight)


def test_disk_full_injected_enospc(dev, cfg_path, tmp_path, monkeypatch):
    """ENOSPC injected into the second checkpoint write, then into a metrics write: clear errors that
    say which file and that the previous checkpoint is intact."""
    run = tmp_path / "run"
    real, calls = ck._write_tensors, []

    def fill_up(path, *a, **k):
        calls.append(path)
        if len(calls) > 2:  # the first checkpoint (model + optimizer) goes through
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(ck, "_write_tensors", fill_up)
    t = Trainer(cfgmod.load(cfg_path), run, dev)
    with pytest.raises(CheckpointWriteError) as info:
        t.run()
    e = info.value
    assert "could not write checkpoint step-0000006" in e.message and "No space left on device" in e.message
    assert "step-0000003 is intact" in e.hint and e.exit_code == 1
    assert [p.name for p in ck.list_checkpoints(run / "checkpoints")] == ["step-0000003"]
    monkeypatch.setattr(ck, "_write_tensors", real)

    def metrics_full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "metrics.csv"))

    t = Trainer(cfgmod.load(cfg_path), run, dev, resume="")
    monkeypatch.setattr(t.telemetry, "metrics_row", metrics_full)
    with pytest.raises(CatchatError) as info:
        t.run()
    assert "could not write" in info.value.message and "metrics.csv: No space left" in info.value.message
    assert "step-0000003 is intact" in info.value.hint


# A real ENOSPC (errno 28) from the kernel, not EFBIG (RLIMIT_FSIZE) or an injected OSError: write(2) fails
# with no file name, so catchat must name the file itself. The run stops itself (SIGSTOP at a crash point:
# no timing) at step 5's start, after its checkpoint at step 3; the disk fills; it goes on.
def _stopped_at_step_5(cmd: list, run, env=None):
    """`catchat train ... --run-dir RUN` (cmd: how to start Python) stopped at step 5's start."""
    proc = subprocess.Popen([*cmd, "-m", "catchat.cli", "train", *run], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {}), faults.CRASH_ENV: "train.step#5:STOP"})
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), status
    return proc


def _check_nothing_lost(dev, cfg_path, straight, run, failed_file, rows: int):
    """The rows logged (steps 1..rows, each the straight run's) and checkpoint 3 are intact, no temporary
    is left, an end event says why; continuing ends bitwise equal to the straight run."""
    assert losses(run) == losses(straight)[:rows]
    assert ck.load_checkpoint(run, with_optimizer=True).global_step == 3
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    end = json.loads((run / "events.jsonl").read_text().splitlines()[-1])
    assert end["event"] == "end" and end["reason"].startswith(f"failed: could not write {failed_file}")
    Trainer(cfgmod.load(cfg_path), run, dev, resume="").run()
    assert_same_as_straight(run, straight)


def test_a_real_enospc_on_the_metrics_file(dev, cfg_path, straight, tmp_path):
    """metrics.csv is pointed at /dev/full while the run is stopped: the next row's write(2) fails with
    ENOSPC from the kernel (as on a full disk). One error naming the file, the resume hint, exit 1."""
    run = tmp_path / "run"
    proc = _stopped_at_step_5([sys.executable], [str(cfg_path), "--run-dir", str(run)])
    rows = run / "metrics.csv"
    rows.rename(tmp_path / "kept.csv")
    rows.symlink_to("/dev/full")
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=180)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert_clean_error(r, 1, f"error: could not write {rows}: No space left on device",
                       f"catchat train CONFIG --run-dir {run} --resume")
    rows.unlink()
    (tmp_path / "kept.csv").rename(rows)
    _check_nothing_lost(dev, cfg_path, straight, run, rows, 4)  # step 5's row is the one that failed


# Inside a mount namespace of its own (unshare): mount a 4 MiB tmpfs at MNT, train on it until step 5's
# start, fill the file system but 16 KiB (the rows of steps 5 and 6 fit, step 6's checkpoint does not),
# go on, copy the run out to OUT, print the process's exit code and output.
_ON_A_FULL_TMPFS = textwrap.dedent("""
    import json, os, shutil, signal, subprocess, sys
    sys.path.insert(0, sys.argv[4])
    from test_faults import _stopped_at_step_5
    mnt, out, cfg = sys.argv[1:4]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt], check=True)
    proc = _stopped_at_step_5([sys.executable], [cfg, "--run-dir", os.path.join(mnt, "run")])
    fd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(4096))
    except OSError as e:
        assert e.errno == 28, e
    os.ftruncate(fd, os.fstat(fd).st_size - (16 << 10))
    os.close(fd)
    proc.send_signal(signal.SIGCONT)
    stdout, stderr = proc.communicate(timeout=180)
    shutil.copytree(os.path.join(mnt, "run"), os.path.join(out, "run"), symlinks=True)
    print(json.dumps({"rc": proc.returncode, "stdout": stdout, "stderr": stderr, "mnt": mnt}))
""")


def _own_mount_namespace(probe_dir) -> list[str] | None:
    """How to run a command where it may mount a tmpfs: a user and mount namespace (unprivileged, where
    the kernel allows it), or a mount namespace (root); None where neither can mount one."""
    for cmd in (["unshare", "-Urm"], ["unshare", "-m"]):
        try:
            r = subprocess.run([*cmd, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe_dir)],
                               capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return cmd
    return None


def test_a_real_enospc_while_checkpointing_on_a_full_file_system(dev, cfg_path, straight, tmp_path):
    """A real full file system (a small tmpfs, in a mount namespace of the test's own): step 6's
    checkpoint fails with ENOSPC; one error naming the checkpoint and its directory, the room it needs,
    the intact checkpoint and the resume, exit 1; nothing lost. Skipped only where no tmpfs can be
    mounted (no user namespaces and not root): test_a_real_enospc_on_the_metrics_file always runs."""
    (tmp_path / "mnt").mkdir()
    ns = _own_mount_namespace(tmp_path / "mnt")
    if ns is None:
        pytest.skip("cannot mount a tmpfs here (no unprivileged user namespaces, not root)")
    r = subprocess.run([*ns, sys.executable, "-c", _ON_A_FULL_TMPFS, str(tmp_path / "mnt"), str(tmp_path),
                        str(cfg_path), os.path.dirname(__file__)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    where = Path(got["mnt"]) / "run" / "checkpoints"
    assert_clean_error(subprocess.CompletedProcess([], got["rc"], got["stdout"], got["stderr"]), 1,
                       f"error: could not write checkpoint step-0000006 in {where}: No space left on device",
                       "a checkpoint needs 116 KiB there", f"make room for 116 KiB in {where}",
                       "step-0000003 is intact", "--resume")
    run = tmp_path / "run"
    _check_nothing_lost(dev, cfg_path, straight, run, "checkpoint step-0000006", 6)  # rows 5, 6 fitted


# ------------------------------------------------------------------------ NaN and empty batches

def read_rows(run):
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def read_events(run):
    return [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]


def test_nan_gradient_is_skipped_counted_logged_and_training_goes_on(cfg_path, tmp_path):
    """CATCHAT_FAULT=nan_grad@step=3 through the real CLI: step 3's gradient is NaN (its loss is not),
    the step is skipped (skipped=1, a skipped_step event, a console line), counted in the end event,
    and the run goes on with finite losses; `catchat scan` calls it a warning, not a defect."""
    run = tmp_path / "run"
    r = catchat("train", str(cfg_path), "--run-dir", str(run), "--stop-after-steps", "8",
                env={faults.ENV: "nan_grad@step=3"})
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "fault injection ($CATCHAT_FAULT): nan_grad@step=3" in r.stdout and "skipped step 3" in r.stdout
    rows = read_rows(run)
    assert len(rows) == 8
    bad = rows[2]
    assert bad["skipped"] == "1" and bad["grad_norm"] == "nan" and np.isfinite(float(bad["loss"]))
    assert int(bad["valid_tokens"]) > 0
    for row in rows[:2] + rows[3:]:
        assert row["skipped"] == "0" and np.isfinite(float(row["loss"])) and np.isfinite(float(row["grad_norm"]))
    events = read_events(run)
    skips = [e for e in events if e["event"] == "skipped_step"]
    assert [(e["global_step"], e["reason"]) for e in skips] == [(3, "non-finite gradient norm (nan)")]
    assert events[0]["faults"] == ["nan_grad@step=3"]
    assert events[-1]["event"] == "end" and events[-1]["skipped_steps"] == 1 and events[-1]["applied_steps"] == 7
    ckpt = ck.load_checkpoint(run)
    assert ckpt.state["applied_steps"] == 7 and all(np.isfinite(p).all() for p in ckpt.params.values())
    s = catchat("scan", str(run))
    assert s.returncode == 0 and "non-finite" in s.stdout and "warn" in s.stdout, s.stdout + s.stderr


def test_nan_gradient_leaves_the_model_untouched(dev, cfg_path, tmp_path):
    """The skipped step changes nothing but the counters: parameters, moments and Adam's t after a
    NaN step equal those before it (the fault is transient: no parameter is poisoned)."""
    cfg = cfgmod.load(cfg_path)
    t = Trainer(cfg, tmp_path / "run", dev, faults=faults.parse("nan_grad@step=3"))
    t.run(stop_after_steps=2)
    before = (t.prog.get_params(), *t.prog.get_optimizer_state())
    st = t.step()
    assert st.skipped and not np.isfinite(st.grad_norm) and np.isfinite(st.loss)
    after = (t.prog.get_params(), *t.prog.get_optimizer_state())
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert (t.global_step, t.applied_steps) == (3, 2)
    assert not t.step().skipped and t.applied_steps == 3


def test_zero_valid_batch_is_skipped(dev, tmp_path):
    """A corpus whose cycle ends in a window of padding and a final <eos> (no valid target): that
    step is skipped every cycle (skipped=1, valid_tokens=0, empty loss, an event) and training goes on."""
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"text": "a" * 15}) + "\n" + json.dumps({"text": "b" * 8}) + "\n")
    corpus_mod.build([src], tmp_path / "c", eval_fraction=0.0)
    cfg = cfgmod.from_dict({"model": {"hidden": 8, "layers": 1},
                            "data": {"corpus": str(tmp_path / "c"), "batch_lanes": 2, "window": 8,
                                     "eval_fraction": 0.0},
                            "train": {"total_steps": 7, "lr": 0.01}})
    t = Trainer(cfg, tmp_path / "run", dev)
    assert t.lanes.windows_per_cycle == 3  # 17 tokens = 2 windows of 8 + the lone final <eos>
    t.run()
    rows = read_rows(tmp_path / "run")
    assert [r["skipped"] for r in rows] == ["0", "0", "1", "0", "0", "1", "0"]
    for r in (rows[2], rows[5]):
        assert r["valid_tokens"] == "0" and r["loss"] == ""
    skips = [(e["global_step"], e["reason"]) for e in read_events(tmp_path / "run") if e["event"] == "skipped_step"]
    assert skips == [(3, "no valid targets"), (6, "no valid targets")]
    assert t.applied_steps == 5 and np.isfinite(float(rows[-1]["loss"]))


def test_zero_valid_fault_through_the_api(dev, cfg_path, tmp_path):
    t = Trainer(cfgmod.load(cfg_path), tmp_path / "run", dev, faults=faults.parse("zero_valid@step=2"))
    t.run(stop_after_steps=3)
    rows = read_rows(tmp_path / "run")
    assert [(r["skipped"], r["valid_tokens"] == "0") for r in rows] == [("0", False), ("1", True), ("0", False)]


def test_fault_spec_errors_are_one_line(cfg_path, tmp_path):
    assert faults.parse(" nan_grad @ step = 3 ,device_lost@step=9") == (faults.Fault("nan_grad", 3),
                                                                         faults.Fault("device_lost", 9))
    for bad in ("nan_grad", "nan_grad@step=0", "meteor@step=3", "nan_grad@3"):
        with pytest.raises(UsageError, match="CATCHAT_FAULT"):
            faults.parse(bad)
    r = catchat("train", str(cfg_path), "--run-dir", str(tmp_path / "run"), env={faults.ENV: "nan_grad@sep=3"})
    assert_clean_error(r, 2, "CATCHAT_FAULT", "'nan_grad@sep=3'")


# ----------------------------------------------------------------------------------- the device

def test_device_lost_mid_run_cli(dev, cfg_path, straight, tmp_path):
    """The device fails during step 5 (kp raises RuntimeError from a failed submit, as on
    VK_ERROR_DEVICE_LOST): one error naming the device and the step, exit 1; the fix line names
    the intact checkpoint (step 3) and how to resume; resuming ends equal to the straight run."""
    run = tmp_path / "run"
    r = catchat("train", str(cfg_path), "--run-dir", str(run), env={faults.ENV: "device_lost@step=5"})
    assert_clean_error(r, 1, "Vulkan device", "failed while running training step 5", "ErrorDeviceLost",
                       "step-0000003 is intact", "--resume")
    assert ck.load_checkpoint(run).global_step == 3
    assert read_events(run)[-1]["reason"].startswith("failed: device lost")
    Trainer(cfgmod.load(cfg_path), run, dev, resume="").run()
    assert_same_as_straight(run, straight)


class _Failing:
    def eval(self, *_):
        raise RuntimeError("vk::Device::waitForFences: ErrorDeviceLost")


def test_device_lost_in_program_sequences(dev):
    """Every recorded sequence and transfer of a Program turns kp's RuntimeError into DeviceLost."""
    spec, T, B = ModelSpec(vocab_size=101, hidden=8, layers=1), 4, 2
    prog = Program(dev, ParamLayout(spec), T, B)
    tok, tg, rs = random_window(np.random.default_rng(0), spec, T, B)
    prog.seq_eval = _Failing()
    with pytest.raises(DeviceLost, match="failed while running an evaluation window"):
        prog.eval_window(tok, tg, rs)
    prog.seq_first = _Failing()
    with pytest.raises(DeviceLost, match="training step 1 .micro-batch 1."):
        prog.train_step([(tok, tg, rs)], StepHyper(lr=1e-3), global_step=0)
    prog.seq_logits = _Failing()
    with pytest.raises(DeviceLost, match="a forward pass"):
        prog.forward_logits(tok, rs)


def test_too_little_device_memory_is_refused_before_allocating(dev):
    """A program whose buffers exceed the device's memory heap is refused up front, naming the size
    asked for and the config keys to lower; nothing is allocated."""
    small = dataclasses.replace(dev, info=dataclasses.replace(dev.info, device_memory_bytes=8 << 20),
                                allocated_bytes=0)
    layout = ParamLayout(ModelSpec(vocab_size=101, hidden=64, layers=2))
    with pytest.raises(VulkanUnavailable) as info:
        Program(small, layout, 64, 32)
    msg = str(info.value)
    assert f"needs {format_bytes(Program.planned_bytes(layout, 64, 32, True, small))} of device memory" in msg
    assert "has 8.0 MiB" in msg and "T=64, B=32" in msg and "H=64, L=2" in msg
    for key in ("model.hidden", "data.batch_lanes", "data.window"):
        assert key in info.value.hint
    assert small.allocated_bytes == 0


def test_a_window_past_lavapipes_loop_limit_is_refused_before_allocating(dev):
    """lavapipe ends a shader's loops after 65,535 iterations in all (the column sums over 262,144 rows
    came out wrong there without an error), so a CPU device refuses windows of more than
    CPU_MAX_WINDOW_TOKENS tokens up front, naming the keys to lower; nothing is allocated."""
    from catchat.vk.device import CPU_MAX_WINDOW_TOKENS

    cpu = dataclasses.replace(dev, info=dataclasses.replace(dev.info, type="CPU"), allocated_bytes=0)
    layout = ParamLayout(ModelSpec(vocab_size=101, hidden=8, layers=1))
    with pytest.raises(UsageError) as info:
        Program(cpu, layout, 1024, CPU_MAX_WINDOW_TOKENS // 1024 + 1)
    assert "132,096 tokens a window" in str(info.value) and "lavapipe" in str(info.value)
    assert "data.batch_lanes" in info.value.hint and "data.micro_batches" in info.value.hint
    assert cpu.allocated_bytes == 0
    gpu = dataclasses.replace(dev, info=dataclasses.replace(dev.info, type="discrete GPU"))
    gpu.check_loop_limit(CPU_MAX_WINDOW_TOKENS + 1)  # no such limit there
    cpu.check_loop_limit(CPU_MAX_WINDOW_TOKENS)


@pytest.mark.parametrize("spec,T,B", [(ModelSpec(101, 12, 2), 16, 4),
                                      (ModelSpec(101, 33, 3, tie_embeddings=True), 20, 7),
                                      (ModelSpec(101, 64, 1), 64, 32)])
@pytest.mark.parametrize("persistent", ["0", "64"])  # 64: resident sweeps, the backward's partial products
def test_planned_bytes_is_what_a_program_allocates(dev, spec, T, B, persistent, monkeypatch):
    monkeypatch.setenv("CATCHAT_PERSISTENT", persistent)
    for training in (True, False):
        before = dev.allocated_bytes
        prog = Program(dev, ParamLayout(spec), T, B, training=training)
        assert dev.allocated_bytes - before == Program.planned_bytes(ParamLayout(spec), T, B, training, dev)
        if training:
            resident = [isinstance(lay.gru.tiles, gru.ResidentTiles) for lay in prog.bwd.layers]
            assert all(resident) == (persistent == "64")


def test_huge_model_cli_names_size_and_keys(cfg_path, tmp_path):
    r = catchat("train", str(cfg_path), "--run-dir", str(tmp_path / "run"), "--set", "model.hidden=65536")
    assert_clean_error(r, 2, "H=65536", "GiB of device memory", "model.hidden", "data.batch_lanes", "data.window")


def test_failed_allocation_names_the_size(dev):
    """kp raises RuntimeError when vkAllocateMemory fails: it becomes a one-line error with the size."""

    class NoMemory:
        def tensor_t(self, *_):
            raise RuntimeError("vk::Device::allocateMemory: ErrorOutOfDeviceMemory")

    broken = Device(info=dev.info, manager=NoMemory(), kp=dev.kp)
    with pytest.raises(VulkanUnavailable) as info:
        broken.tensor(3 << 20)
    assert "could not allocate a buffer of 12.0 MiB" in info.value.message
    assert "ErrorOutOfDeviceMemory" in info.value.message and "model.hidden" in info.value.hint
    assert broken.allocated_bytes == 0


def test_no_vulkan_device_for_train_cli(cfg_path, tmp_path):
    bogus = {"VK_ICD_FILENAMES": "/nonexistent/icd.json", "VK_DRIVER_FILES": "/nonexistent/icd.json"}
    r = catchat("train", str(cfg_path), "--run-dir", str(tmp_path / "run"), env=bogus)
    assert_clean_error(r, 2, "mesa-vulkan-drivers")
