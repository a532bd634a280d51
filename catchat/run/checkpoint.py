"""Checkpoints: atomic save, verified load, keep-last-K, and the `latest` pointer.

A checkpoint is a directory `checkpoints/step-NNNNNNN/` (N = optimizer steps completed: the model
in it has taken exactly N steps, lesson 3) holding
    model.safetensors      parameters under PyTorch names (loads with safetensors.torch.load_file)
    optimizer.safetensors  Adam moments `exp_avg.<name>`, `exp_avg_sq.<name>`, spectral-norm vectors,
                           and the carried hidden state `carry.h0` [L,B,H]
    state.json             step, seqs, cycle, data cursor, RNG, schedule, config (the run's plan), the
                           config file's own values ("config_file", how a resume tells an edited
                           file: catchat/training/plan.py), vocab fingerprint, and the sha256 of
                           both tensor files (corruption is caught on load); a
                           time-budgeted run's also its run clock ("budget": catchat/run/budget.py), an
                           fp16 run's loss scale ("loss_scale": catchat/precision.py)
model.safetensors's header metadata also holds a copy of state.json (all but `sha256`), so an edited
state.json is refused naming the field (catchat/run/statecopy.py).
It is written into a temporary sibling directory, fsynced, then renamed into place; `latest` (a
one-line text file naming the directory) is replaced last. A crash at any point leaves the
previous checkpoint and `latest` intact. `checkpoints/` holds only the run's live branch: a resume
from an older checkpoint moves the newer ones aside (catchat/run/rundir.py), so pruning by step number
prunes only the live lineage.

Loading trusts nothing in state.json: every field is checked (types, ranges, the step against the
directory name), the sha256 of both tensor files is required (`allow_unverified` skips the check,
for a user who says so), state.json must equal the copy in the model file, and non-finite weights are
refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from catchat import precision
from catchat.data import vocab
from catchat.errors import UsageError
from catchat.fsutil import atomic_write_text, fsync_dir, remove_stale_temporaries
from catchat.run import budget, statecopy, tensorfile
from catchat.run.faults import crash_point
from catchat.run.runlock import check_no_other_writer

FORMAT = "catchat-checkpoint"
FORMAT_VERSION = 1
MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, LATEST = "model.safetensors", "optimizer.safetensors", "state.json", "latest"
MAX_STEP = 2**32 - 1  # the bound config.py puts on train.total_steps (the GPU's step counter is uint32)
_STEP_DIR = re.compile(r"^step-(\d+)$")


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
    optimizer: dict[str, np.ndarray] | None  # None unless loaded with_optimizer (resume needs it)
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


def _write_tensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> str:
    """Write a tensor file (byte-identical for identical state: sorted header); returns its sha256."""
    return tensorfile.write(path, tensors, metadata)


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
        full_state = {"format": FORMAT, "format_version": FORMAT_VERSION, **state,
                      "global_step": int(global_step), "vocab": vocab.NAME, "vocab_fingerprint": vocab.FINGERPRINT}
        model_meta = {**meta, "model": json.dumps(state.get("model", {})),
                      statecopy.METADATA_KEY: statecopy.saved_copy(full_state)}  # covered by the model's sha256
        hashes = {MODEL_FILE: _write_tensors(tmp / MODEL_FILE, params, model_meta),
                  OPTIMIZER_FILE: _write_tensors(tmp / OPTIMIZER_FILE, optimizer, meta)}
        full_state["sha256"] = hashes
        atomic_write_text(tmp / STATE_FILE, json.dumps(full_state, indent=1, sort_keys=True))
        fsync_dir(tmp)
        crash_point("save.written")
        if final.exists():  # re-saving a step (a resumed run re-reaching it): swap by renames, so a
            _retire(ckpt_root, final)  # crash leaves either the old or the new one, never a partial one
        os.replace(tmp, final)
        fsync_dir(ckpt_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    crash_point("save.renamed")
    point_latest(ckpt_root, final.name)
    crash_point("save.latest")
    if keep_last > 0:
        prune(ckpt_root, keep_last)
    else:
        remove_stale(ckpt_root)
    return final


def point_latest(ckpt_root: Path, name: str) -> None:
    """Replace `latest` (atomically) so that it names checkpoint directory `name`."""
    atomic_write_text(Path(ckpt_root) / LATEST, name + "\n")


def latest_name(ckpt_root: Path) -> str | None:
    """The directory name `latest` holds, or None without a readable `latest`."""
    try:
        return (Path(ckpt_root) / LATEST).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def dir_step(path: Path) -> int | None:
    """N of a `step-N` directory name, else None."""
    m = _STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def _retire(ckpt_root: Path, ckpt: Path) -> None:
    """Take a checkpoint out of service atomically: point `latest` away from it (at the newest other
    complete one) if it names it, then rename it to a hidden `.step-*` name, removed later."""
    check_no_other_writer(ckpt_root.parent)  # never another live process's checkpoint
    if latest_name(ckpt_root) == ckpt.name:
        others = [p for p in list_checkpoints(ckpt_root) if p != ckpt]
        if others:
            point_latest(ckpt_root, others[-1].name)
    trash = ckpt_root / f".{ckpt.name}.old.{os.getpid()}"  # a rename in place: needs no free space
    if trash.exists():
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(ckpt, trash)
    fsync_dir(ckpt_root)
    crash_point("prune.retired")
    shutil.rmtree(trash, ignore_errors=True)


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first by step (temporary and partial ones are ignored)."""
    ckpt_root = Path(ckpt_root)
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.glob("step-*")
             if dir_step(p) is not None and p.is_dir() and (p / STATE_FILE).exists()]
    return sorted(found, key=dir_step)


