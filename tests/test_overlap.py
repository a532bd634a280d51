"""The gradient exchange that overlaps the backward (catchat/vk/program/grad_slices.py, docs/distributed.md
"Overlap"), in one process on lavapipe: the layer groups' ranges, the exact copy into their staging
tensors, a program run group by group giving the same bits as one run whole, and what holds between
N ranks' lanes and one process's (the gradient up to the row sums' rounding order)."""

import numpy as np
import pytest

from catchat.model import ModelSpec, ParamLayout, init_params
from catchat.parity.model import random_window
from catchat.vk.device import host_view
from catchat.vk.program import Program, StepHyper
from catchat.vk.program.grad_slices import GradStages, group_ranges

HP = StepHyper(lr=3e-3, label_smoothing=0.1, dropout_embedding=0.1, dropout_hidden=0.1, weight_decay=0.1,
               clip=0.5, run_seed=7)


def _writer(name: str, L: int, tied: bool) -> int:
    """The backward group that finishes `name`'s gradient (0: the head with the top layer; L - 1: layer
    0's sweep with the embedding and table0; L: layer 0's own weight and bias gradients)."""
    if name.startswith("layers."):
        layer = int(name.split(".")[1])
        return L - 1 - layer if layer > 0 else (L - 1 if name.endswith("weight_ih") else L)
    if name == "head.weight":
        return 0 if L > 1 else L  # with one layer the head's range is part of W_hh0's (the layout's tail)
    return L - 1  # the embedding: its own backward and table0's (and, tied, the head's) in layer 0's first group


@pytest.mark.parametrize("L,tied", [(1, False), (2, True), (3, False)])
def test_group_ranges_hold_what_each_group_finishes(L, tied):
    layout = ParamLayout(ModelSpec(vocab_size=101, hidden=12, layers=L, tie_embeddings=tied))
    ranges = group_ranges(layout)
    assert len(ranges) == L + 1 and ranges[-1][0] == layout.offsets["layers.0.gru.weight_hh"]
    order = ranges[:-2] + [ranges[-1], ranges[-2]]  # by position in the layout, top-down
    assert order[0][1] == layout.total and order[-1][0] == 0
    assert all(hi == lo2 for (lo2, _), (_, hi) in zip(order, order[1:]))  # contiguous, covering
    for name in layout.names:
        lo, hi = ranges[_writer(name, L, tied)]
        assert lo <= layout.offsets[name] and layout.offsets[name] + layout.sizes[name] <= hi, name


def test_the_staging_copy_is_exact(dev):
    """Every bit of each range arrives: signs of zero, infinities, NaN, the largest and the smallest normal floats."""
    layout = ParamLayout(ModelSpec(vocab_size=101, hidden=12, layers=3))
    values = np.random.default_rng(3).standard_normal(layout.total).astype(np.float32)
    values[:6] = [-0.0, np.inf, -np.inf, np.finfo(np.float32).max, np.finfo(np.float32).tiny, -1e-30]
    values[-1] = np.nan
    grads = dev.tensor(values)
    dev.upload([grads])
    stages = GradStages(dev, grads, layout)
    seq = dev.recorded([c.op() for c in stages.copies], (), stages.stages)
    seq.eval()
    for (lo, hi), stage in zip(stages.ranges, stages.stages):
        got = host_view(stage)
        assert got.view(np.uint32)[~np.isnan(got)].tolist() == values[lo:hi].view(np.uint32)[
            ~np.isnan(values[lo:hi])].tolist()
        assert np.isnan(got).tolist() == np.isnan(values[lo:hi]).tolist()


def _program(dev, spec, T, B, *, grad_groups=False, lane_offset=0, lanes_total=None):
    layout = ParamLayout(spec)
    flat = layout.flatten(init_params(spec, 1))
    prog = Program(dev, layout, T, B, grad_groups=grad_groups, lane_offset=lane_offset, lanes_total=lanes_total)
    prog.set_params(flat)
    prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
    prog.set_carry(None)
    return prog


