"""`catchat parity`: every kernel and the whole model against the numpy reference, on one device.

One module per kernel family, named as its kernel module in catchat/vk/kernels/ (`axpby`: the
kernel in catchat/vk/kernels/__init__.py), plus `ordering` (the 2,000-dispatch dependent chain)
and `model` (a whole training step and the per-timestep path). Each has `parity_checks(dev) ->
list[ParityResult]`: its kernels against their numpy twins (catchat.model.reference) at small, odd
sizes. The test suite asserts them, and `catchat parity` runs them on the user's own GPU in
seconds and prints a table (kernel, shape, max abs error, max rel error, pass/fail).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from catchat.vk import slots

# Kernel families in the order a training step runs them (then generation's decode step), the ordering
# chain and the model.
GROUPS = ("axpby", "dropout", "embedding", "gemm", "gru", "norm", "loss", "optim", "sampling", "decode", "ordering",
          "model")


@dataclass
class ParityResult:
    """One kernel-vs-numpy comparison: passes when every element is within atol + rtol * |expected|."""

    kernel: str
    shape: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    ok: bool
    scale: float = 0.0  # the largest |expected|: what a difference is small against

    def scaled_error(self) -> float:
        """The largest difference as a fraction of the largest |expected| (inf where either is not finite)."""
        if not (np.isfinite(self.max_abs) and np.isfinite(self.scale)):
            return float("inf")
        return self.max_abs / self.scale if self.scale > 0 else self.max_abs

    def __str__(self) -> str:
        return (f"{self.kernel} [{self.shape}] max_abs={self.max_abs:.2e} max_rel={self.max_rel:.2e} "
                f"(atol={self.atol:g}, rtol={self.rtol:g}) {'ok' if self.ok else 'FAIL'}")


def compare(kernel: str, shape: str, got, expected, atol: float, rtol: float) -> ParityResult:
    """Compare a kernel's output with its numpy twin (float64 maths, NaN anywhere fails)."""
    got = np.asarray(got, dtype=np.float64).ravel()
    exp = np.asarray(expected, dtype=np.float64).ravel()
    if got.shape != exp.shape:
        return ParityResult(kernel, shape, np.inf, np.inf, atol, rtol, False)
    diff = np.abs(got - exp)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(exp), 1e-30)).max()) if diff.size else 0.0
    ok = bool(np.all(np.isfinite(got)) and np.all(diff <= atol + rtol * np.abs(exp)))
    scale = float(np.abs(exp).max()) if exp.size else 0.0
    return ParityResult(kernel, shape, max_abs, max_rel, atol, rtol, ok, scale)


def exact(kernel: str, shape: str, got: np.ndarray, expected: np.ndarray) -> ParityResult:
    """Bitwise comparison reported as a ParityResult (tolerances 0)."""
    same = got.shape == expected.shape and np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    r = compare(kernel, shape, got, expected, 0.0, 0.0)
    r.ok = bool(same)
    return r


def make_hyper(seed: int = 0, **floats) -> np.ndarray:
    """A uint32 [HP_WORDS] hyper array: HP_SEED = seed, and e.g. p_hid=0.1 -> HP_P_HID = f32 bits."""
    h = np.zeros(slots.HP_WORDS, np.uint32)
    h[slots.HP_SEED] = np.uint32(int(seed) & 0xFFFFFFFF)
    for name, value in floats.items():
        h[getattr(slots, "HP_" + name.upper())] = slots.f32_bits(value)
    return h


def check_groups(dev, only: tuple[str, ...] = ()) -> Iterator[tuple[str, Callable[[], list[ParityResult]]]]:
    """(group name, thunk) for every parity group (or those in `only`): kernel families, ordering, the
    whole model."""
    for name in GROUPS:
        if only and name not in only:
            continue
        module = importlib.import_module(f"catchat.parity.{name}")
        yield name, (lambda m=module: m.parity_checks(dev))


def run_all(dev, on_group: Callable[[str, list[ParityResult], float], None] | None = None,
            only: tuple[str, ...] = ()) -> list[tuple[str, ParityResult]]:
    """Run every group (or those in `only`); returns (group, result) pairs in order. `on_group(name,
    results, seconds)` hears of each group as it ends, so a slow or stuck group can be named."""
    out = []
    for group, thunk in check_groups(dev, only):
        start = time.perf_counter()
        results = thunk()
        out.extend((group, r) for r in results)
        if on_group:
            on_group(group, results, time.perf_counter() - start)
    return out


def timed_run(dev, only: tuple[str, ...] = (), on_group=None):
    """Run all checks (or the groups in `only`) and return (results, seconds)."""
    start = time.perf_counter()
    results = run_all(dev, on_group, only=only)
    return results, time.perf_counter() - start


def report(dev, results: list[tuple[str, ParityResult]], seconds: float, only: tuple[str, ...], argv) -> dict:
    """A parity run as a record (`catchat parity --json`): the device, what ran, every check (plain
    Python numbers: some checks hold numpy scalars), the totals."""
    from catchat import environment

    failed = sum(not r.ok for _, r in results)
    env = environment.settings()
    return dict(tool="catchat parity", argv=list(argv), date=time.strftime("%Y-%m-%d"), device=dev.info.name,
                device_type=dev.info.type, driver=dev.info.driver, env=env, groups=list(only) or list(GROUPS),
                seconds=seconds, passed=len(results) - failed, failed=failed, summary=summarise(results),
                checks=[dict(group=g, kernel=r.kernel, shape=r.shape, max_abs=float(r.max_abs),
                             max_rel=float(r.max_rel), atol=float(r.atol), rtol=float(r.rtol), ok=bool(r.ok))
                        for g, r in results])


def summarise(results: list[tuple[str, ParityResult]]) -> list[dict]:
    """Per group, in order: number of checks, failures, and the worst absolute and relative errors."""
    groups: dict[str, dict] = {}
    for group, r in results:
        g = groups.setdefault(group, dict(group=group, checks=0, failed=0, max_abs=0.0, max_rel=0.0))
        g["checks"] += 1
        g["failed"] += not r.ok
        g["max_abs"] = max(g["max_abs"], float(r.max_abs))
        g["max_rel"] = max(g["max_rel"], float(r.max_rel))
    return list(groups.values())
