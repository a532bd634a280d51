#!/usr/bin/env python3
"""What a dispatch costs when it does almost nothing: the fixed price of each dependent dispatch in a
recorded sequence, which a decode step pays once per stage (issue 35: v3 at one stream is five dependent
dispatches, layers 6.4 / 7.4 / 7.4 us, head 4.9, choice 5.8 on an H200, for very little work each).

    python tools/dispatch_chain.py [--counts 1,8,64,256] [--reps 9] [--device D] [--json F]

Records chains of N one-element Axpby dispatches, each ordered after the one before by the barrier the
program records between dependent dispatches, and times every chain two ways: wall clock of a submit
(median of --reps; submit and fence wait included) and GPU timestamps between consecutive dispatches
(median). The wall clock's slope over N and the timestamps' median are the price of one dispatch with
no work; a decode stage costs that plus its work. A persistent decoder (one dispatch a chunk, a grid
barrier between a step's stages, ~0.8-0.9 us each in the sweeps' phase clocks) saves the difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat.analysis.timing import timed_sequence  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.kernels import Axpby  # noqa: E402


def counts(text: str) -> list[int]:
    out = [int(c) for c in text.split(",")]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected counts >= 1, e.g. 1,8,64,256")
    return sorted(set(out))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", type=counts, default=counts("1,8,64,256"), help="chain lengths N")
    ap.add_argument("--reps", type=int, default=9, help="timed submits per chain (median)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    dev = open_device(args.device)
    x = dev.tensor(np.ones(1, np.float32), kind="storage")
    dev.upload([x])
    axpby = Axpby(dev, x, x, 1)
    rows = []
    print(f"{dev.info.name}: N dependent one-element dispatches in one submit")
    print(f"{'N':>5} {'wall ms':>9} {'GPU us between dispatches':>26}")
    for n in args.counts:
        ops = [axpby(1.0, 0.0) for _ in range(n)]
        wall_ms = timed_sequence(dev, ops, args.reps) * 1e3
        ts_us = float(np.median(dev.op_times_us(ops, runs=2))) if n > 1 else float("nan")
        rows.append({"n": n, "wall_ms": wall_ms, "timestamp_us": ts_us})
        print(f"{n:>5} {wall_ms:>9.3f} {ts_us:>26.2f}")
    ns = np.array([r["n"] for r in rows], np.float64)
    slope_us = float(np.polyfit(ns, [r["wall_ms"] for r in rows], 1)[0] * 1e3) if len(rows) > 1 else float("nan")
    print(f"wall clock per dispatch (slope over N): {slope_us:.2f} us")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": dev.info.name, "driver": dev.info.driver, "rows": rows,
                                               "wall_us_per_dispatch": slope_us}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
