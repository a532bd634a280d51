"""catchat.analysis.landscape: filter normalisation, seeded directions, GPU vs numpy surfaces, the command's files.

Two small checkpoints of one run (H=12, L=2, B=4, T=16): after 2 and after 6 steps.
"""

import csv
import subprocess
import sys

import numpy as np
import pytest

from catchat import config as cfgmod
from catchat.analysis import landscape as land
from catchat.data import corpus as corpus_mod
from catchat.data import vocab
from catchat.errors import UsageError
from catchat.inference.evaluate import evaluate_lanes as evaluate
from catchat.model import ParamLayout
from catchat.run import checkpoint as ck
from catchat.train import Trainer

from support import build_scene_corpus

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N, R = 3, 0.5


def small_config(corpus_dir):
    return cfgmod.loads(f"""
[model]
hidden = 12
layers = 2
[data]
corpus = "{corpus_dir}"
batch_lanes = 4
window = 16
eval_fraction = 0.2
[train]
lr = 0.01
total_steps = 6
seed = 5
[schedule]
warmup_fraction = 0.0
cooldown_fraction = 0.0
[checkpoint]
keep_last = 0
""")


@pytest.fixture(scope="module")
def trained(dev, tmp_path_factory):
    """(cfg, corpus, run dir, [checkpoint after 2 steps, after 6 steps])."""
    corpus_dir = build_scene_corpus(tmp_path_factory.mktemp("scenes"))
    cfg = small_config(corpus_dir)
    run = tmp_path_factory.mktemp("runs") / "small"
    Trainer(cfg, run, dev).run(stop_after_steps=2)
    Trainer(cfg, run, dev, resume="").run()
    ckpts = ck.list_checkpoints(run / "checkpoints")
    assert [p.name for p in ckpts] == ["step-0000002", "step-0000006"]
    return cfg, corpus_mod.open_corpus(corpus_dir), run, ckpts


def _flat(ckpt_path):
    c = ck.load_checkpoint(ckpt_path)
    spec = cfgmod.model_spec(cfgmod.from_dict(c.state["config"]))
    layout = ParamLayout(spec)
    return spec, layout, layout.flatten(c.params, np.float32)


def test_parse_group():
    assert land.parse_group("z").label == "ih:z+hh:z"
    assert land.parse_group("hh:z").label == "hh:z"
    assert land.parse_group("ih:n, hh:r").label == "ih:n+hh:r"
    assert land.parse_group("hh").label == "hh:r+hh:z+hh:n"
    assert len(land.parse_group("all").blocks) == 6
    for bad in ("", "xx", "hh:q", "ih:z,bias"):
        with pytest.raises(UsageError):
            land.parse_group(bad)


def test_filter_normalisation(trained):
    _, _, _, ckpts = trained
    spec, layout, flat = _flat(ckpts[-1])
    H = spec.hidden
    flat = flat.astype(np.float64)
    layout.view(flat, "layers.1.gru.weight_hh")[H + 3] = 0.0  # a dead unit: its direction row stays zero
    group = land.parse_group("z")
    d1, d2 = land.directions(layout, flat, 1, group, seed=7)
    for d in (d1, d2):
        for name, rows in group.rows(spec, 1):
            w = layout.view(flat, name)[rows]
            dr = layout.view(d, name)[rows]
            np.testing.assert_allclose(np.linalg.norm(dr, axis=1), np.linalg.norm(w, axis=1), rtol=1e-12)
            assert np.count_nonzero(dr) == np.count_nonzero(np.linalg.norm(w, axis=1)) * H
        mask = np.zeros(layout.total, bool)
        for name, rows in group.rows(spec, 1):
            o = layout.offsets[name]
            mask[o + rows.start * H:o + rows.stop * H] = True
        assert not d[~mask].any()  # nothing outside the group moves (other gates, layers, biases)
    assert not np.allclose(d1, d2)
    # the unit function on its own: rows scaled to the weights' row norms, zero rows stay zero
    w = np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])
    out = land.filter_normalise(np.array([[1.0, 1.0], [2.0, 5.0], [0.0, -2.0]]), w)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), [5.0, 0.0, 1.0])
    np.testing.assert_allclose(out[2], [0.0, -1.0])


