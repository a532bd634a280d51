"""Checkpoints: atomic save, verified load, keep-last-K, and the `latest` pointer.

A checkpoint is a directory `checkpoints/step-NNNNNNN/` (N = optimizer steps completed: the model
in it has taken exactly N steps, lesson 3) holding
    model.safetensors      parameters under PyTorch names (loads with safetensors.torch.load_file)
    optimizer.safetensors  Adam moments `exp_avg.<name>`, `exp_avg_sq.<name>`, spectral-norm vectors,
                           and the carried hidden state `carry.h0` [L,B,H]
    state.json             step, seqs, cycle, data cursor, RNG, schedule, config, vocab fingerprint,
                           and the sha256 of both tensor files (corruption is caught on load)
It is written into a temporary sibling directory, fsynced, then renamed into place; `latest` (a
one-line text file naming the directory) is replaced last. A crash at any point leaves the
previous checkpoint and `latest` intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from catchat import vocab
from catchat.errors import UsageError

FORMAT = "catchat-checkpoint"
FORMAT_VERSION = 1
MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, LATEST = "model.safetensors", "optimizer.safetensors", "state.json", "latest"


class CheckpointState(dict):
    """state.json as a dict; reading a key it lacks is a UsageError naming the file, not a KeyError."""

    path: str = STATE_FILE

    def __missing__(self, key):
        raise UsageError(f"{self.path} has no {key!r} entry: the checkpoint is damaged or not from this catchat",
                         hint="use another checkpoint of the run (checkpoints/step-*)")


@dataclass
class Checkpoint:
    """A loaded checkpoint: tensors by name and the state dictionary."""

    path: Path
    params: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    state: dict

    @property
    def global_step(self) -> int:
        return int(self.state["global_step"])


def step_dir_name(global_step: int) -> str:
    return f"step-{int(global_step):07d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    from safetensors.numpy import save

    data = save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata=metadata)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(ckpt_root: Path, global_step: int, params: dict[str, np.ndarray],
                    optimizer: dict[str, np.ndarray], state: dict, keep_last: int = 0) -> Path:
    """Write checkpoint `step-N` under `ckpt_root` atomically, point `latest` at it, prune old ones.

    `state` must be JSON-serialisable; the format, vocab fingerprint, step and file hashes are added.
    Returns the final directory. On any error the previous checkpoints and `latest` are untouched.
    """
    ckpt_root = Path(ckpt_root)
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / step_dir_name(global_step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=ckpt_root))
    try:
        meta = {"format": FORMAT, "global_step": str(global_step), "vocab_fingerprint": vocab.FINGERPRINT}
        _write_tensors(tmp / MODEL_FILE, params, {**meta, "model": json.dumps(state.get("model", {}))})
        _write_tensors(tmp / OPTIMIZER_FILE, optimizer, meta)
        full_state = {"format": FORMAT, "format_version": FORMAT_VERSION, **state,
                      "global_step": int(global_step), "vocab": vocab.NAME, "vocab_fingerprint": vocab.FINGERPRINT,
                      "sha256": {MODEL_FILE: _sha256(tmp / MODEL_FILE), OPTIMIZER_FILE: _sha256(tmp / OPTIMIZER_FILE)}}
        _atomic_write_text(tmp / STATE_FILE, json.dumps(full_state, indent=1, sort_keys=True))
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step (a resumed run re-reaching it): swap by renames, so a
            _retire(ckpt_root, final)  # crash leaves either the old or the new one, never a partial one
        os.replace(tmp, final)
        _fsync_dir(ckpt_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _atomic_write_text(ckpt_root / LATEST, final.name + "\n")
    if keep_last > 0:
        prune(ckpt_root, keep_last)
    else:
        _remove_stale(ckpt_root)
    return final


def _retire(ckpt_root: Path, ckpt: Path) -> None:
    """Take a checkpoint out of service atomically: point `latest` away from it (at the newest other
    complete one) if it names it, then rename it to a hidden `.step-*` name, removed later."""
    latest = ckpt_root / LATEST
    if latest.is_file() and latest.read_text().strip() == ckpt.name:
        others = [p for p in list_checkpoints(ckpt_root) if p != ckpt]
        if others:
            _atomic_write_text(latest, others[-1].name + "\n")
    trash = ckpt_root / f".{ckpt.name}.old.{os.getpid()}"  # a rename in place: needs no free space
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(ckpt, trash)
    _fsync_dir(ckpt_root)
    shutil.rmtree(trash, ignore_errors=True)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first (temporary and partial ones are ignored)."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return []
    return sorted(p for p in ckpt_root.glob("step-*") if p.is_dir() and (p / STATE_FILE).exists())


def prune(ckpt_root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (never the one `latest` names)."""
    keep = set(list_checkpoints(ckpt_root)[-keep_last:])
    latest = ckpt_root / LATEST
    if latest.exists():
        keep.add(ckpt_root / latest.read_text().strip())
    for p in list_checkpoints(ckpt_root):
        if p not in keep:
            _retire(ckpt_root, p)  # renamed away first: a kill mid-delete never leaves a partial step-N
    _remove_stale(ckpt_root)


