"""Run under mpiexec by tests/test_distributed.py: Comm.sum_grads (catchat/exchange.py) on vectors every
rank can also make for the others (seeded by rank), against numpy models of the additions' order.

    CATCHAT_MPI_FAKE_HOSTS=2 mpiexec -n 4 python tests/exchange_ranks.py

Prints "ok" on rank 0 when every check passed; a failed check raises (the rank exits non-zero)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat import distributed  # noqa: E402
from catchat.exchange import host_layout, host_names  # noqa: E402

N_FLOATS = 1001  # no multiple of the ranks: blocks padded at every level


def vectors(size: int) -> list[np.ndarray]:
    """Every rank's gradient: mixed magnitudes, beyond float16's range too (1e6) and below it (1e-9)."""
    out = []
    for r in range(size):
        g = np.random.default_rng(r).standard_normal(N_FLOATS).astype(np.float32)
        g[: N_FLOATS // 3] *= 1e6
        g[N_FLOATS // 3: 2 * N_FLOATS // 3] *= 1e-9
        out.append(g)
    return out


def by_host(gs: list[np.ndarray], hosts: list[str]) -> np.ndarray:
    """(sum of host 0's ranks in rank order) + (host 1's) + ..., in float32."""
    index, _ = host_layout(hosts)
    sums = []
    for h in range(max(index) + 1):
        mine = [g for g, i in zip(gs, index) if i == h]
        total = mine[0].copy()
        for g in mine[1:]:
            total += g
        sums.append(total)
    out = sums[0].copy()
    for s in sums[1:]:
        out += s
    return out


def check(comm, dtype: str, hierarchical: bool, gs: list[np.ndarray]) -> np.ndarray:
    comm.set_exchange(dtype, hierarchical)
    got = comm.sum_grads(gs[comm.rank])
    every = comm.allgather_obj(got, "comparing")
    assert all(np.array_equal(e, every[0], equal_nan=True) for e in every), f"{dtype}: ranks differ"
    for n in (got.size, got.size - 1, got.size - 2):  # into a buffer of its own and over the input:
        # padded blocks, and blocks of 2, 3 and 4 ranks without padding (the flat float32 path)
        out = np.full(n, np.nan, np.float32)
        assert comm.sum_grads(gs[comm.rank][:n], out=out) is out
        over = gs[comm.rank][:n].copy()
        comm.sum_grads(over, out=over)
        # float32: an element's sum does not depend on how the vector is cut into blocks, so the first n
        # of the padded (general) path's sum; float16 scales by block, so the sum of the n values
        whole = got[:n] if dtype == "fp32" else comm.sum_grads(gs[comm.rank][:n])
        assert np.array_equal(out, whole, equal_nan=True) and np.array_equal(over, whole, equal_nan=True), dtype
    return got


def main() -> None:
    comm = distributed.init(force=True)
    gs = vectors(comm.size)
    hosts = host_names(comm.hosts)
    flat = by_host(gs, ["one"] * comm.size)  # ((g0 + g1) + g2) + ...
    stacked = by_host(gs, hosts)
    assert np.array_equal(check(comm, "fp32", False, gs), flat)
    assert np.array_equal(check(comm, "fp32", True, gs), stacked)
    if len(set(hosts)) > 1 and comm.size > 2:  # the two orders do differ: the check above tells them apart
        assert not np.array_equal(flat, stacked)
    exact = np.sum(np.array(gs, np.float64), axis=0)
    for hierarchical in (False, True):
        got = check(comm, "fp16", hierarchical, gs)
        # each value rounded to float16 (2^-11 relative to its block's scale) where it leaves a rank: a
        # share, each level's sum; the blocks mix magnitudes, so the bound is relative to the largest
        err = np.abs(got - exact)
        big = np.abs(exact[: N_FLOATS // 3]).max()
        assert err[: N_FLOATS // 3].max() <= 4 * comm.size * 2.0**-11 * big, err.max()
        assert np.isfinite(got).all()
    poisoned = [g.copy() for g in gs]
    poisoned[-1][5] = np.inf  # a non-finite gradient arrives as such: the optimizer's skip guard sees it
    got = check(comm, "fp16", True, poisoned)
    assert np.isinf(got[5]) and np.isfinite(np.delete(got, 5)).all()
    timing = comm.take_timing()
    assert len(timing.waits) == 2 * 7 + 3 * 10 and timing.exchange_s > 0 and comm.timing.waits == []
    if comm.is_root:
        print("ok", flush=True)
    comm.finish()


if __name__ == "__main__":
    main()
