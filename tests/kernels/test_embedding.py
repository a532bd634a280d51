"""Embedding forward/backward with row dropout (glsl/embedding.comp) against catchat.model.reference."""

from collections import Counter

import numpy as np

from catchat.model import reference
from catchat.parity.embedding import hyper_words, parity_checks, row_scale, run_embedding
from catchat.vk.device import host_view
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.embedding import EmbeddingBackward, EmbeddingForward
from catchat.vk.slots import HP_SEED


def test_parity(dev):
    results = parity_checks(dev)
    # the cases counted per kernel: a case list that came out empty or short would pass all() alone
    assert Counter(r.kernel for r in results) == {"embedding_forward": 6, "embedding_backward": 6,
                                                  "embedding_table_gather": 1, "embedding_table_sum": 1}
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
