"""Grad norm, clipping, AdamW / NAdam, the step-skip guard and spectral projection on the device."""

import math

import numpy as np
import pytest

from catchat.model import ModelSpec, ParamLayout, init_params, reference, spectral_u_init
from catchat.parity import optim as optim_parity
from catchat.parity.optim import DEFAULT_GEOMETRY, SMALL_GEOMETRY, StepRig, hyper_buffer
from catchat.vk import slots
from catchat.vk.kernels import optim, run_ops
from catchat.vk.kernels.optim import GradNorm, optimizer_hyper_words

LAYOUT = ParamLayout(ModelSpec(vocab_size=11, hidden=5, layers=2))


def test_parity(dev):
    results = optim_parity.parity_checks(dev)
    assert results and all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def grad_norm_word(dev, g: np.ndarray, geometry) -> int:
    tg, ts = dev.tensor(g), dev.tensor(slots.ST_WORDS, np.uint32)
    (stats,) = run_ops(dev, [tg, ts], GradNorm(dev, tg, ts, g.size, **geometry["norm"])(), [ts])
    return int(stats[slots.ST_GRAD_NORM_SQ])


@pytest.mark.parametrize("n", [1001, 1004], ids=["floats", "vec4"])
@pytest.mark.parametrize("geometry", [DEFAULT_GEOMETRY, SMALL_GEOMETRY], ids=["wg256", "wg8"])
@pytest.mark.parametrize("inject, expect", [
    ({1000: np.nan}, "nan"), ({0: np.inf}, "inf"), ({500: -np.inf}, "inf"),
    ({3: np.inf, 999: np.nan}, "nan"), ({7: 1e20}, "inf"),  # 1e20 squared overflows float32
])
def test_grad_norm_nonfinite_propagates(dev, geometry, inject, expect, n):
    """A NaN anywhere gives NaN, else an Inf gives +Inf: a thread per float, or per vec4 (n % 4 == 0)."""
    g = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    for i, x in inject.items():
        g[i] = x
    got = np.uint32(grad_norm_word(dev, g, geometry)).view(np.float32)
    assert (np.isnan(got) if expect == "nan" else got == np.inf), got


def test_grad_norm_deterministic(dev):
    for n in (20001, 20000):
        g = np.random.default_rng(3).standard_normal(n).astype(np.float32)
        for geo in (DEFAULT_GEOMETRY, SMALL_GEOMETRY):
            assert grad_norm_word(dev, g, geo) == grad_norm_word(dev, g, geo)


def test_hyper_words_match_reference():
    b1, b2, lr = 0.9, 0.98, 3e-3
    for t in (1, 2, 50):
        w = optimizer_hyper_words("nadam", t, lr, b1, b2, 1e-8, 0.1, None)
        mu_t, mu_next, mu_prod = reference.nadam_coefficients(t, b1)
        f = lambda slot, w=w: slots.word_f32(np.array([w[slot]], np.uint32), 0)  # noqa: E731
        assert f(slots.HP_BIAS_CORR1) == np.float32(1 - b1**t)
        assert f(slots.HP_BIAS_CORR2) == np.float32(1 - b2**t)
        assert f(slots.HP_NADAM_COEF_G) == np.float32(lr * (1 - mu_t) / (1 - mu_prod))
        assert f(slots.HP_NADAM_COEF_M) == np.float32(lr * mu_next / (1 - mu_prod * mu_next))
        assert f(slots.HP_CLIP) == 0.0 and w[slots.HP_STEP] == t
    with pytest.raises(ValueError):
        optimizer_hyper_words("sgd", 1, lr, b1, b2, 1e-8, 0.0, 1.0)
    with pytest.raises(ValueError):
        optimizer_hyper_words("adamw", 0, lr, b1, b2, 1e-8, 0.0, 1.0)


def warmed_rig(dev, kind: str, bound: float = 0.0):
    """A rig after one applied step, so m and v are non-zero; returns (rig, hyper words of step 2)."""
    flat, _ = optim_parity.spectral_case(LAYOUT, seed=5)
    rig = StepRig(dev, LAYOUT, kind, flat)
    g = optim_parity.layout_grads(LAYOUT, np.random.default_rng(7), 0.1)
    stats = rig.step(g, hyper_buffer(optimizer_hyper_words(kind, 1, 1e-2, 0.9, 0.99, 1e-8, 0.1, 1.0,
                                                           spectral_bound=bound), n_valid=3))
    assert stats[slots.ST_SKIPPED] == 0
    return rig, optimizer_hyper_words(kind, 2, 1e-2, 0.9, 0.99, 1e-8, 0.1, 1.0, spectral_bound=bound)


