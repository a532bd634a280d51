"""Checkpoints: round trip, atomicity, `latest`, pruning, and clear refusals of bad files."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.errors import UsageError
from catchat.model import init_params
from catchat.run import checkpoint as ck

CONFIG = cfgmod.from_dict({"model": {"hidden": 4, "layers": 1}, "data": {"corpus": "x"}, "train": {"total_steps": 9}})


def _tensors(seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(cfgmod.model_spec(CONFIG), seed)
    opt = {f"exp_avg.{k}": np.zeros_like(v) for k, v in params.items()}
    opt["carry.h0"] = rng.standard_normal((1, 2, 4), dtype=np.float32)
    return params, opt


def _save(root, step, keep_last=0, seed=0):
    params, opt = _tensors(seed)
    state = {"seqs": step * 4, "cycle": 0, "applied_steps": step, "run_seed": 0, "cursor": {"cycle": 0},
             "config": cfgmod.to_dict(CONFIG)}
    return ck.save_checkpoint(root, step, params, opt, state, keep_last)


def test_round_trip_and_latest(tmp_path):
    root = tmp_path / "checkpoints"
    path = _save(root, 12)
    assert path.name == "step-0000012"
    assert (root / "latest").read_text().strip() == "step-0000012"
    loaded = ck.load_checkpoint(tmp_path, with_optimizer=True)  # a run dir resolves through checkpoints/latest
    params, opt = _tensors()
    assert loaded.global_step == 12 and loaded.state["seqs"] == 48
    for k in params:
        np.testing.assert_array_equal(loaded.params[k], params[k])
    np.testing.assert_array_equal(loaded.optimizer["carry.h0"], opt["carry.h0"])
    assert ck.resolve(path) == path and ck.resolve(root / "latest") == path


def test_keep_last_prunes_oldest(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        _save(root, step, keep_last=2)
    assert [p.name for p in ck.list_checkpoints(root)] == ["step-0000003", "step-0000004"]


def test_failed_write_leaves_previous_intact(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _save(root, 1)

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "_write_tensors", disk_full)
    with pytest.raises(OSError):
        _save(root, 2)
    assert (root / "latest").read_text().strip() == "step-0000001"
    assert [p.name for p in ck.list_checkpoints(root)] == ["step-0000001"]
    assert not list(root.glob(".step-*"))  # the temporary directory was removed
    assert ck.load_checkpoint(root).global_step == 1


def test_corrupt_tensor_file_is_named(tmp_path):
    path = _save(tmp_path, 5)
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-3] ^= 0xFF  # flip bits in the tensor payload: only the recorded hash can tell
    (path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(UsageError, match="model.safetensors is corrupt"):
        ck.load_checkpoint(path)
    (path / "model.safetensors").write_bytes(b"garbage")
    state = json.loads((path / "state.json").read_text())
    del state["sha256"]  # unverified: only the reader can tell
    (path / "state.json").write_text(json.dumps(state))
    with pytest.raises(UsageError, match="records no sha256"):
        ck.load_checkpoint(path)
    with pytest.raises(UsageError, match="not a valid safetensors file"):
        ck.load_checkpoint(path, allow_unverified=True, warn=lambda m: None)


def test_corrupt_state_json_is_named(tmp_path):
    path = _save(tmp_path, 5)
    (path / "state.json").write_text("{not json")
    with pytest.raises(UsageError, match="state.json is not a valid catchat state file"):
        ck.load_checkpoint(path)


def test_other_vocabulary_is_refused(tmp_path):
    path = _save(tmp_path, 5)
    state = json.loads((path / "state.json").read_text())
    state["vocab_fingerprint"] = "0" * 64
    (path / "state.json").write_text(json.dumps(state))
    with pytest.raises(UsageError, match="another vocabulary"):
        ck.load_checkpoint(path)


def test_shape_mismatch_lists_differences():
    params = {"embedding.weight": np.zeros((11, 4), np.float32), "layers.0.norm.weight": np.ones(4, np.float32)}
    expected = {"embedding.weight": (101, 4), "layers.0.norm.weight": (4,), "head.weight": (101, 4)}
    with pytest.raises(UsageError) as info:
        ck.check_shapes(params, expected, "ckpt")
    msg = str(info.value)
    assert "embedding.weight: (11, 4) vs config (101, 4)" in msg and "head.weight: missing" in msg


def test_latest_naming_a_partial_checkpoint_is_refused(tmp_path):
    root = tmp_path / "checkpoints"
    _save(root, 1)
    (root / "latest").write_text("step-0000009\n")
    with pytest.raises(UsageError, match="not a complete checkpoint"):
        ck.resolve(root)


# ---------------------------------------------------------------------------------------- readers (issue 39)
@pytest.mark.parametrize("rotations", [1, 2])
@pytest.mark.parametrize("moment", ["after latest was read", "while the files are read"])
def test_a_checkpoint_rotated_away_under_a_reader_is_retried(tmp_path, monkeypatch, moment, rotations):
    """The race `catchat inspect RUN` lost during training with keep_last 1, made to happen on the
    first read, or on the first two (a loaded machine lost two in a row): a newer save prunes the
    checkpoint the reader chose before it reads it. The reader loads the newest; a step-N directory
    the user named is never swapped for another."""
    _save(tmp_path, 1, keep_last=1)
    hook = "_load_resolved" if moment == "while the files are read" else "resolve"
    real, calls = getattr(ck, hook), []

    def rotate_first(path, **kw):
        calls.append(path)
        if len(calls) <= rotations:
            chosen = real(path, **kw) if hook == "resolve" else path
            _save(tmp_path, ck.dir_step(ck.list_checkpoints(tmp_path)[-1]) + 1, keep_last=1)  # the older one retired
            if hook == "resolve":  # resolve's own check, made after the retire, as the race had it
                return real(Path(chosen), **kw)
            return real(path, **kw)
        return real(path, **kw)

    monkeypatch.setattr(ck, hook, rotate_first)
    assert ck.load_checkpoint(tmp_path).global_step == 1 + rotations
    assert len(calls) == rotations + 1
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == [f"step-000000{1 + rotations}"]
    calls.clear()
    newest = tmp_path / f"step-000000{1 + rotations}"
    with pytest.raises((UsageError, OSError)):  # the named checkpoint went: its error, no stand-in
        ck.load_checkpoint(newest)


def test_a_run_whose_latest_checkpoint_went_without_a_newer_save_is_an_error_at_once(tmp_path, monkeypatch):
    """No newer save explains the loss (latest did not move): one read, then the error."""
    _save(tmp_path, 1)
    shutil.rmtree(tmp_path / "step-0000001")
    reads = []
    real = ck.resolve
    monkeypatch.setattr(ck, "resolve", lambda path: reads.append(path) or real(path))
    with pytest.raises(UsageError, match="not a complete checkpoint"):
        ck.load_checkpoint(tmp_path)
    assert len(reads) == 1


def test_reads_in_a_loop_while_a_writer_rotates_checkpoints(tmp_path):
    """A writer saving every step with keep_last 1 in one thread, reads of the run in a loop in
    another: every read loads a complete checkpoint (no timing is asserted: the loop runs as long
    as the writer does)."""
    import threading

    done, errors = threading.Event(), []

    def writer():
        try:
            for step in range(1, 301):
                _save(tmp_path, step, keep_last=1)
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)
        finally:
            done.set()

    _save(tmp_path, 0, keep_last=1)
    t = threading.Thread(target=writer)
    t.start()
    steps = []
    while not done.is_set():
        steps.append(ck.load_checkpoint(tmp_path).global_step)
    t.join()
    assert not errors and steps == sorted(steps) and len(steps) > 0


def test_inspect_in_a_loop_during_training_with_keep_last_1(corpus_dir, tmp_path):
    """The reported case through the real trainer: a checkpoint every step, keep_last 1; the run is
    read in a loop (load_checkpoint, and `catchat inspect RUN` now and then) until training ends."""
    from support import catchat, config_text, start_training, wait_for_rows

    cfg = tmp_path / "c.toml"
    cfg.write_text(config_text(corpus_dir, total_steps=60, checkpoint={"checkpoint_every_seqs": 8, "keep_last": 1}))
    run = tmp_path / "run"
    proc = start_training(cfg, run)
    try:
        wait_for_rows(proc, run, 2)
        steps, n = [], 0
        while proc.poll() is None:
            steps.append(ck.load_checkpoint(run).global_step)
            n += 1
            if n % 25 == 0:
                r = catchat("inspect", run)
                assert r.returncode == 0, r.stdout + r.stderr
        assert steps == sorted(steps) and len(steps) > 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.wait() == 0, proc.communicate()[0]
    assert ck.load_checkpoint(run).global_step == 60
