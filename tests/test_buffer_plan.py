"""The buffer plan's shared storage (catchat/vk/program/plan.py): the state sequence in one buffer per
layer and dGh over save (the GRU parity cases and the whole-model tests run them; here the sizes
and what the state buffer holds after each pass)."""

import numpy as np

from catchat.model import ModelSpec, ParamLayout
from catchat.vk.kernels import run_ops
from catchat.vk.program import Program, StepHyper, plan


def _bytes(H, L, B, T, **splits) -> dict[str, int]:
    lay = ParamLayout(ModelSpec(hidden=H, layers=L, vocab_size=101))
    g = plan.Geometry(T, B, H, L, 101, lay.total, **splits)
    return {name: spec.nbytes(g) for name, spec in plan.plan() if spec.needed(True)}


def test_the_plan_stores_no_state_twice():
    """v3 with the H200's splits: no hprev or dGh buffer, o one row block longer; 3.03 GiB planned
    (3.78 GiB before the sharing)."""
    got = _bytes(512, 3, 64, 1024, split_w=11, split_head=64, colsum=8)
    assert "hprev" not in got and "dgh" not in got
    assert got["o"] == 3 * 1025 * 64 * 512 * 4
    assert sum(got.values()) < 3.04 * 2**30
    assert sum(_bytes(2048, 3, 32, 1024).values()) < 7.3 * 2**30


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
