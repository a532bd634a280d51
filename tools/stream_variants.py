#!/usr/bin/env python3
"""The streamed tensor-core sweeps' knobs side by side on one GPU: for each variant (W_hh fragments
kept in registers, CATCHAT_STREAM_RESIDENT; ring depths, CATCHAT_STREAM_DEPTH; W_hh fragments kept in
shared memory, CATCHAT_STREAM_SHARED; block flags instead of the grid barrier, CATCHAT_STREAM_FLAGS) the
sweeps' parity at v5's shape against the twin, then
`catchat bench` of CONFIG at fp16 with its profile; a table last.

    python tools/stream_variants.py configs/catchat-v5.toml --variant 0,0/4,8 --variant 2,12/2,4/0,3/1 [--json F]

A variant is RESIDENT/DEPTH[/SHARED[/FLAGS]], the first three "forward,backward" (glsl/gru_*_stream.comp's
RES, PD and SRES; SHARED is cut to what fits beside `red`, default 0,0), FLAGS 0 or 1 (KFLAGS; default
the program's, on: until 2026-12-07 the default here was 0, so the forward rows of earlier files ran
the grid barrier, ~1.2 ms a layer slower at v5 than the program). The
parity is the sweep group's check (catchat/parity/gru.py: the GPU's own rounded operands forced into
the float32 twin) at [T=4, B=32, H=2048] and [6, 32, 256], persistent over the device's SMs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from catchat.parity import gru as gru_parity  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.kernels import device_sms, gru  # noqa: E402

KEYS = ("o", "hprev", "save", "hT", "dgi", "dgh", "dh0")


def knobs(variant: str) -> dict:
    resident, depth, *rest = variant.split("/")
    shared, flags = (rest + ["0,0", ""][len(rest):])[:2]  # flags "": the program's own choice (stream_flags)
    return {gru.RESIDENT_ENV: resident, gru.DEPTH_ENV: depth, gru.SHARED_ENV: shared, gru.FLAGS_ENV: flags}


def sweep_parity(dev, env: dict, shapes: list) -> str:
    """'pass' or what failed, for the streamed sweeps under these knobs."""
    os.environ.update(env)
    bad = []
    for T, B, H in shapes:
        case = gru_parity.make_case(T, B, H)
        got = gru_parity.run_gru_gpu(dev, case, 0.02, persistent=(device_sms(dev),) * 2, w_half=True, coop=True)
        exp, _ = gru_parity.expected_gru(case, 0.02, recurrent="fp16", forced=(got["hprev"], got["dgh"]))
        bad += [f"H={H} {k}" for k in KEYS
                if not np.allclose(got[k], exp[k], atol=gru_parity.FWD_ATOL, rtol=gru_parity.FWD_RTOL)]
        bad += [f"H={H} tiles {got['tiles']}"] if got["tiles"][0].resident != int(env[gru.RESIDENT_ENV].split(",")[0]) \
            and H == shapes[0][2] else []
        bad += [f"H={H} barrier timeouts"] if got["sync_timeouts"] else []
    return "pass" if not bad else "FAIL " + ", ".join(bad)


def bench(config: str, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "catchat.cli", "bench", config, "--steps", "2", "--warmup", "1",
               "--precision", "fp16", "--profile", "--json", str(out)]
        res = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True)
        if res.returncode != 0:
            return {"error": (res.stderr or res.stdout).strip().splitlines()[-1:]}
        got = json.loads(out.read_text())["catchat"]
    sweeps = {kind: [ms for _, name, ms in got["profile"] if name.endswith(f"{kind} sweep")]
              for kind in ("forward", "backward")}
    return {"train_tokens_per_s": got["train_tokens_per_s"], "step_ms": got["step_ms"],
            "eval_tokens_per_s": got["eval_tokens_per_s"],
            **{f"{k}_sweep_ms": float(np.mean(v)) for k, v in sweeps.items() if v},
            "tiles": [s["tiles"] for s in got["sweeps"][::len(got["sweeps"]) // 2]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--variant", action="append", required=True,
                    help="RESIDENT/DEPTH[/SHARED[/FLAGS]], e.g. 2,12/2,4 or 2,12/2,4/0,3/1")
    ap.add_argument("--shapes", default="4x32x2048,6x32x256",
                    help="TxBxH of the parity cases (the first: where RESIDENT must hold)")
    ap.add_argument("--json", help="write every variant's numbers here")
    args = ap.parse_args()
    dev = open_device()
    rows = []
    for v in args.variant:
        env = knobs(v)
        shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
        row = {"variant": v, "parity": sweep_parity(dev, env, shapes), **bench(args.config, env)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"\n{'RES/DEPTH/SH/FL':16} {'parity':8} {'train tok/s':>12} {'step ms':>8} {'fwd sweep':>10} "
          f"{'bwd sweep':>10} {'eval tok/s':>11}")
    for r in rows:
        print(f"{r['variant']:16} {r['parity'][:8]:8} {r.get('train_tokens_per_s', 0):12,.0f} "
              f"{r.get('step_ms', 0):8.1f} {r.get('forward_sweep_ms', 0):10.2f} {r.get('backward_sweep_ms', 0):10.2f} "
              f"{r.get('eval_tokens_per_s', 0):11,.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
