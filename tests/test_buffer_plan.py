"""The buffer plan's shared storage (catchat/vk/program/plan.py): the state sequence in one buffer per
layer, dGh over save, and the split-K partials in buffers that are dead while the weight gradients
run. The sizes are the plan's; the sharing is checked by running the whole model against the
reference with split-K forced on (a CPU device never splits, so nothing else runs those paths here)."""

import numpy as np
import pytest

from catchat.model import ModelSpec, ParamLayout
from catchat.parity import model as model_parity
from catchat.vk.kernels import run_ops
from catchat.vk.kernels.embedding import PARTS_ENV
from catchat.vk.program import Program, StepHyper, plan

MiB = 2**20


def _bytes(H, L, B, T, **splits) -> dict[str, int]:
    lay = ParamLayout(ModelSpec(hidden=H, layers=L, vocab_size=101))
    g = plan.Geometry(T, B, H, L, 101, lay.total, **splits)
    return {name: spec.nbytes(g) for name, spec in plan.plan() if spec.needed(True, g)}


def test_the_plan_stores_no_state_twice():
    """v3 with the H200's splits: no hprev or dGh buffer, o one row block longer, no split-K workspace
    of its own; 3.00 GiB planned (3.78 GiB before the sharing)."""
    got = _bytes(512, 3, 64, 1024, split_w=11, split_head=64, colsum=8)
    assert "hprev" not in got and "dgh" not in got
    assert got["o"] == 3 * 1025 * 64 * 512 * 4 and got["ws"] == 4
    assert sum(got.values()) < 3.01 * 2**30
    v5 = _bytes(2048, 3, 32, 1024)  # splits of 1: no workspace at all
    assert got["ws"] == v5["ws"] == 4 and sum(v5.values()) < 7.3 * 2**30


def _force_splits(monkeypatch, split_k: int, colsum: int):
    monkeypatch.setattr(plan, "gemm_split_k", lambda dev, M, N, K: split_k)
    monkeypatch.setattr(plan, "colsum_splits", lambda dev, M, N: colsum)


HP = StepHyper(lr=3e-3, label_smoothing=0.1, dropout_embedding=0.1, dropout_hidden=0.2, weight_decay=0.1, clip=0.5,
               run_seed=3)


@pytest.mark.parametrize("T, B, borrowed", [(16, 5, True), (7, 3, False)])
def test_split_k_partials_in_borrowed_buffers_match_the_reference(dev, monkeypatch, T, B, borrowed):
    """split-K 2 at H=8 (T*B = 80 rows: the layers' partials fit x[L], the head's gi) and at T*B = 21 (they
    fit neither: `ws` holds them); one training step against the reference either way."""
    _force_splits(monkeypatch, 2, 2)
    monkeypatch.setenv(plan.OVERLAP_ENV, "0")  # dW_hh beside the sweep below keeps its partials in ws (its own test)
    spec = ModelSpec(vocab_size=101, hidden=8, layers=2)
    g = plan.Geometry.of(ParamLayout(spec), T, B, dev)
    assert (g.split_w, g.split_head) == (2, 2) and g.split_in_x == g.split_in_gi == borrowed
    prog = Program(dev, ParamLayout(spec), T, B)
    b, k = prog.buffers, prog.bwd
    assert k.head_dw.work is (b.gi if borrowed else b.ws)
    assert all(lay.dw_hh.work is (b.x[-1] if borrowed else b.ws) for lay in k.layers)
    assert b.ws.size() == (1 if borrowed else max(2 * 24 * 8, 2 * 101 * 8))
    results = model_parity.model_parity(dev, spec, T, B, HP, label="split-K")
    bad = [str(r) for r in results if not r.ok]
    assert not bad, "\n".join(bad)


