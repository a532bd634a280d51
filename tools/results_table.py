"""One markdown table of `catchat bench --json` files side by side: the variants of a device call
(tools/gpu-check.sh's $OUT, e.g. bench-v3-fp16-overlap.json beside -nooverlap.json) or docs/results/.

    python tools/results_table.py OUT_DIR_OR_FILES... [--base NAME]

A row per file: how the step was recorded (the wavefront's chunks forward/backward, 1 for layer by
layer; dW_hh beside the sweep below), train and eval tokens/s, the step and its forward / backward split, the profile's
sweeps and GEMMs (each group timed alone: overlap shows in the step, not here), device memory, the
ratio to PyTorch's AMP bf16 row where the file has one (--compare-torch) and, with --base, each
row's train tokens/s over the base file's (its name without .json).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def bench_files(paths: list[str]) -> list[Path]:
    """The JSON files named, and those in the folders named, that hold a catchat bench result."""
    out = []
    for p in map(Path, paths):
        for f in sorted(p.glob("*.json")) if p.is_dir() else [p]:
            try:
                c = json.loads(f.read_text()).get("catchat")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(c, dict) and "train_tokens_per_s" in c:
                out.append(f)
    return out


def row(f: Path) -> dict:
    """The figures of one file's catchat result (and torch's AMP bf16 row, where present)."""
    d = json.loads(f.read_text())
    c = d["catchat"]
    profile = c.get("profile") or []
    ms = {kind: sum(t for k, _, t in profile if k == kind) for kind in ("sweep", "gemm")}
    bf16 = (d.get("torch") or {}).get("AMP bf16") or {}
    rec = c.get("recording") or {}  # how the step was recorded (files from 2026-12-05 on)
    recording = (f"wavefront {rec['wavefront_forward']}/{rec['wavefront_backward']}"
                 + (", dW_hh beside" if rec.get("dw_hh_beside") else "")) if rec else ""
    return dict(name=f.stem, recording=recording, train=c["train_tokens_per_s"], eval=c.get("eval_tokens_per_s"),
                step=c["step_ms"],
                fwd=c.get("forward_ms"), bwd=c.get("backward_ms"), sweeps=ms["sweep"] if profile else None,
                gemms=ms["gemm"] if profile else None, gib=c.get("device_bytes", 0) / 2**30,
                vs_bf16=c["train_tokens_per_s"] / bf16["train_tokens_per_s"] if bf16 else None)


def table(rows: list[dict], base: str | None) -> str:
    base_tok = next((r["train"] for r in rows if r["name"] == base), None)
    if base is not None and base_tok is None:
        raise SystemExit(f"--base {base}: no such file among {', '.join(r['name'] for r in rows)}")

    def cell(v, fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    out = ["| file | recorded | train tok/s | vs base | vs AMP bf16 | step ms | fwd / bwd ms | sweeps ms | GEMMs ms "
           "| eval tok/s | GiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        split = f"{cell(r['fwd'], '.1f')} / {cell(r['bwd'], '.1f')}" if r["fwd"] is not None else ""
        out.append(f"| {r['name']} | {r['recording']} | {r['train']:,.0f} "
                   f"| {cell(base_tok and r['train'] / base_tok, '.3f')} "
                   f"| {cell(r['vs_bf16'], '.2f')} | {r['step']:.1f} | {split} | {cell(r['sweeps'], '.1f')} "
                   f"| {cell(r['gemms'], '.1f')} | {cell(r['eval'], ',.0f')} | {r['gib']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="bench JSON files, or folders of them")
    ap.add_argument("--base", help="the file (name without .json) whose train tokens/s the others are divided by")
    args = ap.parse_args(argv)
    files = bench_files(args.paths)
    if not files:
        print(f"no catchat bench results in {' '.join(args.paths)}", file=sys.stderr)
        return 2
    print(table([row(f) for f in files], args.base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
