"""Weak scaling over GPUs (docs/distributed.md "Scaling"): `catchat train` of each config on 1, 2, 4, ...
GPUs, each rank on its own GPU with the config's lanes (data.batch_lanes = N x the config's), a few
steps each; per run the median step's tokens per second, per GPU, and the efficiency against one GPU:

    python3 tools/bench_scaling.py [CONFIG ...] [--gpus 1,2,4,8] [--steps 12] [--precision fp16]
                                   [--set SECTION.KEY=VALUE ...] [--json OUT.json]

One GPU is a plain `catchat train`; N > 1 run under mpiexec with `--device 0,1,...,N-1` (rank r takes
GPU r), as a user would start them. `--share-device` gives every rank device 0 instead (a machine
with one GPU, or lavapipe: the tool's own test; that measures the exchange, not the scaling). Figures
from the steps after the first (metrics.csv's tokens_per_s: the whole job's tokens); exchange_share
from the run's `end` event (docs/distributed.md "Cost"). Evals, samples and interval checkpoints are
off; each run ends with its checkpoint, in a temporary directory removed afterwards.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_exchange import QUIET, mpiexec  # noqa: E402

from catchat import config as cfgmod  # noqa: E402


def train_cmd(config: str, gpus: int, steps: int, run_dir: str, overrides: list[str], share_device: bool) -> list[str]:
    """The command line of one run: plain for one GPU, else mpiexec with a GPU per rank."""
    train = [sys.executable, "-m", "catchat", "train", config, "--run-dir", run_dir, "--stop-after-steps", str(steps),
             *(a for kv in overrides for a in ("--set", kv))]
    if gpus == 1:
        return train
    devices = ",".join("0" if share_device else str(r) for r in range(gpus))
    return [mpiexec(), "-n", str(gpus), *train, "--device", devices]


def run(config: str, gpus: int, steps: int, sets: list[str], share_device: bool, timeout_s: float) -> dict:
    """One run on `gpus` GPUs: its median step's figures and, with several ranks, its exchange share."""
    lanes = cfgmod.load(config, sets).data.batch_lanes
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        overrides = [*QUIET, *sets, f"data.batch_lanes={gpus * lanes}"]
        cmd = train_cmd(config, gpus, steps, f"{tmp}/run", overrides, share_device)
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        with open(Path(tmp, "run", "metrics.csv"), newline="") as f:
            later = [row for row in csv.DictReader(f) if int(row["global_step"]) > 1]
        end = json.loads(Path(tmp, "run", "events.jsonl").read_text().splitlines()[-1])
    if not later:
        sys.exit(f"{config} on {gpus} GPUs: no step after the first (--steps {steps})")
    tokens_per_s = statistics.median(float(row["tokens_per_s"]) for row in later)
    return dict(config=Path(config).stem, gpus=gpus, lanes_per_gpu=lanes, steps=len(later),
                tokens_per_s=round(tokens_per_s, 1), tokens_per_s_per_gpu=round(tokens_per_s / gpus, 1),
                step_ms=round(statistics.median(float(row["step_ms"]) for row in later), 2),
                exchange_share=end.get("distributed", {}).get("exchange_share"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=["configs/catchat-v3.toml", "configs/catchat-v5.toml"])
    ap.add_argument("--gpus", default="1,2,4,8", help="GPU counts, comma-separated (the first is the baseline)")
    ap.add_argument("--steps", type=int, default=12, help="steps per run (the first is left out of the figures)")
    ap.add_argument("--precision", choices=("fp32", "fp16"), help="train.precision (default: the config's)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--share-device", action="store_true", help="every rank on device 0 (one GPU, or lavapipe)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--json", type=Path, help="write every run's figures here")
    args = ap.parse_args()
    sets = args.sets + ([f'train.precision="{args.precision}"'] if args.precision else [])
    counts = [int(n) for n in args.gpus.split(",")]
    rows = []
    print(f"{'config':<12} {'GPUs':>4} {'lanes':>6} {'tok/s':>12} {'tok/s/GPU':>12} {'step ms':>9} {'efficiency':>10} "
          f"{'exchange_share':>14}", flush=True)
    for config in args.configs:
        base = None
        for gpus in counts:
            row = run(config, gpus, args.steps, sets, args.share_device, args.timeout)
            base = base or row
            row["efficiency"] = round(row["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"], 4)
            rows.append(row)
            print(f"{row['config']:<12} {gpus:>4} {gpus * row['lanes_per_gpu']:>6} {row['tokens_per_s']:>12,.0f} "
                  f"{row['tokens_per_s_per_gpu']:>12,.0f} {row['step_ms']:>9.1f} {row['efficiency']:>10.3f} "
                  f"{row['exchange_share'] if row['exchange_share'] is not None else '-':>14}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
