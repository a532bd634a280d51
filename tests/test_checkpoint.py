"""Checkpoints: round trip, atomicity, `latest`, pruning, and clear refusals of bad files."""

import json

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