def test_seeds_reproduce_and_differ(trained):
    _, _, _, (early, late) = trained
    _, layout, flat = _flat(late)
    g = land.parse_group("z")
    a1, a2 = land.directions(layout, flat, 0, g, seed=3)
    b1, b2 = land.directions(layout, flat, 0, g, seed=3)
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)
    c1, _ = land.directions(layout, flat, 0, g, seed=4)
    assert not np.allclose(a1, c1)
    # another checkpoint of the same model: the same raw draws, scaled to its own rows
    _, _, flat_e = _flat(early)
    e1, _ = land.directions(layout, flat_e, 0, g, seed=3)
    name, rows = g.rows(layout.spec, 0)[0]
    ra, re_ = layout.view(a1, name)[rows], layout.view(e1, name)[rows]
    cos = np.sum(ra * re_, axis=1) / (np.linalg.norm(ra, axis=1) * np.linalg.norm(re_, axis=1))
    np.testing.assert_allclose(cos, 1.0, rtol=1e-12)


def test_gpu_and_numpy_surfaces_agree_and_reproduce(dev, trained):
    cfg, corpus, _, (_, late) = trained
    spec, layout, flat = _flat(late)
    data = land.heldout_slice(corpus, cfg, tokens=64)
    assert len(data.windows) == 1 and data.n_valid > 30
    alphas = land.grid(N, R)
    kw = dict(layer=1, group=land.parse_group("z"), seed=11, alphas=alphas, radius=R)
    gpu = land.GpuEvaluator(dev, layout, data)
    s_gpu = land.layer_surface(gpu, layout, flat, **kw)
    s_ref = land.layer_surface(land.ReferenceEvaluator(spec, data), layout, flat, **kw)
    assert s_gpu.loss.shape == (N, N) and s_gpu.evaluations == 9 + 8 + 4  # circle at r shares 4 grid points
    np.testing.assert_allclose(s_gpu.loss, s_ref.loss, rtol=1e-4)
    np.testing.assert_allclose(s_gpu.circle_half, s_ref.circle_half, rtol=1e-4)
    np.testing.assert_allclose(s_gpu.circle_full, s_ref.circle_full, rtol=1e-4)
    assert s_gpu.centre == pytest.approx(s_ref.centre, rel=1e-4)
    assert s_gpu.loss[1, 1] == s_gpu.centre  # the grid's centre is the same evaluation
    assert s_gpu.rise_full == pytest.approx(s_ref.rise_full, abs=2e-4)
    assert not np.allclose(s_gpu.loss, s_gpu.centre)  # the perturbation does move the loss
    # the same seed gives the same surface, bit for bit, on the same evaluator
    again = land.layer_surface(gpu, layout, flat, **kw)
    np.testing.assert_array_equal(again.loss, s_gpu.loss)
    other = land.layer_surface(gpu, layout, flat, **{**kw, "seed": 12})
    assert not np.allclose(other.loss, s_gpu.loss)
    # the centre is the plain held-out loss `catchat eval` reports on the same windows
    from catchat.data.lanes import Lanes
    from catchat.vk.program import Program

    prog = Program(dev, layout, cfg.data.window, cfg.data.batch_lanes, training=False)
    prog.set_params(flat)
    assert s_gpu.centre == pytest.approx(evaluate(prog, Lanes.from_config(corpus, cfg, "eval"), 1)["loss"],
                                         rel=1e-6)


def test_heldout_slice_sizes(trained):
    cfg, corpus, _, _ = trained
    from catchat.data.lanes import Lanes

    w0 = Lanes.from_config(corpus, cfg, "eval").window(0, 0)
    half = land.heldout_slice(corpus, cfg, tokens=32)          # less than a window (4 x 16): 2 lanes
    assert (half.T, half.B, len(half.windows)) == (16, 2, 1)
    np.testing.assert_array_equal(half.windows[0][1], w0.targets[:, :2])
    two = land.heldout_slice(corpus, cfg, tokens=65)           # just over one window: two whole windows
    assert (two.B, len(two.windows)) == (4, 2)
    np.testing.assert_array_equal(two.windows[0][0], w0.tokens)


