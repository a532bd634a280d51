"""The numpy reference model against finite differences, direct formulas and hand examples.

Everything here is CPU-only and fast: it is the oracle the shader parity tests trust.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from catchat.model import ALIGN, ModelSpec, ParamLayout, init_params, param_specs, spectral_u_init
from catchat.model import reference as ref
from catchat.rng import STREAM_HIDDEN, rng_uniform, step_seed

# ---------------------------------------------------------------------------------------------
# A small problem: L=2, H=5, V=11, T=6, B=3, resets mid-window, masked targets
# ---------------------------------------------------------------------------------------------

T, B = 6, 3
P_EMB, P_HID = 0.25, 0.3
SEED = step_seed(7, 3, 2)  # drops embedding rows 2 and 9, 6 + 8 of 15 hidden units


def _problem(tied: bool, dtype=np.float64):
    spec = ModelSpec(vocab_size=11, hidden=5, layers=2, tie_embeddings=tied)
    rng = np.random.default_rng(42)
    params = {k: v.astype(dtype) for k, v in init_params(spec, 3).items()}
    for l in range(spec.layers):  # norm weights away from 1 so their gradient path is exercised
        params[f"layers.{l}.norm.weight"] = (1 + 0.3 * rng.standard_normal(spec.hidden)).astype(dtype)
    tokens = rng.integers(0, spec.vocab_size, (T, B)).astype(np.uint32)  # [T,B]
    targets = rng.integers(1, spec.vocab_size, (T, B)).astype(np.uint32)  # [T,B]
    targets[1, 0] = targets[4, 2] = targets[0, 1] = 0  # masked (pad) targets
    resets = np.zeros((T, B), np.uint32)  # [T,B]
    resets[2, 0] = resets[4, 1] = resets[0, 2] = 1  # conversations start mid-window and at 0
    h0 = rng.uniform(-0.8, 0.8, (spec.layers, B, spec.hidden)).astype(dtype)  # [L,B,H]
    return spec, params, tokens, targets, resets, h0


def _run(spec, params, tokens, targets, resets, h0, need_grads=True, clamp=None,
         smoothing=0.1, p_emb=P_EMB, p_hid=P_HID, seed=SEED, loss_scale=1.0):
    n_valid = int(np.count_nonzero(targets))
    return ref.model_forward_backward(params, spec, tokens, targets, resets, h0, n_valid,
                                      smoothing=smoothing, p_emb=p_emb, p_hid=p_hid, seed=seed,
                                      clamp=clamp, need_grads=need_grads, loss_scale=loss_scale)


# central differences in float64: truncation ~ h^2 and rounding ~ 1e-16 / h are both ~1e-10
FD_STEP = 1e-5
FD_RTOL = 1e-6  # relative error allowed per element ...
FD_ATOL = 1e-9  # ... plus this absolute slack for gradients that are ~0


def _assert_fd(analytic: np.ndarray, target: np.ndarray, loss_fn, what: str):
    """Perturb every element of `target` in place; compare with `analytic`."""
    fd = np.empty_like(target)
    for i in np.ndindex(target.shape):
        keep = target[i]
        target[i] = keep + FD_STEP
        up = loss_fn()
        target[i] = keep - FD_STEP
        down = loss_fn()
        target[i] = keep
        fd[i] = (up - down) / (2 * FD_STEP)
    err = np.abs(fd - analytic)
    bad = err > FD_RTOL * (np.abs(fd) + np.abs(analytic)) + FD_ATOL
    assert not bad.any(), f"{what}: max err {err.max():.3g}, fd {fd[bad][:4]} vs {analytic[bad][:4]}"
    assert np.abs(analytic).max() > 1e-4, f"{what}: gradient vanishes, the check proves nothing"


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_finite_differences_every_parameter_and_h0(tied):
    spec, params, tokens, targets, resets, h0 = _problem(tied)
    assert not ref.embedding_keep_mask(SEED, spec.vocab_size, P_EMB).all()  # dropout is active
    assert not ref.hidden_keep_mask(SEED, 0, B, spec.hidden, P_HID).all()
    res = _run(spec, params, tokens, targets, resets, h0)
    assert set(res.grads) == set(ParamLayout(spec).names)

    def loss():
        return _run(spec, params, tokens, targets, resets, h0, need_grads=False).loss

    for name in ParamLayout(spec).names:
        _assert_fd(res.grads[name], params[name], loss, name)
    _assert_fd(res.dh0, h0, loss, "dh0")
    assert np.all(res.dh0[:, 2] == 0)  # lane 2 resets at t=0: h0 is never read


def test_clamp_binds_and_is_counted():
    spec, params, tokens, targets, resets, h0 = _problem(False)
    free = _run(spec, params, tokens, targets, resets, h0)
    loose = _run(spec, params, tokens, targets, resets, h0, clamp=1e6)
    tight = _run(spec, params, tokens, targets, resets, h0, clamp=1e-4)
    assert free.clamp_hits == 0 and loose.clamp_hits == 0
    assert tight.clamp_hits > 0
    for name in free.grads:
        np.testing.assert_array_equal(loose.grads[name], free.grads[name])
    assert not np.allclose(tight.grads["layers.0.gru.weight_hh"], free.grads["layers.0.gru.weight_hh"])
    assert tight.loss == free.loss  # the clamp touches the backward pass only


def test_gru_clamp_hits_count_elements_above_c():
    # T=2, the only clamped gradient is the one step 1 sends into h_0: count it directly
    rng = np.random.default_rng(0)
    H, Bn = 4, 2
    x = rng.standard_normal((2, Bn, H))
    w_ih, w_hh = rng.standard_normal((3 * H, H)), rng.standard_normal((3 * H, H))
    b_ih, b_hh = rng.standard_normal(3 * H), rng.standard_normal(3 * H)
    o, cache = ref.gru_layer_forward(x, np.zeros((Bn, H)), np.zeros((2, Bn)), w_ih, w_hh, b_ih, b_hh)
    do = np.zeros_like(o)
    do[1] = rng.standard_normal((Bn, H))  # gradient only on the last output
    c = 0.05
    *_, hits = ref.gru_layer_backward(do, None, cache, clamp=c)
    # the unclamped gradient into h_0 from step 1: rerun with T=1 starting at h_0
    _, c1 = ref.gru_layer_forward(x[1:], o[0], np.zeros((1, Bn)), w_ih, w_hh, b_ih, b_hh)
    _, dh_into_h0, *_ = ref.gru_layer_backward(do[1:], None, c1)
    assert hits == np.count_nonzero(np.abs(dh_into_h0) > c) > 0


def test_dtype_follows_params():
    spec, params, tokens, targets, resets, h0 = _problem(False, np.float32)
    res = _run(spec, params, tokens, targets, resets, h0.astype(np.float32))
    assert res.logits.dtype == np.float32 and res.hT.dtype == np.float32
    assert all(g.dtype == np.float32 for g in res.grads.values())
    spec64, p64, *_ = _problem(False)
    r64 = _run(spec64, p64, tokens, targets, resets, h0.astype(np.float64))
    np.testing.assert_allclose(res.logits, r64.logits, rtol=1e-4, atol=1e-5)
    assert abs(res.loss - r64.loss) < 1e-5


def test_reset_cuts_history():
    spec, params, tokens, targets, resets, h0 = _problem(False)
    k, lane = 2, 0  # resets[2, 0] == 1
    base = _run(spec, params, tokens, targets, resets, h0, need_grads=False)
    tok2, h02 = tokens.copy(), h0.copy()
    tok2[:k, lane] = (tok2[:k, lane] + 3) % spec.vocab_size  # different earlier tokens
    h02[:, lane] += 0.5  # different carried state
    other = _run(spec, params, tok2, targets, resets, h02, need_grads=False)
    np.testing.assert_allclose(other.logits[k:, lane], base.logits[k:, lane], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(other.hT[:, lane], base.hT[:, lane], rtol=1e-12, atol=1e-14)
    assert not np.allclose(other.logits[:k, lane], base.logits[:k, lane])  # the change was seen
    np.testing.assert_array_equal(other.logits[:, 1:], base.logits[:, 1:])  # lanes independent


def test_tied_head_gradient_lands_on_embedding():
    # tied == untied with head.weight a copy of E, whose two gradients are summed
    spec, params, tokens, targets, resets, h0 = _problem(True)
    tied = _run(spec, params, tokens, targets, resets, h0)
    untied = ModelSpec(vocab_size=11, hidden=5, layers=2, tie_embeddings=False)
    p2 = dict(params, **{"head.weight": params["embedding.weight"].copy()})
    r2 = _run(untied, p2, tokens, targets, resets, h0)
    np.testing.assert_allclose(tied.grads["embedding.weight"],
                               r2.grads["embedding.weight"] + r2.grads["head.weight"],
                               rtol=1e-12, atol=1e-15)
    assert tied.loss == pytest.approx(r2.loss, rel=1e-14)


# ---------------------------------------------------------------------------------------------
# Cross-entropy
# ---------------------------------------------------------------------------------------------


def _ce_direct(logits, targets, n_valid, e):
    """Scalar loops of PyTorch's formula."""
    V = logits.shape[-1]
    loss, d = 0.0, np.zeros_like(logits)
    for t, b in np.ndindex(targets.shape):
        if targets[t, b] == 0:
            continue
        row = [float(a) for a in logits[t, b]]
        lse = math.log(sum(math.exp(a) for a in row))
        logp = [a - lse for a in row]
        tgt = int(targets[t, b])
        loss += -((1 - e) * logp[tgt] + e / V * sum(logp))
        for v in range(V):
            d[t, b, v] = (math.exp(logp[v]) - (1 - e) * (v == tgt) - e / V) / n_valid
    return loss / n_valid, d


