#!/usr/bin/env python3
"""Which elements of a 16 x 16 cooperative matrix each invocation holds on this GPU's driver, and how
many loads a fragment of the layouts catchat stores costs each invocation (issues 32, 35).

    python tools/coopmat_layout.py [--device D] [--json F]

VK_KHR_cooperative_matrix leaves the mapping of a fragment's 256 elements to a subgroup's invocations to
the driver. glsl/coopmat_layout.comp loads the values 0..255 as each use's matrix (A, B, accumulator) in
row-major and column-major order and writes out what each invocation holds; this tool turns that into
(row, column) per (invocation, element), checks that both load orders give the same mapping, and counts,
for the layouts the sweeps and the decode step store (A row-major, B column-major, each fragment a
512-byte block), the contiguous runs of halves each invocation's elements form there: every run is at
least one load. A weights copy in the fragments' own order (invocation-major, its elements in order)
would be one run per invocation: one 16-byte load of 8 halves where the probes of the decode step at
v5's 64 streams say the W loads bound it (docs/generation.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.kernels import Kernel, half_tensor, run_ops  # noqa: E402
from catchat.vk.kernels.gemm_tiles import coopmat_khr_runs  # noqa: E402

MAXLEN = 32  # the shader's slots per invocation
LANES = 32
USES = ("A", "B", "accumulator")
# how catchat stores each use's 16 x 16 blocks (include/sweep_frag.glsl): A (h_prev, dGh, the GEMM's
# staged rows) row-major, B (W_hh^T, W_ih^T: W's rows are B's columns) column-major
STORED_COLUMN_MAJOR = {"A": False, "B": True, "accumulator": False}


def positions(values: np.ndarray, column_major: bool) -> np.ndarray:
    """(row, column) of each loaded value: the value is its offset in the 16 x 16 source, row-major
    (row * 16 + column) or column-major (column * 16 + row)."""
    v = np.rint(values).astype(np.int64)
    major, minor = v // 16, v % 16
    return np.stack([minor, major], -1) if column_major else np.stack([major, minor], -1)


def runs(offsets: np.ndarray) -> list[int]:
    """Lengths of the runs of consecutive offsets, in the order given (a run: each next offset is the last + 1)."""
    out = [1]
    for a, b in zip(offsets[:-1], offsets[1:]):
        if b == a + 1:
            out[-1] += 1
        else:
            out.append(1)
    return out


def analyse(raw: np.ndarray, lengths: list[int]) -> dict:
    """raw [6, LANES, MAXLEN] (slot = use * 2 + column-major) and the six lengths -> per use: elements per
    invocation, whether the two load orders agree, the (row, column) map [LANES, n], and the runs each
    invocation's elements form in catchat's stored layout (most and fewest runs over the invocations)."""
    out = {}
    for u, use in enumerate(USES):
        n = lengths[2 * u]
        pos_row = positions(raw[2 * u, :, :n], False)
        pos_col = positions(raw[2 * u + 1, :, :n], True)
        col = STORED_COLUMN_MAJOR[use]
        stored = pos_row[..., 1] * 16 + pos_row[..., 0] if col else pos_row[..., 0] * 16 + pos_row[..., 1]
        per_lane = [runs(stored[lane]) for lane in range(LANES)]
        covered = sorted(map(tuple, pos_row.reshape(-1, 2).tolist()))
        out[use] = {
            "elements": int(n),
            "orders_agree": bool(lengths[2 * u] == lengths[2 * u + 1] and np.array_equal(pos_row, pos_col)),
            "covers_all": covered == [(r, c) for r in range(16) for c in range(16)],
            "stored": "column-major" if col else "row-major",
            "runs_most": max(len(r) for r in per_lane),
            "runs_fewest": min(len(r) for r in per_lane),
            "run_halves": sorted({x for r in per_lane for x in r}),
            "map": pos_row.tolist(),
        }
    return out


def probe(dev) -> tuple[np.ndarray, list[int]]:
    """Run glsl/coopmat_layout.comp once: the values each invocation holds and each slot's length."""
    src16 = half_tensor(dev, np.arange(256, dtype=np.float16))
    src32 = dev.tensor(np.arange(256, dtype=np.float32))
    dst = dev.tensor(np.full(6 * LANES * MAXLEN + 6, -1.0, np.float32))
    k = Kernel(dev, [src16, src32, dst], [1, 1, 1], shader="coopmat_layout")
    run_ops(dev, [src16, src32, dst], [k.op()], [dst])
    words = np.asarray(dst.data(), np.float32)
    return words[: 6 * LANES * MAXLEN].reshape(6, LANES, MAXLEN), [int(x) for x in words[6 * LANES * MAXLEN:]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    dev = open_device(args.device)
    if not coopmat_khr_runs(dev):
        print(f"{dev.info.name}: no VK_KHR_cooperative_matrix to probe (or no newer glslc: `make setup`)",
              file=sys.stderr)
        return 2
    raw, lengths = probe(dev)
    res = analyse(raw, lengths)
    print(f"{dev.info.name} ({dev.info.driver}): 16 x 16 fragments, subgroups of {LANES}")
    print(f"{'use':<12} {'elements':>8} {'orders agree':>12} {'all 256':>7} {'stored':>13} {'runs a lane':>11} "
          f"{'run lengths (halves)':>20}")
    for use, r in res.items():
        spread = f"{r['runs_fewest']}-{r['runs_most']}" if r["runs_fewest"] != r["runs_most"] else str(r["runs_most"])
        print(f"{use:<12} {r['elements']:>8} {str(r['orders_agree']):>12} {str(r['covers_all']):>7} "
              f"{r['stored']:>13} {spread:>11} {','.join(map(str, r['run_halves'])):>20}")
    print("invocation 0 holds (row, column):", {u: res[u]["map"][0] for u in res})
    if args.json:
        Path(args.json).write_text(json.dumps({"tool": "tools/coopmat_layout.py", "device": dev.info.name,
                                               "driver": dev.info.driver, "uses": res}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
