"""`catchat parity`: every kernel and the whole model against the numpy reference, on one device.

The same checks are the test suite's parity tests; here they run on the user's own GPU in
seconds and print a table (kernel, shape, max abs error, max rel error, pass/fail).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator

from catchat.vk.kernels import ParityResult, ordering_check

# Kernel families in the order a training step runs them; each module has parity_checks(dev).
FAMILIES = (
    "catchat.vk.kernels",
    "catchat.vk.kernels.dropout",
    "catchat.vk.kernels.embedding",
    "catchat.vk.kernels.gemm",
    "catchat.vk.kernels.gru",
    "catchat.vk.kernels.norm",
    "catchat.vk.kernels.loss",
    "catchat.vk.kernels.optim",
    "catchat.vk.kernels.sampling",
)


def check_groups(dev) -> Iterator[tuple[str, Callable[[], list[ParityResult]]]]:
    """(group name, thunk) for every parity group: kernel families, ordering, the whole model."""
    for name in FAMILIES:
        module = importlib.import_module(name)
        group = "axpby" if name == "catchat.vk.kernels" else name.rsplit(".", 1)[-1]
        yield group, (lambda m=module: m.parity_checks(dev))
    yield "ordering", lambda: [ordering_check(dev)]
    from catchat.vk import program

    yield "model", lambda: program.parity_checks(dev)


def run_all(dev, on_result: Callable[[str, ParityResult], None] | None = None) -> list[tuple[str, ParityResult]]:
    """Run every group; returns (group, result) pairs in order."""
    out = []
    for group, thunk in check_groups(dev):
        for r in thunk():
            out.append((group, r))
            if on_result:
                on_result(group, r)
    return out


def timed_run(dev):
    """Run all checks and return (results, seconds)."""
    start = time.perf_counter()
    results = run_all(dev)
    return results, time.perf_counter() - start


def summarise(results: list[tuple[str, ParityResult]]) -> list[dict]:
    """Per group, in order: number of checks, failures, and the worst absolute and relative errors."""
    groups: dict[str, dict] = {}
    for group, r in results:
        g = groups.setdefault(group, dict(group=group, checks=0, failed=0, max_abs=0.0, max_rel=0.0))
        g["checks"] += 1
        g["failed"] += not r.ok
        g["max_abs"] = max(g["max_abs"], r.max_abs)
        g["max_rel"] = max(g["max_rel"], r.max_rel)
    return list(groups.values())