@pytest.mark.parametrize("e", [0.0, 0.1, 0.3])
def test_cross_entropy_matches_direct_formula(e):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((3, 4, 7)) * 3  # [T,B,V]
    targets = rng.integers(1, 7, (3, 4)).astype(np.uint32)
    targets[0, 0] = targets[2, 3] = 0
    n_step = 17  # the whole step has more valid targets than this micro-batch
    loss, d, _, _, nv = ref.cross_entropy_forward_backward(logits, targets, n_step, e)
    want_loss, want_d = _ce_direct(logits, targets, n_step, e)
    assert nv == 10
    assert loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(d, want_d, rtol=1e-10, atol=1e-15)


def test_cross_entropy_plain_and_masked():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((2, 3, 5))
    targets = np.array([[1, 0, 4], [2, 3, 0]], np.uint32)
    loss, d, *_ = ref.cross_entropy_forward_backward(logits, targets, 4, 0.0)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    plain = -sum(logp[t, b, targets[t, b]] for t, b in [(0, 0), (0, 2), (1, 0), (1, 1)]) / 4
    assert loss == pytest.approx(plain, rel=1e-12)
    assert np.all(d[0, 1] == 0) and np.all(d[1, 2] == 0)  # masked: no gradient
    changed = logits.copy()
    changed[0, 1] += 100.0
    changed[1, 2] -= 7.0
    loss2, *_ = ref.cross_entropy_forward_backward(changed, targets, 4, 0.0)
    assert loss2 == loss  # masked positions contribute nothing
    zero = ref.cross_entropy_forward_backward(logits, np.zeros((2, 3), np.uint32), 0, 0.1)
    assert zero[0] == 0.0 and np.all(zero[1] == 0) and zero[4] == 0


