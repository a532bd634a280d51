"""Embedding forward/backward with row dropout (glsl/embedding.comp) against catchat.model.reference."""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from catchat.errors import UsageError
from catchat.model import reference
from catchat.parity.embedding import _case, hyper_words, parity_checks, row_scale, run_embedding, run_token_sums
from catchat.vk.device import host_view
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.embedding import PARTS_ENV, EmbeddingBackward, EmbeddingForward, token_sum_parts
from catchat.vk.slots import HP_SEED


def test_parity(dev):
    results = parity_checks(dev)
    # the cases counted per kernel: a case list that came out empty or short would pass all() alone
    assert Counter(r.kernel for r in results) == {"embedding_forward": 6, "embedding_backward": 6,
                                                  "embedding_table_gather": 1, "embedding_table_sum": 1,
                                                  "embedding_backward_parts": 5}
    assert all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def test_dropped_rows_and_out_of_range_tokens(dev, rng):
    """Rows whose token is dropped are zero and get no gradient; a token >= V is ignored."""
    T, B, V, H, p, seed = 6, 5, 13, 10, 0.5, 12345
    keep = reference.embedding_keep_mask(seed, V, p)
    assert 0 < keep.sum() < V
    tokens = rng.integers(0, V, size=(T, B)).astype(np.uint32)
    tokens[0, 0] = np.flatnonzero(~keep)[0]
    tokens[0, 1] = V + 3  # out of range
    v = int(np.flatnonzero(keep)[0])
    tokens[1, 0] = v
    E, dx = rng.standard_normal((V, H)).astype(np.float32), rng.standard_normal((T, B, H)).astype(np.float32)
    dE0 = np.zeros((V, H), np.float32)
    x, dE = run_embedding(dev, tokens, E, dx, dE0, seed, p)
    x = x.reshape(T, B, H)
    assert np.all(x[0, 0] == 0) and np.all(x[0, 1] == 0)
    assert np.all(dE[~keep] == 0)
    scale = np.float32(np.sqrt(H)) / np.float32(1 - p)
    assert np.allclose(x[tokens == v], E[v] * scale, rtol=1e-6)


def test_backward_is_bitwise_deterministic(dev, rng):
    """Many repeats of few tokens: two runs give the same bits (and match the reference)."""
    T, B, V, H, p = 40, 16, 5, 70, 0.1
    tokens = rng.integers(0, V, size=(T, B)).astype(np.uint32)
    E, dx = rng.standard_normal((V, H)).astype(np.float32), rng.standard_normal((T, B, H)).astype(np.float32)
    dE0 = rng.standard_normal((V, H)).astype(np.float32)
    runs = [run_embedding(dev, tokens, E, dx, dE0, 77, p)[1] for _ in range(2)]
    assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
    exp = dE0.copy()
    reference.embedding_backward(exp, dx, tokens.astype(np.intp), row_scale(77, V, H, p))
    assert np.allclose(runs[0], exp, rtol=1e-5, atol=2e-6 * np.abs(exp).max())


def test_seed_is_read_per_replay(dev, rng):
    """A sequence recorded once follows the seed uploaded in `hyper` before each replay."""
    T, B, V, H, p = 3, 4, 17, 8, 0.4
    tokens = np.arange(T * B, dtype=np.uint32).reshape(T, B) % V
    E = rng.standard_normal((V, H)).astype(np.float32)
    t_tok, t_E = dev.tensor(tokens, np.uint32), dev.tensor(E)
    t_x, t_hyper = dev.tensor(np.zeros(T * B * H, np.float32)), dev.tensor(hyper_words(1, p), np.uint32)
    fwd = EmbeddingForward(dev, (t_tok, 0), (t_E, 0), (t_x, 0), t_hyper, T * B, V, H)
    seq = dev.sequence()
    seq.record(dev.kp.OpTensorSyncDevice([t_tok, t_E, t_hyper])).record(fwd.op())
    seq.record(dev.kp.OpTensorSyncLocal([t_x]))
    for seed in (1, 2, 3):
        host_view(t_hyper)[HP_SEED] = seed
        seq.eval()
        exp = reference.embedding_forward(E, tokens.astype(np.intp), row_scale(seed, V, H, p))
        assert np.allclose(host_view(t_x).reshape(T, B, H), exp, rtol=1e-6, atol=1e-6)