class Doubling:
    """A stand-in for two ranks with the same gradient: each range comes back doubled (exact in
    float32); it notes the ranges it was given."""

    def __init__(self):
        self.sizes = []

    def __call__(self, part, out):
        self.sizes.append(part.size)
        return np.add(part, part, out=out)


def test_a_step_run_group_by_group_gives_the_same_bits(dev):
    """The last micro-batch as per-group sequences, each range exchanged while the next group runs,
    against the same steps run whole and exchanged afterwards: the same parameters, optimizer state,
    carry and stats, bit for bit; with one micro-batch and two, batched and per-timestep (scheduled
    sampling). The reducer sees the groups' ranges in backward order either way."""
    spec, T, B = ModelSpec(vocab_size=101, hidden=12, layers=3), 5, 3
    progs = []
    for groups in (False, True):
        before = dev.allocated_bytes
        progs.append(_program(dev, spec, T, B, grad_groups=groups))
        assert dev.allocated_bytes - before == Program.planned_bytes(ParamLayout(spec), T, B, True, dev, "fp32",
                                                                     groups)  # the staging counted
    assert progs[0].grad_stages is None and progs[1].grad_stages is not None
    reducers = [Doubling(), Doubling()]
    rng = np.random.default_rng(9)
    for step, (micro, tf) in enumerate([(1, 1.0), (2, 1.0), (2, 0.6), (1, 0.6)]):
        batches = [random_window(rng, spec, T, B) for _ in range(micro)]
        stats = [p.train_step(batches, HP, global_step=step, tf=tf, reduce_grads=r) for p, r in zip(progs, reducers)]
        assert stats[0] == stats[1], step
        times = progs[1].exchange.times
        assert 0 < times.gpu_done <= times.done and times.host_s > 0
    ranges = [hi - lo for lo, hi in group_ranges(progs[0].layout)]
    assert reducers[0].sizes == reducers[1].sizes == ranges * 4
    a, b = (p.read("params", "m", "v", "h0") for p in progs)
    assert all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b))


# What N ranks compute against one process (docs/distributed.md "Exactly what holds"): the same global
# batch, draws and divisor, and a gradient that differs only where a sum over rows (lanes x timesteps)
# runs over each rank's rows before the ranks' sums are added. Measured here: 1.7e-7 of the largest
# gradient element (a few float32 ulps); the bound leaves room for other devices' tile choices.
GRAD_RTOL = 1e-5


def test_split_lanes_give_the_one_process_gradient_up_to_row_sum_order(dev):
    """Lanes [0, 2) and [2, 4) of 4 run as two programs (two ranks, in turn), their gradients added in
    rank order, against one program with all 4 lanes on the same parameters and batch (dropout and
    scheduled sampling on: drawn per global lane): the losses add up, the gradients agree within
    GRAD_RTOL of the largest element, and not bit for bit (the row sums' order differs)."""
    spec, T, B = ModelSpec(vocab_size=101, hidden=16, layers=2), 8, 4
    batches = [random_window(np.random.default_rng(4), spec, T, B)]
    grads = {}

    def keep(key):
        def reduce(part, out):
            grads.setdefault(key, []).append(part.copy())
            out[...] = part
            return out
        return reduce

    one = _program(dev, spec, T, B)
    whole = one.train_step(batches, HP, global_step=0, tf=0.8, reduce_grads=keep("one"))
    losses = 0.0
    for lo, hi in ((0, 2), (2, 4)):
        prog = _program(dev, spec, T, hi - lo, lane_offset=lo, lanes_total=B)
        mine = [tuple(np.ascontiguousarray(a[:, lo:hi]) for a in batch) for batch in batches]
        losses += prog.train_step(mine, HP, global_step=0, tf=0.8, n_valid=whole.n_valid,
                                  reduce_grads=keep(lo)).loss
    assert losses == pytest.approx(whole.loss, rel=1e-6)
    g1 = np.concatenate(grads["one"])
    gn = np.concatenate(grads[0]) + np.concatenate(grads[2])  # rank order, float32
    diff = np.abs(gn - g1).max() / np.abs(g1).max()
    assert 0 < diff <= GRAD_RTOL, diff