def test_top1_top5_hand_example():
    row = np.array([1.0, 3.0, 3.0, 0.0, 2.0, 2.0, 5.0])  # V=7
    # ranks (ties to the lower index): 6->0, 1->1, 2->2, 4->3, 5->4, 0->5, 3->6
    targets = np.array([[6, 2, 5, 3, 0, 1, 4]], np.uint32)  # [T=1, B=7]; target 0 is masked
    logits = np.tile(row, (1, 7, 1))  # [1,7,7]
    _, _, top1, top5, nv = ref.cross_entropy_forward_backward(logits, targets, 6, 0.0)
    assert (top1, top5, nv) == (1, 5, 6)  # top5: 6, 2, 5, 1, 4; not 3
    flat = np.zeros((1, 2, 7))  # all equal: rank = target index
    tg = np.array([[4, 5]], np.uint32)
    _, _, top1, top5, _ = ref.cross_entropy_forward_backward(flat, tg, 2, 0.0)
    assert (top1, top5) == (0, 1)


# ---------------------------------------------------------------------------------------------
# Dropout masks (the RNG itself: tests/test_rng.py)
# ---------------------------------------------------------------------------------------------


def test_dropout_masks():
    for p in (0.1, 0.3, 0.5):
        m = ref.hidden_keep_mask(step_seed(1, 2, 0), 1, 64, 256, p)
        assert m.shape == (64, 256) and m.dtype == bool
        assert abs(m.mean() - (1 - p)) < 0.015  # 16384 draws: 4 sigma
        e = ref.embedding_keep_mask(step_seed(1, 2, 0), 20000, p)
        assert abs(e.mean() - (1 - p)) < 0.015
    s = step_seed(5, 10, 0)
    mask0 = ref.hidden_keep_mask(s, 0, 4, 32, 0.3)
    np.testing.assert_array_equal(mask0, ref.hidden_keep_mask(s, 0, 4, 32, 0.3))  # same seed
    assert not np.array_equal(mask0, ref.hidden_keep_mask(s, 1, 4, 32, 0.3))  # other layer
    s2 = step_seed(5, 10, 1)  # next micro-batch
    emb = ref.embedding_keep_mask(s, 101, 0.3)
    assert not np.array_equal(emb, ref.embedding_keep_mask(s2, 101, 0.3))
    assert ref.embedding_keep_mask(s, 101, 0.0).all()
    # counter = b * H + j: lane b's row is the same hash stream cut at b * H
    u = rng_uniform(s, STREAM_HIDDEN + 2, np.arange(4 * 32, dtype=np.uint64))
    want = (u >= np.float32(0.3)).reshape(4, 32)
    np.testing.assert_array_equal(ref.hidden_keep_mask(s, 2, 4, 32, 0.3), want)


