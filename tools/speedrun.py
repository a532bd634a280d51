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

--seeds 3,4,5 runs every variant once per seed (train.seed=N, into RUNS_DIR/NAME-sN), a row each, then a
row NAME with the mean of each column and the held-out loss as mean (min-max): how a claim is reported
(one config run twice gave 1.364 and 1.378, docs/speedrun.md).

--evals-json FILE writes every run's held-out evals ([global_step, nats/char], in order) to FILE as the
rows come: the curve behind a row's last number (whether the loss was still falling at the peak lr, or
flat until the cooldown), without opening each run's events.jsonl.

--screen-steps N screens first: every variant runs N steps (no time budget, the schedule over N steps,
into RUNS_DIR/NAME-Nsteps, a row each), then the --confirm K (default 1) with the lowest held-out loss
run again at --budget, a row each: docs/speedrun.md's way of spending a device call (screen at 1,024
steps, ~1 min a row on an H200, then the best at 300 s).

    python tools/speedrun.py corpus lf:data.lane_order=longest_first --screen-steps 1024 --confirm 1

--torch VARIANT (repeatable, the same NAME[:CHANGES] syntax) adds PyTorch rows after catchat's: the same
config, budget and --set changes trained by `python -m catchat.analysis.torch_train` (catchat's model and
recipe in PyTorch: cuDNN GRU, AMP bf16 where the config trains at fp16 on CUDA, NAdam; the same corpus
split, lanes, schedule, clock and eval; docs/speedrun.md "The PyTorch row"), in its own process into
RUNS_DIR/NAME, its changes column starting with "PyTorch". Only torch rows: leave out the catchat variants.
--torch-python PYTHON runs them with another interpreter (one that has torch; the trainer needs only numpy
besides, and finds this checkout's catchat through PYTHONPATH), e.g. a machine's own CUDA torch while
catchat's venv has none.

    python tools/speedrun.py coop --torch torch                     # 300 s each, one table
    python tools/speedrun.py coop --torch torch --budget 0 --set train.time_budget_s=0 \
        --set train.total_steps=2048                                # the same 2,048 steps each

--jobs N runs up to N rows at once, for rows planned in steps only (--budget 0 and no train.time_budget_s:
refused otherwise, since rows at once share the GPU and a timed row's score depends on its speed; their
wall column is then their own time while sharing). The rows print in the order given once each has run.
What it buys: PyTorch's rows leave most of the GPU idle (cuDNN's GRU a step at a time), so under CUDA's
multi-process service (`nvidia-cuda-mps-control -d` first) two ran at 92-94% of one's tokens/s each on an
H100 (docs/results/2026-12-07-h100-speedrun-torch-mps-probe.txt), and three at once each at the speed of
one alone (-2048steps-torch-s345.txt): three seeds of 2,048 steps in the time of one. Without the service
CUDA time-slices processes, and catchat's Vulkan rows are not served by it. --mps starts the service
(`nvidia-cuda-mps-control -d`) before the first row and stops it after the last; one already running is
used and left running.

    python tools/speedrun.py --torch t2048 --seeds 3,4,5 --jobs 3 --mps --budget 0 --set train.time_budget_s=0 \
        --set train.cycles=0 --set train.total_steps=2048
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MPS_CONTROL = "nvidia-cuda-mps-control"
sys.path.insert(0, str(ROOT))

