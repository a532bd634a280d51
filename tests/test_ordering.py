"""Dependent dispatches in one recorded sequence must be ordered (tools/kp-patches/0002).

kp 0.9.0 records only a transfer -> shader barrier before a dispatch; catchat's patch records a
compute+transfer -> compute barrier. Lavapipe serialises dispatches, so on it this test checks
the patch is present and the chain is right; on a real GPU (`catchat parity` runs it too) a
missing barrier shows as a wrong sum.
"""

from catchat.parity import axpby, ordering


def test_kp_is_patched(dev):
    assert getattr(dev.kp, "catchat_dispatch_barrier", 0) == 1, "run `make setup` to build the patched kp"


def test_axpby_parity_odd_sizes(dev):
    """Six sizes (three a thread per element, three VEC4), zeroing, the hyper word's a at an odd and a
    VEC4 size, and four float16 rows."""
    results = axpby.parity_checks(dev)
    assert len(results) == (13 if dev.runs_float16 else 9), "\n".join(map(str, results))
    assert all(r.ok for r in results), "\n".join(map(str, results))


def test_chained_dispatches_are_ordered(dev):
    result = ordering.ordering_check(dev, n_elements=4099, n_dispatches=2000)
    assert result.ok, str(result)


def test_a_dispatch_beside_the_one_before(dev):
    """kp patch 0007: `Device.beside(op)` records an independent dispatch without the barrier before it;
    the next ordered dispatch still waits for both (x -> 2x and y -> 3y side by side, then y += x)."""
    import dataclasses

    import numpy as np

    from catchat.vk.kernels import Axpby, run_ops

    assert dev.dispatches_concurrent, "run `make setup` to build the patched kp"
    x, y = dev.tensor(np.arange(5, dtype=np.float32)), dev.tensor(np.ones(5, dtype=np.float32))
    double, triple, add = Axpby(dev, x, x, 5), Axpby(dev, y, y, 5), Axpby(dev, x, y, 5)
    op = dev.beside(triple(0.0, 3.0))
    assert op.barrier is False
    (got,) = run_ops(dev, [x, y], [double(0.0, 2.0), op, add(1.0, 1.0)], [y])
    np.testing.assert_array_equal(got, 3.0 + 2.0 * np.arange(5))
    unpatched = dataclasses.replace(dev, kp=object())  # a kp without the marker: the op stays ordered
    assert not unpatched.dispatches_concurrent and unpatched.beside(double(0.0, 2.0)).barrier is True
