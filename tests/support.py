"""What several test files share: small corpora, tiny trained runs (seconds on lavapipe), and running
the `catchat` command as a user would (a subprocess) with the check that its error is clean."""

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from catchat import config as cfgmod
from catchat.data import corpus as corpus_mod
from catchat.run import checkpoint as ck
from catchat.train import Trainer

SCENE = "ALICE: Where is the cat?\nBOB: Asleep on the mat, as ever.\nALICE: Then let it sleep.\n"
DIALOGUE = [("ALICE", "Where is the cat?"), ("BOB", "Asleep on the mat, as ever."), ("ALICE", "Then let it sleep.")]


def load_tool(name: str):
    """tools/NAME.py as a module (the tools are scripts beside the package, not part of it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_scene_corpus(root: Path) -> Path:
    """24 plain-text scenes of different lengths, 20% held out: root/corpus."""
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    for i in range(24):
        (src / f"scene{i:02d}.txt").write_text(SCENE * (1 + i % 3) + f"BOB: Number {i}.\n")
    out = root / "corpus"
    corpus_mod.build([str(src)], out, eval_fraction=0.2, delimiter=None, force=True)
    return out


def build_dialogue_corpus(root: Path) -> Path:
    """24 short JSONL dialogues with speakers, 20% held out: root/corpus."""
    root.mkdir(parents=True, exist_ok=True)
    src = root / "src.jsonl"
    src.write_text("".join(json.dumps({"turns": [{"speaker": s, "text": f"{t} {i}"} for s, t in DIALOGUE]}) + "\n"
                           for i in range(24)))
    out = root / "corpus"
    corpus_mod.build([str(src)], out, eval_fraction=0.2, force=True)
    return out


def small_config(corpus_dir, **train):
    text = f"""
[model]
hidden = 12
layers = 2
[data]
corpus = "{corpus_dir}"
batch_lanes = 4
window = 16
micro_batches = 2
[train]
lr = 0.01
total_steps = {train.get('total_steps', 8)}
dropout_hidden = 0.1
dropout_embedding = 0.05
label_smoothing = 0.1
seed = 3
[schedule]
warmup_fraction = 0.25
cooldown_fraction = 0.25
lr_min = 0.001
[eval]
eval_every_seqs = 16
eval_windows = 2
[checkpoint]
checkpoint_every_seqs = 24
keep_last = 2
"""
    return cfgmod.loads(text)


def make_tiny_run(root: Path, dev, seed: int = 1) -> Path:
    """A 5-step run of a tiny model (H=16, L=1) on short dialogues: root/run, well under a second."""
    corpus_dir = build_dialogue_corpus(root)
    cfg = cfgmod.loads(f"""
[model]
hidden = 16
layers = 1
[data]
corpus = "{corpus_dir}"
batch_lanes = 4
window = 16
[train]
lr = 0.02
total_steps = 5
seed = {seed}
[eval]
eval_every_seqs = 0
[checkpoint]
checkpoint_every_seqs = 0
""")
    Trainer(cfg, root / "run", dev).run()
    return root / "run"


def shared_spirv_cache(root: Path) -> Path:
    """root, a CATCHAT_CACHE of a test's own (its tuning cache starts empty), whose spirv/ is the SPIR-V
    cache every other test uses (shaders.cache_dir(), read before CATCHAT_CACHE points here): the
    shaders a tuning test compiles are compiled once for the suite, not once a test."""
    from catchat.vk import shaders

    spirv = shaders.cache_dir()
    spirv.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "spirv").symlink_to(spirv, target_is_directory=True)
    return root


def sha256_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root (hidden ones too) -> sha256 of its bytes: to show a command wrote nothing.
    The run's `.lock` is left out: whoever takes the lock writes its pid there, refused or not."""
    return {str(p.relative_to(root)): sha256_of(p) for p in sorted(Path(root).rglob("*"))
            if p.is_file() and p.name != ".lock"}


def saveable_model(hidden: int = 4, layers: int = 1, seed: int = 0):
    """(params, state) of a real model config that save_checkpoint/load_checkpoint accept."""
    from catchat.model import init_params

    cfg = cfgmod.from_dict({"model": {"hidden": hidden, "layers": layers}, "data": {"corpus": "x"},
                            "train": {"total_steps": 9}})
    state = {"seqs": 0, "cycle": 0, "applied_steps": 0, "run_seed": 0, "cursor": {}, "config": cfgmod.to_dict(cfg)}
    return init_params(cfgmod.model_spec(cfg), seed), state