def test_forward_of_few_rows_splits_its_gemms_over_k(dev, monkeypatch):
    """A forward of a few rows (generation's batched step: T = 1) splits its input projections and head
    over K = H into `ws` (a GPU's choice, `short_split_k`, forced here): the logits equal the unsplit
    program's up to the sums' order, in a forward-only program and in a training step against the
    reference; the per-timestep path's row blocks stay unsplit."""
    spec, B = ModelSpec(vocab_size=101, hidden=12, layers=2), 4
    layout = ParamLayout(spec)
    flat, tokens, targets, resets, _ = model_parity.model_inputs(spec, 1, B, seed=2)

    def logits() -> tuple:
        prog = Program(dev, layout, 1, B, training=False)
        prog.set_params(flat)
        prog.set_carry(None)
        return prog, prog.forward_logits(tokens, resets)

    plain, want = logits()
    assert plain.geometry.split_proj == plain.geometry.split_logits == 1
    monkeypatch.setattr(plan, "short_split_k", lambda dev, M, N, K: 3)
    split, got = logits()
    g, b = split.geometry, split.buffers
    assert (g.split_proj, g.split_logits) == (3, 3) and split.fwd.rows.head.split_k == 3
    assert split.fwd.rows.head.work is b.ws and split.fwd.rows.proj[1].work is b.ws
    assert b.ws.size() == 3 * B * max(3 * spec.hidden, spec.vocab_size)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    results = model_parity.model_parity(dev, spec, 3, B, HP, label="forward split-K")
    assert all(r.ok for r in results), "\n".join(str(r) for r in results if not r.ok)
    train = Program(dev, layout, 3, B)
    train._stepwise_sequences()  # recorded on first use
    assert train.fwd.rows.head.split_k == 3 and train.stepwise.rows.head.split_k == 1


def test_token_sums_in_parts_are_planned_and_match_the_reference(dev, monkeypatch):
    """The embedding's and table0's token sums forced into 3 parts (a GPU's choice, `token_sum_parts`):
    their private partials [3,V,H] and [3,V,3H] are in the planned bytes, and a training step matches
    the reference."""
    monkeypatch.setenv(PARTS_ENV, "3")
    spec, T, B = ModelSpec(vocab_size=101, hidden=8, layers=2), 7, 3
    before = dev.allocated_bytes
    prog = Program(dev, ParamLayout(spec), T, B)
    assert dev.allocated_bytes - before == Program.planned_bytes(ParamLayout(spec), T, B, True, dev)
    assert prog.bwd.embedding.work.size() == 3 * 101 * 8 and prog.bwd.table0.sum.work.size() == 3 * 101 * 24
    results = model_parity.model_parity(dev, spec, T, B, HP, label="token sums in parts")
    bad = [str(r) for r in results if not r.ok]
    assert not bad, "\n".join(bad)


def test_backward_leaves_hprev_in_the_state_buffer(dev):
    """o[l] holds the state sequence: after a forward pass row 0 is the carried state (reset) and
    row t+1 the output of step t; after a training step rows [0, T) are the states entering each
    step, 0 where a reset cut (the backward sweep zeroed those rows), the outputs untouched."""
    spec, T, B, H = ModelSpec(vocab_size=101, hidden=8, layers=2), 6, 3, 8
    layout = ParamLayout(spec)
    rng = np.random.default_rng(1)
    prog = Program(dev, layout, T, B)
    prog.set_params(rng.uniform(-0.3, 0.3, layout.total).astype(np.float32))
    prog.set_optimizer_state(np.zeros(layout.total, np.float32), np.zeros(layout.total, np.float32))
    h0 = rng.standard_normal((2, B, H)).astype(np.float32)
    tokens = rng.integers(5, 101, (T, B)).astype(np.uint32)
    resets = np.zeros((T, B), np.uint32)
    resets[0, 1] = resets[3, 2] = 1
    keep = (1 - resets)[:, :, None]

    def states():
        return [s.reshape(T + 1, B, H) for s in run_ops(dev, [], [], prog.buffers.o)]

    prog.set_carry(h0)
    prog.forward_logits(tokens, resets)
    forward = states()
    prog.set_carry(h0)
    prog.train_step([(tokens, tokens, resets)], StepHyper(lr=0.0), global_step=0)
    after = states()
    for l in range(2):
        np.testing.assert_array_equal(forward[l][0], h0[l] * keep[0])
        np.testing.assert_array_equal(after[l][1:T], forward[l][1:T] * keep[1:])  # hprev[t] = o[t-1], reset
        np.testing.assert_array_equal(after[l][0], forward[l][0])
        np.testing.assert_array_equal(after[l][T], forward[l][T])  # the last output: nobody's hprev