def test_backward_accumulates_across_micro_batches(dev, rng):
    """Two backward dispatches into the same dE add up (gradients accumulate)."""
    T, B, V, H = 4, 3, 7, 9
    tokens = rng.integers(0, V, size=(T, B)).astype(np.uint32)
    dx = rng.standard_normal((T, B, H)).astype(np.float32)
    t_tok, t_dx = dev.tensor(tokens, np.uint32), dev.tensor(dx)
    t_dE, t_hyper = dev.tensor(np.zeros(V * H, np.float32)), dev.tensor(hyper_words(5, 0.0), np.uint32)
    bwd = EmbeddingBackward(dev, (t_tok, 0), (t_dx, 0), (t_dE, 0), t_hyper, T * B, V, H)
    (dE,) = run_ops(dev, [t_tok, t_dx, t_dE, t_hyper], [bwd.op(), bwd.op()], [t_dE])
    exp = np.zeros((V, H), np.float32)
    for _ in range(2):
        reference.embedding_backward(exp, dx, tokens.astype(np.intp), row_scale(5, V, H, 0.0))
    assert np.allclose(dE.reshape(V, H), exp, rtol=1e-5, atol=2e-6 * np.abs(exp).max())


def _sums_in_parts(dE0, dx, tokens, scale, parts: int) -> np.ndarray:
    """numpy's float32 add.at over each part of ceil(R/P) rows from zero, then dE0 + part 0 + part 1 + ...
    (P = 1: add.at from dE0): the order the kernel sums in."""
    rows = (dx * scale[tokens][..., None]).reshape(-1, dE0.shape[1]).astype(np.float32)
    tok = tokens.ravel().astype(np.intp)
    if parts == 1:
        out = dE0.copy()
        np.add.at(out, tok, rows)
        return out
    step, out = -(-tok.size // parts), dE0.copy()
    for r in range(0, tok.size, step):
        part = np.zeros_like(dE0)
        np.add.at(part, tok[r:r + step], rows[r:r + step])
        out = out + part
    return out


@pytest.mark.parametrize("parts", [1, 3, 7])
def test_token_sums_in_parts_add_in_part_order(dev, rng, parts):
    """2,111 rows (a prime: parts of unequal length, of one or more chunks) of 5 tokens in P parts: the
    sums in the kernel's stated order, bitwise on a CPU device (no FMA contraction there); one dispatch
    for one part, two with a private [P,V,H] workspace for more."""
    T, B, V, H, p = 2111, 1, 5, 70, 0.2
    tokens, _, dx, dE0 = _case(rng, T, B, V, H)
    got = run_token_sums(dev, tokens, dx, dE0, 11, p, parts)
    exp = _sums_in_parts(dE0, dx, tokens, row_scale(11, V, H, p), parts)
    if dev.info.type == "CPU":
        assert np.array_equal(got.view(np.uint32), exp.view(np.uint32))
    assert np.allclose(got, exp, rtol=1e-5, atol=2e-6 * np.abs(exp).max())
    t = dev.tensor(np.zeros(T * B * H, np.float32))
    k = EmbeddingBackward(dev, (t, 0), (t, 0), (t, 0), t, T * B, V, H, parts=parts)
    assert k.parts == parts and len(k.ops()) == (1 if parts == 1 else 2)
    assert (k.second is None) == (parts == 1)
    if parts > 1:
        assert k.work.size() == parts * V * H
        with pytest.raises(ValueError, match="in parts"):
            k.op()


def test_parts_switch_forces_p(dev, monkeypatch):
    """CATCHAT_TOKEN_SUM_PARTS=N forces N parts (no more than the rows, and none empty), 1 the single dispatch;
    the memory plan counts the workspace the same way; anything but a whole number >= 1 is a UsageError."""
    monkeypatch.delenv(PARTS_ENV, raising=False)
    assert token_sum_parts(dev, 65536, 101, 512) == 1 or dev.info.type != "CPU"  # a CPU's, unless forced
    for value, rows, parts in (("4", 1000, 4), ("64", 30, 30), ("4", 10, 4), ("4", 9, 3), ("1", 65536, 1)):
        monkeypatch.setenv(PARTS_ENV, value)
        assert token_sum_parts(dev, rows, 11, 8) == parts
        assert EmbeddingBackward.scratch_words(dev, rows, 11, 8) == (0 if parts == 1 else parts * 11 * 8)
    for bad in ("0", "-2", "two", "1.5"):
        monkeypatch.setenv(PARTS_ENV, bad)
        with pytest.raises(UsageError, match=PARTS_ENV):
            token_sum_parts(dev, 1000, 11, 8)


def test_a_gpu_sums_parts_of_2048_rows(monkeypatch):
    """A GPU's P (no device needed: the rule reads the device's type): v3's 65,536 rows in 32 parts, v5's
    32,768 in 16, one part below 4,096 rows, fewer parts for a large vocabulary (partials <= dX / 4)."""
    monkeypatch.delenv(PARTS_ENV, raising=False)
    gpu = SimpleNamespace(info=SimpleNamespace(type="discrete GPU"))
    assert [token_sum_parts(gpu, R, 101, 512) for R in (65536, 32768, 4095, 6000, 1)] == [32, 16, 1, 2, 1]
    assert token_sum_parts(gpu, 65536, 1000, 64) == 16
    assert EmbeddingBackward.scratch_words(gpu, 65536, 101, 1536) == 32 * 101 * 1536
