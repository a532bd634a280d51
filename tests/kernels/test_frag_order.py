"""glsl/frag_order.comp (`FragOrder`): a blocked float16 copy rewritten in its fragments' own order. On emulated
fragments (lavapipe) that order is the operand row-major: a row-major load's block as it was, a column-major
load's transposed; on real ones each block keeps its own halves. Whether the sweeps and the decode step read
the driver's order as it was written is their parity's (test_gru.py's stream16f rows, test_decode.py's rows in
the other order)."""

import numpy as np
import pytest

from catchat.vk.kernels import FragOrder, half_tensor, run_ops, unpack_half
from catchat.vk.kernels.gemm_tiles import coopmat_runs


@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("in_place", [False, True])
def test_blocks_in_fragment_order_and_nothing_else_touched(dev, col, in_place):
    n = 5  # blocks, over a workgroup's 8 subgroups: some walk none
    rng = np.random.default_rng(3)
    x = rng.standard_normal(256 + 2 * n * 256 + 256).astype(np.float16)
    src, dst = 256, 256 if in_place else 256 + n * 256
    t = half_tensor(dev, x.astype(np.float32))
    (got,) = run_ops(dev, [t], FragOrder(dev, t, n, src, dst, col).ops(), [t])
    got = unpack_half(got, x.size)
    blocks = x[src:src + n * 256].reshape(n, 16, 16)
    if coopmat_runs(dev):  # the driver's order: each block's own halves, placed as it holds them
        np.testing.assert_array_equal(np.sort(got[dst:dst + n * 256].reshape(n, 256)), np.sort(blocks.reshape(n, 256)))
    else:
        np.testing.assert_array_equal(got[dst:dst + n * 256], (blocks.transpose(0, 2, 1) if col else blocks).ravel())
    rest = np.ones(x.size, bool)
    rest[dst:dst + n * 256] = False
    if not in_place:
        rest[src:src + n * 256] = True  # the source is read, not written
    np.testing.assert_array_equal(got[rest], x[rest])


def test_refuses_what_it_cannot_rewrite(dev):
    t = half_tensor(dev, np.zeros(4096, np.float32))
    with pytest.raises(ValueError, match="multiples of 256"):
        FragOrder(dev, t, 2, 8, 8, col=True)
    with pytest.raises(ValueError, match="overlap"):
        FragOrder(dev, t, 4, 0, 512, col=True)
    with pytest.raises(ValueError, match="needs"):
        FragOrder(dev, t, 17, 0, 0, col=False)  # 4,352 halves of 4,096


def test_only_the_streamed_tensor_core_forward_reads_w_hh_in_fragment_order(dev):
    """w_frag is the streamed tensor-core forward's (a float16 copy in blocks; not the split product): a sweep
    that would read the copy some other way is refused before it runs."""
    from catchat.parity import gru as gru_parity
    from catchat.vk.kernels import gru

    case = gru_parity.make_case(2, 3, 16)
    t = dev.tensor
    w16 = half_tensor(dev, np.zeros(3 * 16 * 16 + 256))
    args = (t(2 * 3 * 48), t(case["flat"]), t(2 * 3 * 16), t(np.zeros(6), np.uint32), t(3 * 3 * 16), t(3 * 3 * 16),
            t(2 * 3 * 64), t(2 * 3 * 16))
    for kw in ({"coop": False, "w_half": w16}, {"coop": True, "w_half": None}):
        with pytest.raises(ValueError, match="w_frag is the streamed tensor-core sweep's"):
            gru.GruForward(dev, *args, T=2, B=3, H=16, w_off=256, b_off=0, hprev_off=0, o_off=3 * 16, w_frag=True,
                           **kw)
