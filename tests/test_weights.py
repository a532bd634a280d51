"""catchat.analysis.weights / `catchat inspect`: statistics of a known checkpoint against numpy, the change table,
and no Vulkan import."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.analysis import weights
from catchat.model import init_params, param_specs
from catchat.run import checkpoint as ck

H = 6


def _save(root, step, params, cfg):
    state = dict(config=cfgmod.to_dict(cfg), model=cfgmod.to_dict(cfg)["model"], applied_steps=step)
    return ck.save_checkpoint(root, step, params, {"carry.h0": np.zeros((2, 1, H), np.float32)}, state)


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    """Checkpoint A: init params with a hand-made layers.0.gru.weight_hh of known singular values;
    B: A with embedding.weight scaled by 1.2 and one weight_ih entry changed."""
    cfg = cfgmod.loads(f"[model]\nhidden = {H}\nlayers = 2\n[train]\ntotal_steps = 1\n")
    spec = cfgmod.model_spec(cfg)
    a = init_params(spec, 3)
    w = np.zeros((3 * H, H), np.float32)
    w[:H] = np.diag(np.arange(1, H + 1))  # r block: singular values 1..H
    w[H:2 * H] = 2 * np.eye(H)  # z block: all 2
    # n block zero: sigma 0; the whole matrix: W^T W = diag(k^2 + 4) -> sigma = sqrt(H^2 + 4)
    a["layers.0.gru.weight_hh"] = w
    root = tmp_path_factory.mktemp("ck") / "checkpoints"
    pa = _save(root, 1, a, cfg)
    b = {k: v.copy() for k, v in a.items()}
    b["embedding.weight"] *= np.float32(1.2)
    b["layers.1.gru.weight_ih"][0, 0] += np.float32(0.5)
    pb = _save(root, 2, b, cfg)
    return pa, pb, a, b, spec


def test_stats_match_numpy(known):
    pa, _, a, _, spec = known
    rep = weights.report(pa)
    from safetensors.numpy import load_file

    stored = load_file(str(pa / "model.safetensors"))
    assert [t["name"] for t in rep["tensors"]] == [p.name for p in param_specs(spec)]  # layout order
    for t in rep["tensors"]:
        x = stored[t["name"]].astype(np.float64)
        assert tuple(t["shape"]) == x.shape and t["size"] == x.size
        assert t["norm"] == pytest.approx(np.linalg.norm(x.ravel()), rel=1e-12)
        assert t["mean"] == pytest.approx(x.mean(), rel=1e-12, abs=1e-15)
        assert t["std"] == pytest.approx(x.std(), rel=1e-12, abs=1e-15)
        assert (t["min"], t["max"]) == (x.min(), x.max())
        assert t["absmax"] == np.abs(x).max()
        assert t["rms"] == pytest.approx(np.sqrt(np.mean(x ** 2)), rel=1e-12)
    assert rep["parameters"] == sum(v.size for v in a.values())
    assert rep["total_norm"] == pytest.approx(math.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in a.values())))


def test_spectral_norms(known):
    pa, _, a, _, _ = known
    sig = {s["name"]: s for s in weights.report(pa)["spectral"]}
    assert list(sig) == ["layers.0.gru.weight_ih", "layers.0.gru.weight_hh",
                         "layers.1.gru.weight_ih", "layers.1.gru.weight_hh"]
    s = sig["layers.0.gru.weight_hh"]
    assert s["r"] == pytest.approx(H) and s["z"] == pytest.approx(2.0) and s["n"] == 0.0
    assert s["full"] == pytest.approx(math.sqrt(H * H + 4))
    w = a["layers.1.gru.weight_ih"].astype(np.float64)
    s = sig["layers.1.gru.weight_ih"]
    assert s["full"] == pytest.approx(np.linalg.svd(w, compute_uv=False)[0], rel=1e-10)
    assert s["n"] == pytest.approx(np.linalg.svd(w[2 * H:], compute_uv=False)[0], rel=1e-10)


def test_compare(known):
    pa, pb, a, b, _ = known
    cmp = weights.report(pa, pb)["compare"]
    assert cmp["global_step"] == 2 and cmp["notes"] == []
    ch = {c["name"]: c for c in cmp["changes"]}
    e = ch["embedding.weight"]
    assert e["growth"] == pytest.approx(0.2, rel=1e-6) and e["rel_change"] == pytest.approx(0.2, rel=1e-6)
    assert e["cosine"] == pytest.approx(1.0)
    w = ch["layers.1.gru.weight_ih"]
    na = np.linalg.norm(a["layers.1.gru.weight_ih"].astype(np.float64))
    assert w["rel_change"] == pytest.approx(0.5 / na, rel=1e-6)
    assert ch["layers.0.gru.bias_hh"]["growth"] == 0.0 and ch["layers.0.gru.bias_hh"]["rel_change"] == 0.0
    changes, notes = weights.compare({"x": np.ones(3)}, {"x": np.ones(4), "y": np.zeros(1)})
    assert changes == [] and notes == ["x: shape (3,) in A, (4,) in B", "y: only in B"]


def test_inspect_command_needs_no_vulkan(known):
    pa, pb, *_ = known
    code = ("import sys\nfrom catchat.cli import main\n"
            f"main(['inspect', {str(pa)!r}, '--compare', {str(pb)!r}])\n"
            "assert not any(m.startswith('catchat.vk') or m == 'kp' for m in sys.modules), 'vulkan imported'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "layers.0.gru.weight_hh" in p.stdout and "+20.0%" in p.stdout and "change A -> B" in p.stdout
    p = subprocess.run([sys.executable, "-m", "catchat.cli", "inspect", str(pa), "--json"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["global_step"] == 1
    assert len(rep["tensors"]) == len(rep["spectral"]) + 6 + 2  # + biases and norms, embedding and head