def test_text_slice_layout():
    text = "To be, or not to be: that is the question."
    sl = land.text_slice(text, T=4, B=3, tokens=1000)
    ids = np.concatenate([[1], vocab.encode_ids(text), [2]])
    pairs = []
    for b in range(sl.B):
        for tok, tgt, _ in sl.windows:
            pairs += [(int(a), int(t)) for a, t in zip(tok[:, b], tgt[:, b]) if t]
    assert pairs == list(zip(ids[:-1].tolist(), ids[1:].tolist()))  # every prediction once, in order
    assert sl.n_valid == len(ids) - 1 and sl.B == 3
    assert all(sl.windows[0][2][0] == 1)  # each lane starts from zero state
    short = land.text_slice(text, T=4, B=3, tokens=10)
    assert short.n_valid == 10
    with pytest.raises(UsageError, match="no text"):
        land.text_slice("", T=4, B=3)


def test_flatness_figures_on_a_known_surface():
    """A quadratic bowl plus a slope: the rise sees only the curvature, the tilt only the slope."""
    g, h11, h22, h12 = np.array([0.3, -0.4]), 2.0, 6.0, 1.5

    def f(p):
        a, b = p[..., 0], p[..., 1]
        return 1.0 + g[0] * a + g[1] * b + 0.5 * (h11 * a * a + 2 * h12 * a * b + h22 * b * b)

    r = 0.5
    s = land.Surface(layer=0, alphas=np.zeros(3), betas=np.zeros(3), loss=np.zeros((3, 3)), centre=1.0, radius=r,
                     circle_half=f(land.circle(r / 2)), circle_full=f(land.circle(r)))
    assert s.rise_full == pytest.approx(r * r * (h11 + h22) / 4)
    assert s.rise_full == pytest.approx(4 * s.rise_half)
    assert s.tilt_full == pytest.approx(r * np.linalg.norm(g))
    assert land.tilt(np.full(8, 3.0)) == pytest.approx(0.0, abs=1e-12)


def test_rise_levels():
    lv = land.rise_levels(-0.03, 0.4)
    assert 0.0 in lv and lv == sorted(lv)
    assert lv[0] <= -0.03 and lv[-1] >= 0.4
    assert land.rise_levels(0.0, 1.3)[0] == 0.0


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "catchat.cli", *args], capture_output=True, text=True, timeout=300)


def test_landscape_command_files_and_compare(trained, tmp_path):
    _, _, run, (early, late) = trained
    out = tmp_path / "cmp"
    p = _run_cli("landscape", str(late), "--compare", str(early), "--grid", "3", "--tokens", "64",
                 "--layer", "1", "--seed", "2", "--out", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "layer 1 [ih:z+hh:z]: centre" in p.stdout and "small step 2:" in p.stdout
    for name in ("landscape-layer1.png", "landscape-layer1-3d.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    z = land.load(out / "landscape.npz")
    assert z["loss"].shape == (2, 1, 3, 3) and z["layers"].tolist() == [1]
    assert z["steps"].tolist() == [6, 2] and z["info"]["seed"] == 2 and z["info"]["evaluator"] == "gpu"
    assert z["rise_full"].shape == (2, 1) and z["tilt_full"].shape == (2, 1)
    again = land.plot(tmp_path / "again", land.from_npz(out / "landscape.npz"), surface_3d=False)
    assert [p.name for p in again] == ["landscape-layer1.png"]  # drawn again from the file alone
    with open(out / "landscape.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 9 and {r["global_step"] for r in rows} == {"6", "2"}
    # --reference on the numpy model, default output directory inside the run, same numbers
    p = _run_cli("landscape", str(late), "--grid", "3", "--tokens", "64", "--layer", "1", "--seed", "2",
                 "--reference", "--no-3d")
    assert p.returncode == 0, p.stdout + p.stderr
    ref_dir = run / "landscape" / "step-0000006"
    zr = land.load(ref_dir / "landscape.npz")
    assert zr["info"]["evaluator"] == "numpy" and not (ref_dir / "landscape-layer1-3d.png").exists()
    np.testing.assert_allclose(zr["loss"][0], z["loss"][0], rtol=1e-4)
    p = _run_cli("landscape", str(late), "--layer", "5", "--reference")
    assert p.returncode == 2 and "the model has 2 layers" in p.stderr and "Traceback" not in p.stderr
