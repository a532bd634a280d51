"""Run time-budgeted variants of a config and print one docs/speedrun.md row each:

    python tools/speedrun.py base "lr2e-3:train.lr=2e-3,train.label_smoothing=0" [--budget 300]
                             [--config configs/speedrun.toml] [--runs-dir runs/speedrun] [--set K=V ...]

--budget 0 runs each variant to the config's own length instead (e.g. fixed steps: fp16 against
FP32 at 600 steps of v3, docs/benchmarks.md "Mixed precision"):

    python tools/speedrun.py fp32 fp16:train.precision=fp16 --budget 0 --config configs/catchat-v3.toml \
        --set train.cycles=0 --set train.total_steps=600 --set eval.eval_windows=0 --set data.corpus=DIR

A VARIANT is NAME or NAME:SECTION.KEY=VALUE,SECTION.KEY=VALUE (changes to the config; "base" alone
runs the config as it is). Each runs `catchat train CONFIG --time-budget BUDGET` as a user would,
in its own process (so start-up counts), one after another, into RUNS_DIR/NAME (replaced). --set
applies to every variant (e.g. --set data.corpus=DIR for a corpus built beforehand). The row:
steps reached, median train tokens/s, the held-out loss of the final eval (nats/char, all of the
eval split when eval.eval_windows = 0), and the run's wall clock from launch to exit.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat.run import runlog  # noqa: E402


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'name:a.b=1,c.d=2' -> ('name', ['a.b=1', 'c.d=2'])."""
    name, _, changes = text.partition(":")
    return name, [c for c in changes.split(",") if c]


def run_variant(config: str, budget: float, run_dir: Path, changes: list[str]) -> float:
    """Train one variant (budget 0: to the config's own length); its wall clock in seconds from
    launch to exit."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "catchat", "train", config, "--run-dir", str(run_dir)]
    if budget:
        cmd += ["--time-budget", f"{budget:g}"]
    for c in changes:
        cmd += ["--set", c]
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{run_dir.name}: catchat train exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return wall_s


def summarise(run_dir: Path) -> dict:
    """Steps, median tokens/s and the final eval's loss of a finished run."""
    events = runlog.read_events(run_dir / "events.jsonl").events
    evals = [e for e in events if e["event"] == "eval"]
    metrics = runlog.read_metrics(run_dir / "metrics.csv")
    tokens_per_s = statistics.median(runlog.numbers(r)["tokens_per_s"] for r in metrics.rows)
    end = next(e for e in reversed(events) if e["event"] == "end")
    return {"steps": end["global_step"], "tokens_per_s": tokens_per_s,
            "loss": evals[-1]["loss"] if evals else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", help="NAME or NAME:SECTION.KEY=VALUE,...")
    ap.add_argument("--config", default="configs/speedrun.toml")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds of wall clock per run (0: the config's own run length)")
    ap.add_argument("--runs-dir", type=Path, default=Path("runs/speedrun"))
    ap.add_argument("--set", dest="common", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args()

    print("| variant | changes | steps | train tok/s | held-out nats/char | wall s |")
    print("|---|---|---|---|---|---|")
    for text in args.variants:
        name, changes = parse_variant(text)
        run_dir = args.runs_dir / name
        wall_s = run_variant(args.config, args.budget, run_dir, args.common + changes)
        s = summarise(run_dir)
        print(f"| {name} | {', '.join(changes) or '-'} | {s['steps']:,} | {s['tokens_per_s']:,.0f} | "
              f"{s['loss']:.4f} | {wall_s:.1f} |", flush=True)


if __name__ == "__main__":
    main()