# ---------------------------------------------------------------------------------------------
# Optimizers, norm, clip, spectral projection
# ---------------------------------------------------------------------------------------------

LR, B1, B2, EPS, WD = 1e-2, 0.9, 0.99, 1e-8, 0.1


def _adamw_scalar(p, grads, decay):
    m = v = 0.0
    for t, g in enumerate(grads, start=1):
        if decay:
            p *= 1 - LR * WD
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        denom = math.sqrt(v) / math.sqrt(1 - B2**t) + EPS
        p -= LR / (1 - B1**t) * m / denom
    return p


def _nadam_scalar(p, grads, decay, psi=0.004):
    m = v = 0.0
    mu_prod = 1.0
    for t, g in enumerate(grads, start=1):
        if decay:
            p *= 1 - LR * WD
        mu = B1 * (1 - 0.5 * 0.96 ** (t * psi))
        mu_next = B1 * (1 - 0.5 * 0.96 ** ((t + 1) * psi))
        mu_prod *= mu
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        denom = math.sqrt(v / (1 - B2**t)) + EPS
        p -= LR * (1 - mu) / (1 - mu_prod) * g / denom
        p -= LR * mu_next / (1 - mu_prod * mu_next) * m / denom
    return p


@pytest.mark.parametrize("kind", ["adamw", "nadam"])
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_optimizer_three_steps_vs_scalar_loop(kind, dtype, rtol):
    rng = np.random.default_rng(3)
    p0 = rng.standard_normal(8)
    grads = rng.standard_normal((3, 8))
    decay = np.array([1, 1, 0, 1, 0, 0, 1, 0], np.float32)
    p, m, v = p0.astype(dtype), np.zeros(8, dtype), np.zeros(8, dtype)
    for t in (1, 2, 3):
        g = grads[t - 1].astype(dtype)
        if kind == "adamw":
            ref.adamw_step(p, g, m, v, t, LR, B1, B2, EPS, WD, decay.astype(dtype))
        else:
            ref.nadam_step(p, g, m, v, t, LR, B1, B2, EPS, WD, decay.astype(dtype),
                           *ref.nadam_coefficients(t, B1))
    scalar = _adamw_scalar if kind == "adamw" else _nadam_scalar
    want = [scalar(float(p0[i]), [float(gg) for gg in grads[:, i]], bool(decay[i])) for i in range(8)]
    assert p.dtype == dtype
    np.testing.assert_allclose(p, want, rtol=rtol)
    # the decay mask matters: without it the decayed entries would differ
    nodecay = [scalar(float(p0[i]), [float(gg) for gg in grads[:, i]], False) for i in range(8)]
    assert not np.allclose(np.array(want)[decay == 1], np.array(nodecay)[decay == 1], rtol=1e-9)


