#!/usr/bin/env python3
"""The short table of tools/bench_gemm.py JSON files: per shape, cuBLAS's rates (where measured), the
program's choice and the fastest candidates, each with TFLOP/s and its ratio to cuBLAS fp16.

    python tools/gemm_table.py FILE.json [FILE.json ...] [--top 5]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def rows_of(entry: dict, top: int) -> list[dict]:
    """The program's row and the `top` fastest rows that computed the product (probes apart)."""
    ok = [r for r in entry["rows"] if r.get("ok") and "PROBE" not in r["kind"]]
    best = sorted(ok, key=lambda r: -r["tflops"])[:top]
    program = [r for r in entry["rows"] if r.get("program") and r not in best]
    probes = [r for r in entry["rows"] if "PROBE" in r["kind"]]
    return program + best + sorted(probes, key=lambda r: -r["tflops"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args(argv)
    for f in args.files:
        try:
            report = json.loads(Path(f).read_text())
        except (OSError, ValueError) as exc:
            print(f"{f}: not readable ({exc})")
            continue
        print(f"== {Path(f).name}: {report.get('config')} on {report.get('device')}")
        for name, e in report["shapes"].items():
            torch = e.get("torch_tflops") or {}
            ref = torch.get("fp16")
            print(f"{name} [{e['M']}x{e['N']}x{e['K']}]" + "".join(f"  cuBLAS {k} {v:.0f}" for k, v in torch.items()))
            for r in rows_of(e, args.top):
                vs = f" {r['tflops'] / ref:.2f}x" if ref else ""
                mark = " *program*" if r.get("program") else ""
                print(f"  {r['tflops']:6.1f}{vs}  {r['tiles']}  {r['kind']}{mark}")
        failed = sum(1 for e in report["shapes"].values() for r in e["rows"] if not r.get("ok"))
        if failed:
            print(f"  {failed} rows computed something else (DIFFERS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