@pytest.mark.parametrize("kind", optim.OPTIMIZERS)
@pytest.mark.parametrize("why", ["nan_grad", "inf_grad", "no_valid_targets"])
def test_skipped_step_changes_nothing(dev, kind, why):
    _, bound = optim_parity.spectral_case(LAYOUT, seed=5)
    rig, words = warmed_rig(dev, kind, bound)  # the spectral bound binds: it must not run either
    before = rig.download()
    g = optim_parity.layout_grads(LAYOUT, np.random.default_rng(8), 0.1)
    n_valid = 0 if why == "no_valid_targets" else 5
    if why == "nan_grad":
        g[LAYOUT.total // 2] = np.nan
    if why == "inf_grad":
        g[LAYOUT.offsets["head.weight"]] = -np.inf
    stats = rig.step(g, hyper_buffer(words, n_valid))
    after = rig.download()
    for name in ("params", "m", "v", "u"):
        assert after[name].tobytes() == before[name].tobytes(), name
    assert stats[slots.ST_SKIPPED] == 1
    assert slots.word_f32(stats, slots.ST_CLIP_SCALE) == 1.0


def test_clip_binds_and_reports_scale(dev):
    rig = StepRig(dev, LAYOUT, "adamw", LAYOUT.flatten(init_params(LAYOUT.spec, seed=1)))
    g = optim_parity.layout_grads(LAYOUT, np.random.default_rng(2), 1.0)
    norm = reference.grad_norm(g)
    stats = rig.step(g, hyper_buffer(optimizer_hyper_words("adamw", 1, 1e-3, 0.9, 0.99, 1e-8, 0.0, 0.25),
                                     n_valid=1))
    scale = slots.word_f32(stats, slots.ST_CLIP_SCALE)
    assert stats[slots.ST_SKIPPED] == 0
    assert scale < 1.0 and math.isclose(scale, 0.25 / (norm + 1e-6), rel_tol=2e-6)
    assert math.isclose(slots.word_f32(stats, slots.ST_GRAD_NORM_SQ), norm**2, rel_tol=2e-6)


def test_spectral_binds_some_blocks_only(dev):
    flat, bound = optim_parity.spectral_case(LAYOUT, seed=5)
    rig = StepRig(dev, LAYOUT, "adamw", flat)
    words = optimizer_hyper_words("adamw", 1, 0.0, 0.9, 0.99, 1e-8, 0.0, 0.0, spectral_bound=bound)
    rig.step(np.zeros(LAYOUT.total, np.float32), hyper_buffer(words, n_valid=1))
    got, H, changed = rig.download()["params"], LAYOUT.spec.hidden, []
    for l in range(LAYOUT.spec.layers):
        for which in ("weight_ih", "weight_hh"):
            a, b = LAYOUT.view(got, f"layers.{l}.gru.{which}"), LAYOUT.view(flat, f"layers.{l}.gru.{which}")
            changed += [not np.array_equal(a[k * H:(k + 1) * H], b[k * H:(k + 1) * H]) for k in range(3)]
    assert 0 < sum(changed) < len(changed), changed
    rest = np.ones(LAYOUT.total, bool)  # everything outside the GRU weight matrices is untouched
    for l in range(LAYOUT.spec.layers):
        for which in ("weight_ih", "weight_hh"):
            o = LAYOUT.offsets[f"layers.{l}.gru.{which}"]
            rest[o:o + LAYOUT.sizes[f"layers.{l}.gru.{which}"]] = False
    assert np.array_equal(got[rest], flat[rest])


def test_spectral_off_when_bound_is_zero(dev):
    flat, _ = optim_parity.spectral_case(LAYOUT, seed=5)
    rig = StepRig(dev, LAYOUT, "adamw", flat)
    words = optimizer_hyper_words("adamw", 1, 0.0, 0.9, 0.99, 1e-8, 0.0, 0.0, spectral_bound=0.0)
    rig.step(np.zeros(LAYOUT.total, np.float32), hyper_buffer(words, n_valid=1))
    got = rig.download()
    assert got["params"].tobytes() == flat.tobytes()
    assert got["u"].tobytes() == spectral_u_init(LAYOUT.spec).tobytes()


@pytest.mark.parametrize("kind", optim.OPTIMIZERS)
def test_step_chain_deterministic(dev, kind):
    layout = ParamLayout(ModelSpec(vocab_size=11, hidden=33, layers=2))
    flat, bound = optim_parity.spectral_case(layout, seed=2)
    runs = []
    for _ in range(2):
        rig = StepRig(dev, layout, kind, flat)
        rng = np.random.default_rng(9)
        for t in (1, 2):
            words = optimizer_hyper_words(kind, t, 1e-2, 0.9, 0.99, 1e-8, 0.1, 1.0, spectral_bound=bound)
            stats = rig.step(optim_parity.layout_grads(layout, rng, 0.5), hyper_buffer(words, n_valid=4))
        runs.append({**rig.download(), "stats": stats})
    for name, arr in runs[0].items():
        assert arr.tobytes() == runs[1][name].tobytes(), name


@pytest.mark.parametrize("spec", [ModelSpec(hidden=37, layers=3), ModelSpec(hidden=64, layers=2, tie_embeddings=True),
                                  ModelSpec(hidden=512, layers=3)])
def test_decay_runs_are_exactly_the_decayed_tensors(spec):
    """The optimizer's decay buffer (a few [begin, end) runs, not a float per parameter) marks exactly
    the elements of the tensors param_specs decays: no padding, no bias or norm, at most 2L + 2 runs."""
    from catchat.model import param_specs
    from catchat.vk.kernels.optim import decay_word_count, decay_words

    layout = ParamLayout(spec)
    want = np.zeros(layout.total, np.float32)
    for s in param_specs(spec):
        if s.decay:
            want[layout.offsets[s.name]:layout.offsets[s.name] + layout.sizes[s.name]] = 1
    runs = layout.decay_runs()
    assert np.array_equal(layout.decay_mask(), want) and len(runs) <= 2 * spec.layers + 2
    words = decay_words(layout)
    assert words.size == decay_word_count(spec.layers) and words[0] == len(runs)
    assert [tuple(w) for w in words[1:1 + 2 * len(runs)].reshape(-1, 2)] == runs and not words[1 + 2 * len(runs):].any()