from catchat import config as cfgmod  # noqa: E402
from catchat.errors import UsageError  # noqa: E402
from catchat.run import runlog  # noqa: E402


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'name:a.b=1,c.d=2' -> ('name', ['a.b=1', 'c.d=2'])."""
    name, _, changes = text.partition(":")
    return name, [c for c in changes.split(",") if c]


ENGINES = {"catchat": ["-m", "catchat", "train"], "torch": ["-m", "catchat.analysis.torch_train"]}


def train_command(engine: str, config: str, budget: float, run_dir: Path, changes: list[str],
                  python: str = sys.executable) -> list[str]:
    """The command line that trains one variant: `catchat train` or the PyTorch trainer, which take the
    same CONFIG, --run-dir, --time-budget (budget 0: none, the config's own length) and --set."""
    cmd = [python, *ENGINES[engine], config, "--run-dir", str(run_dir)]
    if budget:
        cmd += ["--time-budget", f"{budget:g}"]
    for c in changes:
        cmd += ["--set", c]
    return cmd


def run_variant(cmd: list[str], run_dir: Path) -> float:
    """Train one variant (run_dir replaced); its wall clock in seconds from launch to exit."""
    shutil.rmtree(run_dir, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{run_dir.name}: {' '.join(cmd[1:4])} exited {done.returncode}: "
                         f"{done.stderr.strip()[-400:]}")
    return wall_s


def summarise(run_dir: Path) -> dict:
    """Steps, median tokens/s and the final eval's loss of a finished run."""
    events = runlog.read_events(run_dir / "events.jsonl").events
    evals = [e for e in events if e["event"] == "eval"]
    metrics = runlog.read_metrics(run_dir / "metrics.csv")
    tokens_per_s = statistics.median(runlog.numbers(r)["tokens_per_s"] for r in metrics.rows)
    end = next(e for e in reversed(events) if e["event"] == "end")
    return {"steps": end["global_step"], "tokens_per_s": tokens_per_s,
            "loss": evals[-1]["loss"] if evals else float("nan"),
            "evals": [[e["global_step"], e["loss"]] for e in evals]}


def changes_cell(changes: list[str], engine: str, *more: str) -> str:
    """A row's changes column: a PyTorch row's says so first; "-" for none."""
    return ", ".join((["PyTorch"] if engine == "torch" else []) + changes + list(more)) or "-"


def format_row(name: str, changes: list[str], s: dict, wall_s: float, engine: str = "catchat") -> str:
    """One table row."""
    what = changes_cell(changes, engine)
    return f"| {name} | {what} | {s['steps']:,} | {s['tokens_per_s']:,.0f} | {s['loss']:.4f} | {wall_s:.1f} |"


def seed_runs(name: str, changes: list[str], seeds: list[int]) -> list[tuple[str, list[str]]]:
    """(run name, changes) of a variant: itself, or one run per seed (NAME-sN, train.seed=N appended)."""
    if not seeds:
        return [(name, changes)]
    return [(f"{name}-s{seed}", changes + [f"train.seed={seed}"]) for seed in seeds]


def format_seeds_row(name: str, changes: list[str], rows: list[tuple[dict, float]], engine: str = "catchat") -> str:
    """The summary row of a variant's seeds: mean steps, tokens/s and wall clock; the held-out loss as
    mean (min-max)."""
    losses = [s["loss"] for s, _ in rows]
    what = changes_cell(changes, engine, f"{len(rows)} seeds")
    mean = statistics.fmean
    return (f"| {name} | {what} | {mean(s['steps'] for s, _ in rows):,.0f} | "
            f"{mean(s['tokens_per_s'] for s, _ in rows):,.0f} | {mean(losses):.4f} ({min(losses):.4f}-"
            f"{max(losses):.4f}) | {mean(w for _, w in rows):.1f} |")


def parse_seeds(text: str) -> list[int]:
    """'3,4,5' -> [3, 4, 5] (distinct non-negative integers)."""
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of seeds, e.g. 3,4,5") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct non-negative seeds, e.g. 3,4,5")
    return seeds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="*", help="NAME or NAME:SECTION.KEY=VALUE,...")
    ap.add_argument("--torch", dest="torch_variants", action="append", default=[], metavar="VARIANT",
                    help="a PyTorch row: NAME or NAME:SECTION.KEY=VALUE,... (catchat.analysis.torch_train)")
    ap.add_argument("--torch-python", default=sys.executable, metavar="PYTHON",
                    help="the interpreter of the PyTorch rows (default: this one)")
    ap.add_argument("--config", default="configs/speedrun.toml")
    ap.add_argument("--budget", type=float, default=300.0,
                    help="seconds of wall clock per run (0: the config's own run length)")
    ap.add_argument("--runs-dir", type=Path, default=Path("runs/speedrun"))
    ap.add_argument("--set", dest="common", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--seeds", type=parse_seeds, default=[], metavar="N,N,...",
                    help="run every variant once per seed (train.seed) and add a mean row")
    ap.add_argument("--screen-steps", type=int, default=0, metavar="N",
                    help="first run every variant N steps, then the --confirm best at --budget")
    ap.add_argument("--confirm", type=int, default=1, metavar="K",
                    help="with --screen-steps: how many of the screened variants to run at --budget")
    ap.add_argument("--evals-json", type=Path, default=None, metavar="FILE",
                    help="write each run's held-out evals ([global_step, nats/char] in order) to FILE")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="rows planned in steps only: run up to N at once (the GPU shared)")
    ap.add_argument("--mps", action="store_true",
                    help="with --jobs: run the rows under CUDA's multi-process service (started and stopped here)")
    args = ap.parse_args(argv)
    args.evals = {}
    if not args.variants and not args.torch_variants:
        ap.error("name at least one variant (or --torch VARIANT)")
    if args.screen_steps < 0 or args.confirm < 1:
        ap.error("--screen-steps takes a number of steps (0: no screen) and --confirm at least 1")
    if args.screen_steps and (args.seeds or args.torch_variants or args.jobs != 1):
        ap.error("--screen-steps screens catchat variants of one seed, one at a time: leave out --seeds, --torch "
                 "and --jobs")
    names = [run for v in args.variants + args.torch_variants
             for run, _ in seed_runs(*parse_variant(v), args.seeds)]
    if len(set(names)) != len(names):
        ap.error(f"variant names must differ (each is a directory of --runs-dir): {', '.join(names)}")
    if args.jobs < 1:
        ap.error("--jobs takes how many rows run at once, at least 1")
    if args.jobs > 1:
        check_untimed(ap, args)
    if args.mps and args.jobs == 1:
        ap.error("--mps lets rows run at once share the GPU: give --jobs N (N > 1) with it")
    if args.mps and not shutil.which(MPS_CONTROL):
        ap.error(f"--mps needs {MPS_CONTROL} (NVIDIA's driver utilities) on PATH; without --mps the rows "
                 "share the GPU by time slices")
    return args


