#!/usr/bin/env python3
"""The short table a device call ends with: one row a part of tools/gpu-check.sh, with its exit
status, wall seconds and headline, read from the files the part left under OUT_DIR.

    python tools/gpu_summary.py OUT_DIR PART [PART ...]

gpu-check runs it over the parts it ran, so the call's last lines say what came out without
fetching a file. Headlines by what the part wrote:
- `catchat bench --json`: train and eval tokens/s, the step, the profile's forward / backward sweep
  per layer and GEMM total, and the ratios to torch's rows where it ran them;
- `catchat parity --json` (or its text): checks passed and failed;
- `tools/bench_generate.py --json`: chars/s per decode and batch;
- `tools/speedrun.py`: each row's held-out nats/char and steps; `tools/sweep_phases.py`: us a step;
- anything else: the last line the part printed.
A part's JSON is `OUT_DIR/PART.json`, or the one JSON its command line names (`--json F`).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

WIDTH = 150  # headline characters kept: a device call shows the last 12,000 characters of output


def status(txt: str) -> tuple[str, str]:
    """(exit status, wall seconds) from a part's text: gpu-check's `rc=N` and `time`'s `real XmY.Zs`."""
    rc = re.findall(r"^rc=(\d+)\s*$", txt, re.M)
    wall = re.findall(r"^real\s+(\d+)m([\d.]+)s\s*$", txt, re.M)
    return (rc[-1] if rc else "?"), (f"{int(wall[-1][0]) * 60 + float(wall[-1][1]):.0f}" if wall else "?")


def bench_headline(d: dict) -> str:
    c = d["catchat"]
    parts = [f"train {c['train_tokens_per_s']:,.0f} tok/s"]
    for label, short in (("FP32 (TF32 off)", "FP32"), ("AMP bf16", "bf16")):
        row = (d.get("torch") or {}).get(label)
        if row and row.get("train_tokens_per_s"):
            parts.append(f"{c['train_tokens_per_s'] / row['train_tokens_per_s']:.2f}x {short}")
    parts += [f"step {c['step_ms']:.1f} ms", f"eval {c['eval_tokens_per_s']:,.0f}"]
    prof = c.get("profile") or []
    fwd = [ms for kind, name, ms in prof if kind == "sweep" and "forward" in name]
    bwd = [ms for kind, name, ms in prof if kind == "sweep" and "backward" in name]
    gemm = [ms for kind, _, ms in prof if kind == "gemm"]
    if fwd:
        parts.append(f"sweeps {min(fwd):.1f}-{max(fwd):.1f} fwd, {min(bwd):.1f}-{max(bwd):.1f} bwd ms"
                     if bwd else f"sweeps {min(fwd):.1f}-{max(fwd):.1f} fwd ms")
    if gemm:
        parts.append(f"GEMMs {sum(gemm):.1f} ms")
    return ", ".join(parts)


def generate_headline(d: dict) -> str:
    return ", ".join(f"{r.get('decode') or 'gen'} b{r['batch']} {r['chars_per_s']:,.0f}" for r in d["catchat"])


def json_headline(d) -> str | None:
    if isinstance(d, dict) and isinstance(d.get("catchat"), dict) and "train_tokens_per_s" in d["catchat"]:
        return bench_headline(d)
    if isinstance(d, dict) and d.get("tool") == "catchat parity":
        return f"parity {d['passed']} passed, {d['failed']} failed"
    if isinstance(d, dict) and isinstance(d.get("catchat"), list) and d["catchat"] and "chars_per_s" in d["catchat"][0]:
        return "chars/s " + generate_headline(d)
    return None


def text_headline(txt: str) -> str:
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in txt.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")]
    if rows and all(len(r) >= 6 for r in rows):  # tools/speedrun.py's table
        return "; ".join(f"{r[0]} {r[4]} ({r[2]} steps)" for r in rows)
    phases = re.findall(r"^(forward|backward): .*?the sweep takes ([\d.]+) us per step", txt, re.M)
    if phases:  # tools/sweep_phases.py
        return ", ".join(f"{d} {us} us a step" for d, us in phases)
    passed = re.findall(r"^(\d+) passed, (\d+) failed", txt, re.M)
    if passed:
        return f"parity {passed[-1][0]} passed, {passed[-1][1]} failed"
    lines = [line.strip() for line in txt.splitlines() if line.strip()
             and not re.match(r"^(real|user|sys)\s|^rc=\d+$", line.strip())]
    return lines[-1] if lines else ""


def headline(out: Path, name: str, txt: str) -> str:
    named = re.findall(r"--json\s+\S*?([^/\s\"]+\.json)", txt)  # a command line echoed into the part's text
    for path in [out / f"{name}.json", *(out / n for n in named)]:
        if path.is_file():
            try:
                h = json_headline(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError, ZeroDivisionError):
                h = None
            if h:
                return h
    return text_headline(txt)


def rows(out: Path, parts: list[str]) -> list[tuple[str, str, str, str]]:
    table = []
    for name in parts:
        f = out / f"{name}.txt"
        txt = f.read_text(errors="replace") if f.is_file() else ""
        rc, wall = status(txt)
        h = headline(out, name, txt) if txt else "(no output)"
        table.append((name, rc, wall, h if len(h) <= WIDTH else h[:WIDTH - 3] + "..."))
    return table


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: tools/gpu_summary.py OUT_DIR PART [PART ...]", file=sys.stderr)
        return 2
    print("| part | rc | s | headline |\n|---|---|---|---|")
    for name, rc, wall, h in rows(Path(args[0]), args[1:]):
        print(f"| {name} | {rc} | {wall} | {h} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