def _remove_stale(ckpt_root: Path) -> None:
    """Remove what a killed writer left: temporary or retired `.step-*` directories and `.latest.*.tmp`
    files (one writer per run directory is assumed)."""
    for stale in Path(ckpt_root).glob(".step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in Path(ckpt_root).glob(f".{LATEST}.*.tmp"):
        stale.unlink(missing_ok=True)


def resolve(path: str | Path) -> Path:
    """A checkpoint directory from: itself, a run directory, a checkpoints/ directory, or a `latest` file."""
    p = Path(path)
    for root in (p, p / "checkpoints"):
        if (root / STATE_FILE).exists():
            return root
        if root.is_file() and root.name == LATEST:
            root = root.parent
        latest = root / LATEST
        if latest.is_file():
            target = root / latest.read_text().strip()
            if not (target / STATE_FILE).exists():
                raise UsageError(f"{latest} names {target.name}, which is not a complete checkpoint",
                                 hint=f"point at one of: {', '.join(x.name for x in list_checkpoints(root)) or 'none'}")
            return target
    raise UsageError(f"no checkpoint at {p}", hint="give a run directory or a checkpoints/step-NNNNNNN directory")


def _read_tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for bad headers/data
        raise UsageError(f"{path} is not a readable safetensors file ({exc})",
                         hint="the file is corrupt: resume from an earlier checkpoint") from None


def load_checkpoint(path: str | Path, *, verify: bool = True) -> Checkpoint:
    """Load and verify a checkpoint: format, vocabulary fingerprint (lesson 1), file hashes."""
    ckpt = resolve(path)
    state_path = ckpt / STATE_FILE
    try:
        state = json.loads(state_path.read_text())
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"format is {state.get('format') if isinstance(state, dict) else type(state).__name__!r}")
        int(state["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{state_path} is not a valid catchat state file ({exc})",
                         hint="the checkpoint is damaged: resume from an earlier one") from None
    state = CheckpointState(state)
    state.path = str(state_path)
    check_fingerprint(state.get("vocab_fingerprint"), str(ckpt))
    hashes = state.get("sha256", {})
    if not isinstance(hashes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()) \
            or not set(hashes) <= {MODEL_FILE, OPTIMIZER_FILE}:
        raise UsageError(f"{state_path}: its sha256 entry is not a map of {MODEL_FILE} / {OPTIMIZER_FILE} to hashes",
                         hint="the checkpoint is damaged: resume from an earlier one")
    if verify:
        for name, digest in hashes.items():
            f = ckpt / name
            if not f.exists():
                raise UsageError(f"{f} is missing", hint="the checkpoint is incomplete: resume from an earlier one")
            if _sha256(f) != digest:
                raise UsageError(f"{f} is corrupt (sha256 differs from the one recorded in {STATE_FILE})",
                                 hint="resume from an earlier checkpoint")
    params = _read_tensors(ckpt / MODEL_FILE)
    if isinstance(state.get("config"), dict):  # the tensors must fit the model its own state.json describes
        from catchat import config as cfgmod
        from catchat.model import param_specs

        cfg = cfgmod.from_dict(state["config"], source=f"{state_path} (its config)")
        diffs = shape_differences(params, {p.name: p.shape for p in param_specs(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE))})
        if diffs:
            raise UsageError(f"{ckpt / MODEL_FILE} does not match the model in its {STATE_FILE}: " + "; ".join(diffs),
                             hint="the checkpoint is damaged: resume from an earlier one")
    return Checkpoint(ckpt, params, _read_tensors(ckpt / OPTIMIZER_FILE), state)


def check_fingerprint(found: str | None, where: str) -> None:
    """Refuse data made with another vocabulary (design.md lesson 1)."""
    if found != vocab.FINGERPRINT:
        raise UsageError(f"{where} was made with another vocabulary (fingerprint {str(found)[:12]}..., "
                         f"this catchat uses {vocab.NAME} {vocab.FINGERPRINT[:12]}...)",
                         hint="use a catchat version with that vocabulary, or retrain")


def check_shapes(params: dict[str, np.ndarray], expected: dict[str, tuple], where: str) -> None:
    """Refuse parameters whose names or shapes differ from the model config, listing every difference."""
    diffs = shape_differences(params, expected)
    if diffs:
        raise UsageError(f"{where} does not match the model config: " + "; ".join(diffs),
                         hint="use the config the checkpoint was trained with (its state.json has it)")


def shape_differences(params: dict[str, np.ndarray], expected: dict[str, tuple]) -> list[str]:
    """Every name missing, unexpected, or of another shape than expected (one string each)."""
    diffs = [f"{k}: missing" for k in expected if k not in params]
    diffs += [f"{k}: unexpected" for k in params if k not in expected]
    diffs += [f"{k}: {tuple(params[k].shape)} vs config {tuple(s)}" for k, s in expected.items()
              if k in params and tuple(params[k].shape) != tuple(s)]
    return diffs
