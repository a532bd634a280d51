"""Fused cross-entropy and its reduction (glsl/cross_entropy.comp, glsl/loss_reduce.comp)."""

from collections import Counter

import numpy as np

from catchat.model import reference
from catchat.parity.loss import hyper_words, loss_case, parity_checks, run_loss, stats_words
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.loss import FLAG_TOP1, FLAG_TOP5, FLAG_VALID, CrossEntropy, LossReduce
from catchat.vk.slots import ST_LOSS_SUM, ST_N_VALID, ST_TOP1, ST_TOP5, word_f32


def test_parity(dev):
    results = parity_checks(dev)
    # the cases counted per kernel: a case list that came out empty or short would pass all() alone
    assert Counter(r.kernel for r in results) == {"cross_entropy loss_sum": 6, "cross_entropy top1/top5/valid": 6,
                                                  "cross_entropy dlogits": 5, "cross_entropy logits kept": 1}
    assert all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)


def test_per_row_loss_and_flags(dev, rng):
    """Each row's loss and flags equal the reference applied to that row alone."""
    n, V, e = 29, 11, 0.1
    logits, targets = loss_case(rng, n, V, ties=True)
    _, row_loss, flags, _ = run_loss(dev, logits, targets, e, 0.5, stats_words(), "eval")
    for i in range(n):
        loss, _, top1, top5, nv = reference.cross_entropy_forward_backward(
            logits[i:i + 1, None], targets[i:i + 1, None], 1, e)
        assert flags[i] == nv * FLAG_VALID + top1 * FLAG_TOP1 + top5 * FLAG_TOP5, i
        assert abs(row_loss[i] - loss) <= 1e-5 * max(1.0, abs(loss)), i


def test_all_rows_masked(dev, rng):
    """No valid target and 1/N_valid = 0: zero gradient, zero loss, stats unchanged."""
    logits = rng.standard_normal((10, 7)).astype(np.float32)
    stats0 = stats_words(2.5, 1, 2, 3)
    dl, row_loss, flags, stats = run_loss(dev, logits, np.zeros(10, np.uint32), 0.1, 0.0, stats0, "inplace")
    assert np.all(dl == 0) and np.all(row_loss == 0) and np.all(flags == 0)
    assert np.array_equal(stats, stats0)


def test_reduction_is_bitwise_deterministic(dev, rng):
    """Two identical runs over many rows give the same loss-sum bits and dlogits."""
    logits, targets = loss_case(rng, 3001, 11)
    runs = [run_loss(dev, logits, targets, 0.1, 1e-3, stats_words(), "separate") for _ in range(2)]
    assert np.array_equal(runs[0][3], runs[1][3])
    assert np.array_equal(runs[0][0].view(np.uint32), runs[1][0].view(np.uint32))
    loss, _, top1, top5, nv = reference.cross_entropy_forward_backward(
        logits[:, None], targets[:, None], 1000, 0.1)
    s = runs[0][3]
    assert abs(word_f32(s, ST_LOSS_SUM) - loss * 1000) <= 1e-5 * loss * 1000
    assert (s[ST_TOP1], s[ST_TOP5], s[ST_N_VALID]) == (top1, top5, nv)


def test_stats_accumulate_over_micro_batches(dev, rng):
    """Two micro-batches' losses and counts add up in one stats buffer (one sequence)."""
    V, n = 101, 21
    parts = [loss_case(rng, n, V) for _ in range(2)]
    t_stats = dev.tensor(stats_words(), np.uint32)
    t_hyper = dev.tensor(hyper_words(0.0, 0.1), np.uint32)
    tensors, ops = [t_stats, t_hyper], []
    for logits, targets in parts:
        t_l, t_t = dev.tensor(logits), dev.tensor(targets, np.uint32)
        t_loss, t_flags = dev.tensor(np.zeros(n, np.float32)), dev.tensor(np.zeros(n, np.uint32), np.uint32)
        tensors += [t_l, t_t]
        ops += [CrossEntropy(dev, (t_l, 0), (t_t, 0), (t_loss, 0), (t_flags, 0), t_hyper, n, V).op(),
                LossReduce(dev, (t_loss, 0), (t_flags, 0), t_stats, n).op()]
    (stats,) = run_ops(dev, tensors, ops, [t_stats])
    exp_sum, exp_counts = 0.0, np.zeros(3, np.int64)
    for logits, targets in parts:
        loss, _, top1, top5, nv = reference.cross_entropy_forward_backward(
            logits[:, None], targets[:, None], 1, 0.0)
        exp_sum += loss
        exp_counts += (top1, top5, nv)
    assert abs(word_f32(stats, ST_LOSS_SUM) - exp_sum) <= 1e-5 * exp_sum
    assert np.array_equal(stats[[ST_TOP1, ST_TOP5, ST_N_VALID]], exp_counts)