@contextlib.contextmanager
def mps_service(enabled: bool):
    """CUDA's multi-process service for the rows' lifetime (--mps): started with `-d` and stopped with
    `quit` after the last row where this started it; where `-d` fails (one already running, or no GPU)
    its words are printed and the rows go on without a service of their own."""
    if not enabled:
        yield
        return
    start = subprocess.run([MPS_CONTROL, "-d"], capture_output=True, text=True)
    if start.returncode:
        said = " ".join((start.stdout + start.stderr).split()) or f"exit status {start.returncode}"
        print(f"# --mps: `{MPS_CONTROL} -d` said: {said}; left as it is", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        if start.returncode == 0:
            subprocess.run([MPS_CONTROL], input="quit\n", capture_output=True, text=True)


def check_untimed(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--jobs > 1 shares the GPU between rows, so no row may be timed: --budget 0, and no variant whose
    config keeps a train.time_budget_s."""
    fix = "give --budget 0 and --set train.time_budget_s=0 (rows planned in steps), or leave out --jobs"
    if args.budget:
        ap.error(f"--jobs runs rows at once on one GPU, which would slow a timed row: {fix}")
    for text in args.variants + args.torch_variants:
        name, changes = parse_variant(text)
        try:
            budget = cfgmod.load(args.config, args.common + changes).train.time_budget_s
        except UsageError as e:
            ap.error(str(e))
        if budget:
            ap.error(f"--jobs: {name} keeps train.time_budget_s = {budget:g} from its config: {fix}")


def train_run(args: argparse.Namespace, run: str, changes: list[str], budget: float, engine: str = "catchat",
              extra: tuple[str, ...] = ()) -> float:
    """Train one run (RUNS_DIR/run: the common --set changes, then `changes`, then `extra`) at `budget`;
    its wall clock."""
    python = args.torch_python if engine == "torch" else sys.executable
    run_dir = args.runs_dir / run
    return run_variant(train_command(engine, args.config, budget, run_dir, args.common + changes + list(extra),
                                     python), run_dir)


def print_row(args: argparse.Namespace, run: str, changes: list[str], wall_s: float,
              engine: str = "catchat") -> tuple[dict, float]:
    """Print a finished run's row (and record its evals); (its summary, its wall clock)."""
    s = summarise(args.runs_dir / run)
    print(format_row(run, changes, s, wall_s, engine), flush=True)
    if args.evals_json:  # every row's held-out curve so far, rewritten after each row (a cut call keeps them)
        args.evals[run] = s["evals"]
        args.evals_json.write_text(json.dumps(args.evals, indent=1) + "\n", encoding="utf-8")
    return s, wall_s


def run_row(args: argparse.Namespace, run: str, changes: list[str], budget: float, engine: str = "catchat",
            extra: tuple[str, ...] = ()) -> tuple[dict, float]:
    """Train one run at `budget` and print its row; (its summary, its wall clock)."""
    return print_row(args, run, changes, train_run(args, run, changes, budget, engine, extra), engine)


def screen_then_confirm(args: argparse.Namespace) -> None:
    """Every variant at --screen-steps steps, a row each, then the --confirm with the lowest held-out
    loss (ties, and runs without an eval: the order given) at --budget, a row each."""
    steps = args.screen_steps
    screen = ("train.time_budget_s=0", "train.cycles=0", f"train.total_steps={steps}")
    ranked = []
    for i, text in enumerate(args.variants):
        name, changes = parse_variant(text)
        loss = run_row(args, f"{name}-{steps}steps", changes, 0, extra=screen)[0]["loss"]
        ranked.append((loss if math.isfinite(loss) else math.inf, i, name, changes))
    for _, _, name, changes in sorted(ranked)[:args.confirm]:
        run_row(args, name, changes, args.budget)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print("| variant | changes | steps | train tok/s | held-out nats/char | wall s |")
    print("|---|---|---|---|---|---|")
    if args.screen_steps:
        screen_then_confirm(args)
        return
    variants = [(engine, name, changes, seed_runs(name, changes, args.seeds))
                for engine, texts in (("catchat", args.variants), ("torch", args.torch_variants))
                for name, changes in map(parse_variant, texts)]
    # run names are distinct (parse_args); with --jobs 1 one after another, in order
    with mps_service(args.mps):
        run_table(args, variants)


def run_table(args: argparse.Namespace, variants: list) -> None:
    """Every run queued at once, up to --jobs at a time; the rows printed in the order given."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
    try:
        walls = {run: pool.submit(train_run, args, run, run_changes, args.budget, engine)
                 for engine, _, _, runs in variants for run, run_changes in runs}
        for engine, name, changes, runs in variants:
            rows = [print_row(args, run, run_changes, walls[run].result(), engine) for run, run_changes in runs]
            if args.seeds:
                print(format_seeds_row(name, changes, rows, engine), flush=True)
    finally:  # a failed run ends the table: the runs not started yet are dropped
        pool.shutdown(wait=True, cancel_futures=True)


if __name__ == "__main__":
    main()