def prune(ckpt_root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` checkpoints (never the one `latest` names)."""
    keep = set(list_checkpoints(ckpt_root)[-keep_last:])
    if latest_name(ckpt_root):
        keep.add(ckpt_root / latest_name(ckpt_root))
    for p in list_checkpoints(ckpt_root):
        if p not in keep:
            _retire(ckpt_root, p)  # renamed away first: a kill mid-delete never leaves a partial step-N
    remove_stale(ckpt_root)


def remove_stale(ckpt_root: Path) -> None:
    """Remove what a killed writer left: temporary or retired `.step-*` directories and the
    temporaries of atomic writes (`.latest.PID.tmp`; one writer per run directory is assumed)."""
    check_no_other_writer(Path(ckpt_root).parent)  # a live writer's `.step-*` is a save in progress
    for stale in Path(ckpt_root).glob(".step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    remove_stale_temporaries(ckpt_root)


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
            target = root / (latest_name(root) or "")
            if not (target / STATE_FILE).exists():
                raise UsageError(f"{latest} names {target.name}, which is not a complete checkpoint",
                                 hint=f"point at one of: {', '.join(x.name for x in list_checkpoints(root)) or 'none'}")
            return target
        done = list_checkpoints(root)
        if done:  # a first save killed before it wrote `latest`: its checkpoint is whole
            return done[-1]
    raise UsageError(f"no checkpoint at {p}", hint="give a run directory or a checkpoints/step-NNNNNNN directory")


def _read_tensors(path: Path) -> dict[str, np.ndarray]:
    return tensorfile.read(path)[0]


MAX_STATE_BYTES = 64 * 2**20  # state.json holds a config and a cursor: kilobytes; more is not ours
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _read_state(state_path: Path) -> dict:
    """state.json as a dict whose format is ours, or a UsageError naming the file."""
    damaged = "the checkpoint is damaged: resume from an earlier one"
    try:
        if state_path.stat().st_size > MAX_STATE_BYTES:
            raise ValueError(f"{state_path.stat().st_size} bytes, more than a state file holds")
        state = json.loads(state_path.read_bytes().decode("utf-8"))
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"format is {state.get('format') if isinstance(state, dict) else type(state).__name__!r}")
    except RecursionError:
        raise UsageError(f"{state_path} is not a valid catchat state file (nested too deeply)", hint=damaged) from None
    except (OSError, ValueError, TypeError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UsageError(f"{state_path} is not a valid catchat state file ({exc})", hint=damaged) from None
    return state


def state_problems(state: dict, ckpt: Path, *, for_resume: bool) -> list[str]:
    """What is wrong with the fields of a checkpoint's state.json (empty when nothing is).

    Every field a command relies on is checked for type and range, and global_step against the
    `step-N` directory name: an edited or damaged state.json is refused, never trusted."""
    problems = []

    def need(key, ok, what, required=True):
        if key not in state:
            if required:
                problems.append(f"no {key!r} entry")
        elif not ok(state[key]):
            problems.append(f"{key} must be {what}, got {json.dumps(state[key])[:60]}")

    need("format_version", lambda v: v == FORMAT_VERSION, f"{FORMAT_VERSION}")
    need("global_step", lambda v: _is_int(v) and 0 <= v <= MAX_STEP, f"a whole number in [0, {MAX_STEP}]")
    need("config", lambda v: isinstance(v, dict), "a table")
    need("vocab_fingerprint", lambda v: isinstance(v, str), "a string")
    for key in ("applied_steps", "seqs", "cycle", "tokens_seen", "run_seed"):
        need(key, lambda v: _is_int(v) and 0 <= v, "a whole number >= 0", required=for_resume and key != "tokens_seen")
    need("cursor", lambda v: isinstance(v, dict), "a table", required=for_resume)
    need("schedule", lambda v: isinstance(v, dict), "a table", required=False)
    need("config_file", lambda v: isinstance(v, dict) and all(isinstance(t, dict) for t in v.values()),
         "a table of sections", required=False)
    _check_budget(state, problems, for_resume)
    if "loss_scale" in state and (why := precision.valid_state(state["loss_scale"])):
        problems.append(f"loss_scale: {why}")
    step = state.get("global_step")
    if _is_int(step):
        if _is_int(state.get("applied_steps")) and state["applied_steps"] > step:
            problems.append(f"applied_steps {state['applied_steps']} exceeds global_step {step}")
        named = dir_step(ckpt)
        if named is not None and named != step:
            problems.append(f"global_step is {step} but the directory is {ckpt.name}")
    return problems


def _check_budget(state: dict, problems: list[str], for_resume: bool) -> None:
    """The run clock of a time-budgeted checkpoint ("budget": budget_s, elapsed_s, train_start_s,
    progress). Required to resume one whose config has a budget; absent from older and unbudgeted
    checkpoints (a budget given to those starts counting at the resume)."""
    train = state.get("config", {}).get("train", {}) if isinstance(state.get("config"), dict) else {}
    budgeted = isinstance(train, dict) and isinstance(train.get("time_budget_s"), (int, float)) \
        and train["time_budget_s"] > 0
    if "budget" not in state:
        if budgeted and for_resume:
            problems.append("no 'budget' entry (the run clock of a time-budgeted run)")
        return
    why = budget.valid_state(state["budget"])
    if why:
        problems.append(f"budget: {why}")


def _verify_hashes(state: dict, ckpt: Path, files: tuple[str, ...], allow_unverified: bool, warn) -> None:
    """Check the recorded sha256 of `files`; a missing record is refused unless allow_unverified."""
    state_path = ckpt / STATE_FILE
    hashes = state.get("sha256")
    if hashes is not None and (not isinstance(hashes, dict) or not set(hashes) <= {MODEL_FILE, OPTIMIZER_FILE}
                               or not all(isinstance(v, str) and _HEX64.match(v) for v in hashes.values())):
        raise UsageError(f"{state_path}: its sha256 entry is not a map of {MODEL_FILE} / {OPTIMIZER_FILE} to hashes",
                         hint="the checkpoint is damaged: resume from an earlier one")
    hashes = hashes or {}
    for name in files:
        f = ckpt / name
        if not f.exists():
            raise UsageError(f"{f} is missing", hint="the checkpoint is incomplete: resume from an earlier one")
        if name not in hashes:
            if not allow_unverified:
                raise UsageError(f"{state_path} records no sha256 for {name}, so its integrity cannot be checked",
                                 hint="use another checkpoint, or pass --allow-unverified to load it anyway")
            warn(f"warning: {f} is loaded unverified (no sha256 in {STATE_FILE}; --allow-unverified)")
        elif _sha256(f) != hashes[name]:
            raise UsageError(f"{f} is corrupt (sha256 differs from the one recorded in {STATE_FILE})",
                             hint="resume from an earlier checkpoint")


def _check_state_copy(state: dict, model_meta: dict[str, str], state_path: Path) -> None:
    """Refuse a state.json that differs from the copy saved in the model file's metadata, naming the
    fields (catchat/run/statecopy.py). Checked after the tensor files' hashes, so the copy is the one
    that was saved (or, with --allow-unverified, as trusted as the tensors). A checkpoint written
    before the copy existed has none: it loads as before. A difference is refused even with
    --allow-unverified: that flag takes the user's word for a file nothing can check, not for one
    a check found edited."""
    copy = model_meta.get(statecopy.METADATA_KEY)
    if copy is None:
        return
    try:
        diffs = statecopy.differences(state, copy)
    except RecursionError:
        diffs = ["nested too deeply to compare"]
    if diffs:
        raise UsageError(f"{state_path} was changed after it was saved: " + "; ".join(diffs),
                         hint=f"restore it (the saved values are in {MODEL_FILE}'s metadata "
                              f"{statecopy.METADATA_KEY!r}), or use another checkpoint of the run (checkpoints/step-*)")


def _check_finite(tensors: dict[str, np.ndarray], path: Path) -> None:
    """Refuse NaN or infinite values: a model saved that way cannot train or generate."""
    bad = [k for k, v in tensors.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
    if bad:
        raise UsageError(f"{path} holds non-finite values (NaN or inf) in {', '.join(sorted(bad)[:4])}"
                         + (f" and {len(bad) - 4} more" if len(bad) > 4 else ""),
                         hint="the checkpoint is damaged or from a diverged run: use an earlier one")


def load_checkpoint(path: str | Path, *, with_optimizer: bool = False, allow_unverified: bool = False,
                    warn=None) -> Checkpoint:
    """Load and verify a checkpoint: format, every state field, vocabulary fingerprint (lesson 1),
    file hashes, state.json against its saved copy, shapes against its own config, finite values.
    The optimizer file is read (and required) only `with_optimizer` (a resume); eval and generation
    need only the model.

    A reader given a run (not one step-N directory) while it trains can lose a race with keep_last:
    the checkpoint `latest` named is retired between reading `latest` and reading its files (inspect
    failed so about once in 245 calls with keep_last 1; a loaded machine lost two in a row). Such a
    failure is retried, with the checkpoint the run names then, for as long as each lost read is
    explained by a newer save (`latest` moved while it read); a failure without one is the error."""
    kwargs = dict(with_optimizer=with_optimizer, allow_unverified=allow_unverified, warn=warn)
    if _is_step_dir(path):  # the user chose this checkpoint: no other one may stand in for it
        return _load_resolved(resolve(path), **kwargs)
    while True:
        named, chosen = _latest_names(path), None
        try:
            chosen = resolve(path)
            return _load_resolved(chosen, **kwargs)
        except (UsageError, OSError):
            still_there = chosen is not None and (chosen / STATE_FILE).exists()
            if still_there or _latest_names(path) == named:
                raise  # not rotated away by a newer save: the error is the checkpoint's own


def _latest_names(path: str | Path) -> tuple[str | None, str | None]:
    """What `latest` names in a run directory given as `path` or in its checkpoints/ (None where absent)."""
    p = Path(path)
    return tuple(latest_name(root.parent if root.name == LATEST else root) for root in (p, p / "checkpoints"))


def _is_step_dir(path: str | Path) -> bool:
    return dir_step(Path(path)) is not None or (Path(path) / STATE_FILE).exists()


def _load_resolved(ckpt: Path, *, with_optimizer: bool, allow_unverified: bool, warn) -> Checkpoint:
    """load_checkpoint of the checkpoint directory `ckpt` itself."""
    state_path = ckpt / STATE_FILE
    state = _read_state(state_path)
    problems = state_problems(state, ckpt, for_resume=with_optimizer)
    if problems:
        raise UsageError(f"{state_path} is damaged: " + "; ".join(problems),
                         hint="resume from another checkpoint of the run (checkpoints/step-*)")
    state = CheckpointState(state)
    state.path = str(state_path)
    check_fingerprint(state.get("vocab_fingerprint"), str(ckpt))
    files = (MODEL_FILE, OPTIMIZER_FILE) if with_optimizer else (MODEL_FILE,)
    _verify_hashes(state, ckpt, files, allow_unverified, warn or (lambda m: print(m, file=sys.stderr)))
    params, model_meta = tensorfile.read(ckpt / MODEL_FILE)
    _check_state_copy(dict(state), model_meta, state_path)
    from catchat import config as cfgmod
    from catchat.model import param_specs

    cfg = cfgmod.from_dict(state["config"], source=f"{state_path} (its config)")
    diffs = shape_differences(params, {p.name: p.shape for p in param_specs(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE))})
    if diffs:  # the tensors must fit the model its own state.json describes
        raise UsageError(f"{ckpt / MODEL_FILE} does not match the model in its {STATE_FILE}: " + "; ".join(diffs),
                         hint="the checkpoint is damaged: resume from an earlier one")
    _check_finite(params, ckpt / MODEL_FILE)
    optimizer = None
    if with_optimizer:
        optimizer = _read_tensors(ckpt / OPTIMIZER_FILE)
        _check_finite(optimizer, ckpt / OPTIMIZER_FILE)
    return Checkpoint(ckpt, params, optimizer, state)


def check_fingerprint(found: str | None, where: str) -> None:
    """Refuse data made with another vocabulary (docs/lessons.md, lesson 1)."""
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
