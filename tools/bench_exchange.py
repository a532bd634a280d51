"""Measure the gradient exchange's share of a training step (docs/distributed.md "Cost"): `catchat train`
on N ranks under mpiexec, a few steps per config x distributed.overlap on/off x exchange dtype,
each run's `end` event read back:

    python3 tools/bench_exchange.py [CONFIG ...] [--ranks 2] [--steps 12] [--dtypes fp32,fp16]
                                    [--set SECTION.KEY=VALUE ...] [--json OUT.json]

The ranks share this machine's GPUs as `catchat train` deals them out (local rank modulo the GPUs).
Prints a row per run, in ms per step (the steps after the first): wait for the slowest rank,
exchange (collectives and sums, hidden or not), the host's transfer, exposed (what held the step
up), the step, and exchange_share = exposed / step; then per config and dtype the share of the
exchange that overlap hid, (step without - step with) / (exchange + transfer without). Evals,
samples and interval checkpoints are off; each run ends with its checkpoint, in a temporary
directory removed afterwards. mpiexec is the one beside this Python, else the first on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from catchat.distributed import find_mpiexec  # noqa: E402

QUIET = ["eval.eval_every_seqs=0", "eval.sample_chars=0", "checkpoint.checkpoint_every_seqs=0",
         "log.tensorboard=false"]
COLUMNS = ("wait", "exchange", "transfer", "exposed", "step")


def mpiexec() -> str:
    found = find_mpiexec()
    if found is None:
        sys.exit("no mpiexec beside this Python or on PATH (docs/distributed.md: the MPICH wheel's venv)")
    return found


def run(config: str, ranks: int, steps: int, overlap: bool, dtype: str, sets: list[str], timeout_s: float) -> dict:
    """One `catchat train` on `ranks` ranks: its end event's `distributed` fields."""
    with tempfile.TemporaryDirectory(prefix="bench-exchange-") as tmp:
        overrides = [*QUIET, *sets, f"distributed.overlap={str(overlap).lower()}",
                     f'distributed.exchange_dtype="{dtype}"']
        cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "catchat", "train", config, "--run-dir",
               f"{tmp}/run", "--stop-after-steps", str(steps), *(a for kv in overrides for a in ("--set", kv))]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if r.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        end = json.loads(Path(tmp, "run", "events.jsonl").read_text().splitlines()[-1])
    return dict(config=Path(config).stem, **end["distributed"])  # ranks, overlap, exchange_dtype among them


def hidden_share(on: dict, off: dict) -> float | None:
    """The share of the exchange (without overlap) that overlap took off the step."""
    cost = off["exchange_ms_per_step"] + off["transfer_ms_per_step"]
    return (off["step_ms_per_step"] - on["step_ms_per_step"]) / cost if cost > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="*", default=["configs/catchat-v3.toml", "configs/catchat-v5.toml"])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12, help="steps per run (the first is left out of the figures)")
    ap.add_argument("--dtypes", default="fp32,fp16", help="distributed.exchange_dtype values, comma-separated")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--timeout", type=float, default=200.0, help="seconds per run")
    ap.add_argument("--json", type=Path, help="write every run's fields here")
    args = ap.parse_args()
    rows = []
    print(f"{'config':<12} {'dtype':<5} {'overlap':<7} " + " ".join(f"{c:>9}" for c in COLUMNS) + "  share", flush=True)
    for config in args.configs:
        for dtype in args.dtypes.split(","):
            pair = {}
            for overlap in (False, True):
                row = pair[overlap] = run(config, args.ranks, args.steps, overlap, dtype, args.sets, args.timeout)
                rows.append(row)
                print(f"{row['config']:<12} {dtype:<5} {str(overlap):<7} "
                      + " ".join(f"{row[c + '_ms_per_step']:>9.2f}" for c in COLUMNS)
                      + f"  {row['exchange_share']}", flush=True)
            hid = hidden_share(pair[True], pair[False])
            pair[True]["hidden_share"] = None if hid is None else round(hid, 4)
            print(f"{pair[True]['config']:<12} {dtype:<5} overlap hid {hid if hid is None else round(hid, 3)} of the "
                  "exchange", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
