"""Dependent dispatches in one recorded sequence must be ordered (tools/kp-patches/0002).

kp 0.9.0 records only a transfer -> shader barrier before a dispatch; catchat's patch records a
compute+transfer -> compute barrier. Lavapipe serialises dispatches, so on it this test checks
the patch is present and the chain is right; on a real GPU (`catchat parity` runs it too) a
missing barrier shows as a wrong sum.
"""

import numpy as np

from catchat.vk.device import host_view
from catchat.vk import kernels
from catchat.vk.kernels import Axpby


def test_kp_is_patched(dev):
    assert getattr(dev.kp, "catchat_dispatch_barrier", 0) == 1, "run `make setup` to build the patched kp"


def test_axpby_parity_odd_sizes(dev):
    results = kernels.parity_checks(dev)
    assert len(results) == 5 and all(r.ok for r in results), "\n".join(map(str, results))


def chained_dispatch_sum(dev, n_elements: int, n_dispatches: int) -> np.ndarray:
    """Ping-pong `dst = src + 1` between two buffers n_dispatches times, all in one sequence."""
    a, b = dev.tensor(np.zeros(n_elements, np.float32)), dev.tensor(np.zeros(n_elements, np.float32))
    a_to_b, b_to_a = Axpby(dev, a, b, n_elements), Axpby(dev, b, a, n_elements)
    seq = dev.sequence().record(dev.kp.OpTensorSyncDevice([a, b]))
    for i in range(n_dispatches):
        seq.record((a_to_b if i % 2 == 0 else b_to_a)(1.0, 0.0, 1.0))
    last = b if n_dispatches % 2 else a
    seq.record(dev.kp.OpTensorSyncLocal([last])).eval()
    return host_view(last).copy()


def test_chained_dispatches_are_ordered(dev):
    out = chained_dispatch_sum(dev, n_elements=4099, n_dispatches=2000)
    assert np.all(out == 2000.0), f"{np.count_nonzero(out != 2000.0)} elements lost an update"