def test_nadam_coefficients():
    mu_t, mu_next, mu_prod = ref.nadam_coefficients(3, 0.9)
    mus = [0.9 * (1 - 0.5 * 0.96 ** (i * 0.004)) for i in (1, 2, 3, 4)]
    assert mu_t == pytest.approx(mus[2], rel=1e-15)
    assert mu_next == pytest.approx(mus[3], rel=1e-15)
    assert mu_prod == pytest.approx(mus[0] * mus[1] * mus[2], rel=1e-14)


def test_grad_norm_and_clip_scale():
    g = np.array([3.0, 4.0, 0.0, 12.0], np.float32)
    assert ref.grad_norm(g) == 13.0
    assert ref.clip_scale(13.0, 1.0) == 1.0 / (13.0 + 1e-6)
    assert ref.clip_scale(0.5, 1.0) == 1.0
    assert ref.clip_scale(1e9, None) == 1.0
    assert not math.isfinite(ref.grad_norm(np.array([1.0, np.nan])))


def test_spectral_project():
    H = 4
    W = np.diag([3.0, 1.0, 0.5, 0.25])
    u = np.full(H, 0.5)  # normalised ones
    W2, u2 = ref.spectral_project(W, u, 2.0)
    v = W.T @ u / np.linalg.norm(W.T @ u)
    sigma = np.linalg.norm(W @ v)  # u' . W v with u' = W v / |W v|
    np.testing.assert_allclose(W2, W * (2.0 / sigma), rtol=1e-14)
    np.testing.assert_allclose(u2, W @ v / sigma, rtol=1e-14)
    assert np.linalg.norm(u2) == pytest.approx(1.0)
    W3, _ = ref.spectral_project(W, u, 10.0)  # below the bound: untouched
    np.testing.assert_array_equal(W3, W)
    for _ in range(40):  # repeated projections converge to sigma_max == bound
        W, u = ref.spectral_project(W, u, 2.0)
    assert np.linalg.svd(W, compute_uv=False)[0] == pytest.approx(2.0, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# One training step over micro-batches
# ---------------------------------------------------------------------------------------------


def _step_setup(dtype=np.float64):
    spec = ModelSpec(vocab_size=11, hidden=5, layers=2)
    layout = ParamLayout(spec)
    flat = layout.flatten(init_params(spec, 0)).astype(dtype)
    rng = np.random.default_rng(9)
    tok = rng.integers(0, 11, (T, 4)).astype(np.uint32)
    tg = rng.integers(0, 11, (T, 4)).astype(np.uint32)
    rs = np.zeros((T, 4), np.uint32)
    rs[3, 1] = 1
    h0 = rng.uniform(-0.5, 0.5, (2, 4, 5)).astype(dtype)
    return layout, flat, tok, tg, rs, h0


def test_micro_batches_sum_to_the_full_batch():
    layout, flat, tok, tg, rs, h0 = _step_setup()
    kw = dict(global_step=4, lr=1e-2, optimizer="nadam", wd=0.1, clip=0.5, smoothing=0.1)
    one = flat.copy()
    m1, v1 = np.zeros_like(flat), np.zeros_like(flat)
    r1 = ref.reference_train_step(one, m1, v1, layout, [(tok, tg, rs, h0)], **kw)
    two = flat.copy()
    m2, v2 = np.zeros_like(flat), np.zeros_like(flat)
    halves = [(tok[:, s], tg[:, s], rs[:, s], h0[:, s]) for s in (slice(0, 2), slice(2, 4))]
    r2 = ref.reference_train_step(two, m2, v2, layout, halves, **kw)
    assert r1["loss"] == pytest.approx(r2["loss"], rel=1e-12)
    assert r1["grad_norm"] == pytest.approx(r2["grad_norm"], rel=1e-12)
    assert r1["clipped"] and not r1["skipped"]
    np.testing.assert_allclose(one, two, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(r1["hT"][0][:, 2:], r2["hT"][1], rtol=1e-12)
    pad = np.ones(layout.total, bool)
    for n in layout.names:
        pad[layout.offsets[n] : layout.offsets[n] + layout.sizes[n]] = False
    assert np.all(one[pad] == 0)  # padding stays zero through the optimizer


def test_step_carries_state_between_micro_batches():
    layout, flat, tok, tg, rs, h0 = _step_setup()
    r = ref.reference_train_step(flat.copy(), np.zeros_like(flat), np.zeros_like(flat), layout,
                                 [(tok, tg, rs, h0), (tok, tg, rs, None)], global_step=0, lr=1e-3)
    res = ref.model_forward_backward(layout.unflatten(flat), layout.spec, tok, tg, rs, r["hT"][0],
                                     1, need_grads=False)
    np.testing.assert_allclose(r["hT"][1], res.hT, rtol=1e-12)


def test_step_skips_empty_and_non_finite():
    layout, flat, tok, tg, rs, h0 = _step_setup()
    before = flat.copy()
    m, v = np.zeros_like(flat), np.zeros_like(flat)
    empty = ref.reference_train_step(flat, m, v, layout, [(tok, np.zeros_like(tg), rs, h0)],
                                     global_step=0, lr=1e-2)
    assert empty["skipped"] and empty["loss"] == 0.0
    np.testing.assert_array_equal(flat, before)
    flat[layout.offsets["head.weight"]] = np.nan
    with np.errstate(invalid="ignore"):
        bad = ref.reference_train_step(flat, m, v, layout, [(tok, tg, rs, h0)], global_step=0, lr=1e-2)
    assert bad["skipped"] and not math.isfinite(bad["grad_norm"])
    assert np.all(m == 0) and np.all(v == 0)


def test_step_spectral_projection_after_the_update():
    layout, flat, tok, tg, rs, h0 = _step_setup()
    layout.view(flat, "layers.1.gru.weight_hh")[:] *= 4.0  # make the blocks exceed the bound
    kw = dict(global_step=0, lr=1e-3)
    plain = flat.copy()
    ref.reference_train_step(plain, np.zeros_like(flat), np.zeros_like(flat), layout,
                             [(tok, tg, rs, h0)], **kw)
    u = spectral_u_init(layout.spec, np.float64)
    ref.reference_train_step(flat, np.zeros_like(flat), np.zeros_like(flat), layout,
                             [(tok, tg, rs, h0)], spectral_bound=0.5, spectral_u=u, **kw)
    H = layout.spec.hidden
    for l in range(2):
        for k, which in enumerate(("weight_ih", "weight_hh")):
            for gate in range(3):
                rows = slice(gate * H, (gate + 1) * H)
                want, want_u = ref.spectral_project(layout.view(plain, f"layers.{l}.gru.{which}")[rows],
                                                    np.full(H, 1 / math.sqrt(H)), 0.5)
                np.testing.assert_allclose(layout.view(flat, f"layers.{l}.gru.{which}")[rows], want,
                                           rtol=1e-13)
                np.testing.assert_allclose(u[l, k, gate], want_u, rtol=1e-13)
    scaled = layout.view(flat, "layers.1.gru.weight_hh")
    assert not np.allclose(scaled, layout.view(plain, "layers.1.gru.weight_hh"))  # it did bind


# ---------------------------------------------------------------------------------------------
# Parameter layout and init
# ---------------------------------------------------------------------------------------------


def test_param_specs_order_and_decay():
    names = [s.name for s in param_specs(ModelSpec(layers=2))]
    assert names == ["embedding.weight",
                     "layers.0.gru.weight_ih", "layers.0.gru.weight_hh", "layers.0.gru.bias_ih",
                     "layers.0.gru.bias_hh", "layers.0.norm.weight",
                     "layers.1.gru.weight_ih", "layers.1.gru.weight_hh", "layers.1.gru.bias_ih",
                     "layers.1.gru.bias_hh", "layers.1.norm.weight", "head.weight"]
    decay = {s.name for s in param_specs(ModelSpec(layers=1)) if s.decay}
    assert decay == {"embedding.weight", "layers.0.gru.weight_ih", "layers.0.gru.weight_hh",
                     "head.weight"}


@pytest.mark.parametrize("tied", [False, True])
def test_layout_alignment_roundtrip_and_mask(tied):
    spec = ModelSpec(vocab_size=11, hidden=5, layers=2, tie_embeddings=tied)
    lay = ParamLayout(spec)
    assert ("head.weight" in lay.names) == (not tied)
    assert lay.total % ALIGN == 0
    ends = 0
    for n in lay.names:
        assert lay.offsets[n] % ALIGN == 0 and lay.offsets[n] >= ends
        ends = lay.offsets[n] + lay.sizes[n]
    assert lay.total - ends < ALIGN
    params = init_params(spec, 1)
    flat = lay.flatten(params)
    assert flat.dtype == np.float32 and flat.shape == (lay.total,)
    back = lay.unflatten(flat)
    for n in lay.names:
        np.testing.assert_array_equal(back[n], params[n])
    back["layers.1.norm.weight"][2] = 7.0  # views write through
    assert flat[lay.offsets["layers.1.norm.weight"] + 2] == 7.0
    mask = lay.decay_mask()
    want = sum(s.decay * math.prod(s.shape) for s in param_specs(spec))
    assert mask.dtype == np.float32 and mask.sum() == want
    assert mask[lay.offsets["embedding.weight"] + lay.sizes["embedding.weight"]] == 0  # padding
    with pytest.raises(KeyError):
        lay.flatten({k: v for k, v in params.items() if k != "embedding.weight"})


def test_init_params():
    spec = ModelSpec()
    a, b = init_params(spec, 5), init_params(spec, 5)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["embedding.weight"], init_params(spec, 6)["embedding.weight"])
    k = 1 / math.sqrt(spec.hidden)
    assert all(v.dtype == np.float32 and v.shape == ParamLayout(spec).shapes[n] for n, v in a.items())
    assert np.all(a["layers.0.norm.weight"] == 1)
    assert np.abs(a["layers.1.gru.weight_hh"]).max() <= k and np.abs(a["head.weight"]).max() <= k
    assert a["embedding.weight"].std() == pytest.approx(k, rel=0.05)


def test_nadam_coefficients_cost_does_not_grow_with_the_step():
    """The product of the mu_i stops once 1 - prod is exactly 1.0 in float64: the coefficients the
    optimizer uses equal those of the full product, and a late step does not allocate O(t)."""
    def full(t, b1, psi=0.004):
        mus = b1 * (1.0 - 0.5 * 0.96 ** (np.arange(1, t + 2, dtype=np.float64) * psi))
        return float(mus[t - 1]), float(mus[t]), float(np.prod(mus[:t]))

    checked = 0
    for b1 in (0.9, 0.99, 0.999):
        for t in (1, 2, 3, 100, 4096, 4097, 10_000, 50_000, 200_000):
            mu_t, mu_next, prod = ref.nadam_coefficients(t, b1)
            f_t, f_next, f_prod = full(t, b1)
            assert abs(mu_t - f_t) <= 1e-16 and abs(mu_next - f_next) <= 1e-16
            assert (1 - prod, 1 - prod * mu_next) == (1 - f_prod, 1 - f_prod * f_next), (t, b1)
            checked += 1
    assert checked == 27
    mu_t, _, prod = ref.nadam_coefficients(2**32 - 1, 0.999)  # the full product: three 32 GiB arrays
    assert prod < ref.MU_PROD_FLOOR and abs(mu_t - 0.999) < 1e-12


def test_forced_recurrent_operands_make_fp16_sweeps_comparable():
    """At recurrent "fp16" a float32 ulp in the products' sums flips float16 roundings of h and dGh,
    and the flips grow through the recurrence to ~1e-4: sums that differ only in order (as the
    tensor cores' from numpy's) cannot be compared at float32 tolerances. Forcing the product's
    operands to the other computation's h and dGh (`forced_h`, cache["forced_dgh"]) leaves each
    step's arithmetic to compare; forcing a run's own operands changes nothing."""
    from catchat.model.reference import gru as ref_gru
    from catchat.parity import gru as pg

    case = pg.make_case(6, 16, 64)
    exact, _ = pg.expected_gru(case, recurrent="fp16")
    own, _ = pg.expected_gru(case, recurrent="fp16", forced=(exact["hprev"], exact["dgh"]))
    for k in ("o", "save", "dgi", "dgh", "dh0"):
        np.testing.assert_array_equal(own[k], exact[k])
    # the same sweeps with each product's sums 1 float32 ulp off at random (another summation order)
    rng = np.random.default_rng(3)
    gemm = ref_gru.gemm  # the products of the GRU twin (catchat/model/reference/gru.py)

    def reordered(a, b, precision="fp32"):
        r = gemm(a, b, precision)
        return (r * (1 + rng.choice([-2.0**-23, 0.0, 2.0**-23], r.shape))).astype(r.dtype)

    ref_gru.gemm = reordered
    try:
        other, _ = pg.expected_gru(case, recurrent="fp16")
    finally:
        ref_gru.gemm = gemm
    forced, _ = pg.expected_gru(case, recurrent="fp16", forced=(other["hprev"], other["dgh"]))
    worst = lambda a, b: max(float(np.abs(a[k] - b[k]).max()) for k in ("o", "save", "dgi", "dgh", "dh0"))  # noqa: E731
    assert worst(other, exact) > 5 * pg.BWD_ATOL  # the flips, grown
    assert worst(other, forced) < pg.BWD_ATOL  # each step's arithmetic alike


def test_float16_saves_round_only_what_the_backward_reads():
    """saves "fp16" (the streamed fp16 sweeps' float16 saves): the forward's outputs are the same bits
    (the gates' own arithmetic is not rounded), the saves are float16 values within half an ulp of
    the float32 ones, and the backward on them moves the gradients by about a float16 rounding;
    forcing the other computation's saves (forced's third element) reproduces its backward."""
    from catchat.parity import gru as pg

    case = pg.make_case(6, 5, 48)
    full, _ = pg.expected_gru(case, recurrent="fp16")
    half, _ = pg.expected_gru(case, recurrent="fp16", saves="fp16")
    for k in ("o", "hprev", "hT"):
        np.testing.assert_array_equal(half[k], full[k])
    np.testing.assert_array_equal(half["save"], half["save"].astype(np.float16).astype(half["save"].dtype))
    np.testing.assert_allclose(half["save"], full["save"], rtol=2.0**-11, atol=2.0**-25)
    moved = max(float(np.abs(half[k] - full[k]).max() / np.abs(full[k]).max()) for k in ("dgi", "dgh", "dh0"))
    assert 0 < moved < 2.0**-8
    forced, _ = pg.expected_gru(case, recurrent="fp16", forced=(half["hprev"], half["dgh"], half["save"]))
    for k in ("dgi", "dgh", "dh0"):
        np.testing.assert_allclose(forced[k], half[k], rtol=1e-12, atol=1e-12)


def test_loss_scale_changes_only_the_roundings():
    """loss_scale (a power of two) runs the backward on scaled gradients and unscales at the end, as
    the GPU's fp16 step: without float16 roundings the gradients are the same bit for bit, and the
    clamp, scaled with them, binds on the same elements."""
    spec, params, tokens, targets, resets, h0 = _problem(False)
    for clamp in (None, 1e-4):
        plain = _run(spec, params, tokens, targets, resets, h0, clamp=clamp)
        scaled = _run(spec, params, tokens, targets, resets, h0, clamp=clamp, loss_scale=2.0**16)
        assert scaled.clamp_hits == plain.clamp_hits and scaled.loss == plain.loss
        for name in plain.grads:
            np.testing.assert_array_equal(scaled.grads[name], plain.grads[name])
        np.testing.assert_array_equal(scaled.dh0, plain.dh0)