def catchat(*args, env=None, cwd=None, preexec_fn=None, timeout=180) -> subprocess.CompletedProcess:
    """Run `catchat ARGS...` in a fresh process (the user's view: exit code, stdout, stderr)."""
    return subprocess.run([sys.executable, "-m", "catchat.cli", *[str(a) for a in args]], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, preexec_fn=preexec_fn,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def assert_clean_error(r, code, *needles) -> str:
    """Exit code, no traceback, one error line plus at most a fix line, naming what it must."""
    out = r.stdout + r.stderr
    assert r.returncode == code, out
    assert "Traceback" not in out
    lines = r.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("error: "), r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)
    return r.stderr


# ------------------------------------------------------------------ runs stopped and resumed (test_faults,
# test_run_integrity)
TOTAL = 30  # steps of the reference run (about 1 s on lavapipe)


def config_text(corpus_dir, total_steps=TOTAL, **sections) -> str:
    body = {
        "model": {"hidden": 12, "layers": 2},
        "data": {"corpus": str(corpus_dir), "batch_lanes": 4, "window": 16, "micro_batches": 2},
        "train": {"lr": 0.01, "total_steps": total_steps, "dropout_hidden": 0.1, "dropout_embedding": 0.05,
                  "label_smoothing": 0.1, "seed": 3},
        "schedule": {"warmup_fraction": 0.25, "cooldown_fraction": 0.25, "lr_min": 0.001},
        "eval": {"eval_every_seqs": 48, "eval_windows": 2, "free_running": False, "sample_chars": 0},
        "checkpoint": {"checkpoint_every_seqs": 24, "keep_last": 2},
    }
    for sec, keys in sections.items():
        body.setdefault(sec, {}).update(keys)  # a section the base leaves at its defaults (teacher_forcing)
    return cfgmod.resolved_toml(cfgmod.from_dict(body))



def losses(run):
    with open(run / "metrics.csv") as f:
        return [r["loss"] for r in csv.DictReader(f)]


def assert_same_as_straight(run, straight, missing=frozenset()):
    """The loss column, final weights, Adam moments, carried state and data cursor: bitwise. missing: steps
    whose rows the run's metrics.csv lacks (cut from outside): the straight run's rows but those."""
    assert losses(run) == [x for s, x in enumerate(losses(straight), 1) if s not in missing]
    a, b = ck.load_checkpoint(straight, with_optimizer=True), ck.load_checkpoint(run, with_optimizer=True)
    assert a.global_step == b.global_step == TOTAL
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name], err_msg=name)
    for name in a.optimizer:
        np.testing.assert_array_equal(a.optimizer[name], b.optimizer[name], err_msg=name)
    assert a.state["cursor"] == b.state["cursor"] and a.state["applied_steps"] == b.state["applied_steps"]


def rows_logged(run) -> int:
    try:
        return max(0, len((run / "metrics.csv").read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def start_training(cfg_path, run, env=None):
    return subprocess.Popen([sys.executable, "-m", "catchat.cli", "train", str(cfg_path), "--run-dir", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def wait_for_rows(proc, run, n, timeout=120):
    deadline = time.time() + timeout
    while rows_logged(run) < n:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.time() < deadline, "training did not start"
        time.sleep(0.003)


def resume_cli(cfg_path, run):
    r = catchat("train", str(cfg_path), "--run-dir", str(run), "--resume")
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r


def streamed_like_the_twin(dev, T: int, B: int, H: int, n_wg: int, f32: bool = False, repeat: int = 1) -> dict:
    """The streamed sweeps (persistent over n_wg workgroups, 0: a dispatch per step) at [T, B, H]
    under the knobs set, `repeat` times, against the twin: on tensor cores with the GPU's operands
    forced, or `f32` in float32 on the threads' FMAs against the float32 twin; what the GPU gave."""
    from catchat.parity import gru as gru_parity

    case = gru_parity.make_case(T, B, H)
    got = gru_parity.run_gru_gpu(dev, case, 0.02, persistent=(n_wg, n_wg), w_half=not f32, coop=not f32,
                                 stream_f32=f32, repeat=repeat)
    exp, _ = gru_parity.expected_gru(case, 0.02) if f32 else \
        gru_parity.expected_gru(case, 0.02, recurrent="fp16", forced=(got["hprev"], got["dgh"]))
    for k in ("o", "hprev", "save", "hT", "dgi", "dgh", "dh0"):
        tol = (gru_parity.FWD_ATOL, gru_parity.FWD_RTOL) if k in ("o", "hprev", "save", "hT") or not f32 else \
            (gru_parity.BWD_ATOL, gru_parity.BWD_RTOL)
        np.testing.assert_allclose(got[k], exp[k], *tol, err_msg=k)
    assert got["hits"] == repeat * exp["hits"] and got["sync_timeouts"] == 0  # hits add up over the repeats
    return got
