"""The recorded GPU training step against the numpy reference: one step, 20 steps, skips, determinism."""

import numpy as np
import pytest

from catchat.model import ModelSpec, ParamLayout, init_params
from catchat.model import reference as ref
from catchat.parity import model as model_parity
from catchat.parity.model import random_window
from catchat.vk.program import Program, StepHyper


@pytest.mark.parametrize("case", model_parity.MODEL_CASES, ids=[c[0] for c in model_parity.MODEL_CASES])
def test_one_step_matches_reference(dev, case):
    label, spec, T, B, hp = case
    results = model_parity.model_parity(dev, spec, T, B, hp, label=label)
    bad = [str(r) for r in results if not r.ok]
    assert not bad, "\n".join(bad)
    assert len(results) == len(ParamLayout(spec).names) + 7


def _setup(dev, spec, T, B, hp, seed=0):
    layout = ParamLayout(spec)
    flat = layout.flatten(init_params(spec, seed))
    prog = Program(dev, layout, T, B, optimizer=hp.optimizer)
    prog.set_params(flat)
    prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
    prog.set_carry(None)
    return layout, flat, prog


# 20 steps, two micro-batches per step (the carry flows between them and across steps).
LOOP_STEPS, LOOP_ATOL = 20, 2e-4  # lr 1e-3: 20 Adam steps move a weight by <= 2e-2; float32 drift stays ~1e-5


def test_twenty_steps_match_reference(dev):
    spec, T, B = ModelSpec(vocab_size=101, hidden=16, layers=2), 6, 3
    hp = StepHyper(lr=1e-3, eps=1e-6, weight_decay=0.1, clip=1.0, label_smoothing=0.1, dropout_embedding=0.1,
                   dropout_hidden=0.1, run_seed=11)
    layout, flat, prog = _setup(dev, spec, T, B, hp)
    exp = flat.astype(np.float64).copy()
    m, v = np.zeros_like(exp), np.zeros_like(exp)
    rng = np.random.default_rng(5)
    h = np.zeros((spec.layers, B, spec.hidden))
    for step in range(LOOP_STEPS):
        micro = [random_window(rng, spec, T, B) for _ in range(2)]
        st = prog.train_step(micro, hp, global_step=step)
        r = ref.reference_train_step(exp, m, v, layout, [(*micro[0], h), (*micro[1], None)], global_step=step,
                                     lr=hp.lr, eps=hp.eps, wd=hp.weight_decay, clip=hp.clip,
                                     smoothing=hp.label_smoothing, p_emb=hp.dropout_embedding,
                                     p_hid=hp.dropout_hidden, run_seed=hp.run_seed)
        h = r["hT"][-1]
        assert not st.skipped
        assert st.loss == pytest.approx(r["loss"], rel=1e-4)
        assert st.grad_norm == pytest.approx(r["grad_norm"], rel=1e-3)
    got = prog.get_params()
    assert np.abs(got - exp).max() < LOOP_ATOL
    assert np.abs(got - flat).max() > 5e-3  # it did train
    np.testing.assert_allclose(prog.get_carry(), h, atol=1e-4)


def test_zero_valid_tokens_and_nan_are_skipped(dev):
    spec, T, B = ModelSpec(vocab_size=101, hidden=8, layers=1), 4, 2
    hp = StepHyper(lr=1e-2)
    layout, flat, prog = _setup(dev, spec, T, B, hp)
    tok, tg, rs = random_window(np.random.default_rng(0), spec, T, B)
    st = prog.train_step([(tok, np.zeros_like(tg), rs)], hp, global_step=0)
    assert st.skipped and st.n_valid == 0
    np.testing.assert_array_equal(prog.get_params(), flat)
    poisoned = flat.copy()
    poisoned[layout.offsets["head.weight"]] = np.nan  # a NaN weight makes the gradient NaN
    prog.set_params(poisoned)
    st = prog.train_step([(tok, tg, rs)], hp, global_step=0)
    assert st.skipped and not np.isfinite(st.grad_norm)
    np.testing.assert_array_equal(prog.get_params(), poisoned)
    m, v, _ = prog.get_optimizer_state()
    assert not m.any() and not v.any()


def test_training_is_bitwise_deterministic(dev):
    spec, T, B = ModelSpec(vocab_size=101, hidden=10, layers=2), 5, 3
    hp = StepHyper(lr=3e-3, dropout_hidden=0.2, dropout_embedding=0.1, run_seed=2)
    runs = []
    for _ in range(2):
        _, _, prog = _setup(dev, spec, T, B, hp)
        rng = np.random.default_rng(9)
        losses = [prog.train_step([random_window(rng, spec, T, B)], hp, global_step=s).loss for s in range(3)]
        runs.append((losses, prog.get_params(), prog.get_carry()))
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    np.testing.assert_array_equal(runs[0][2], runs[1][2])
