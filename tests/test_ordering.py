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
    results = axpby.parity_checks(dev)
    assert len(results) == (11 if dev.runs_float16 else 7), "\n".join(map(str, results))  # 4 float16 rows
    assert all(r.ok for r in results), "\n".join(map(str, results))


def test_chained_dispatches_are_ordered(dev):
    result = ordering.ordering_check(dev, n_elements=4099, n_dispatches=2000)
    assert result.ok, str(result)
