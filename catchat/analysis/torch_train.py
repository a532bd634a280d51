"""The speedrun's PyTorch row: catchat's model and recipe trained in PyTorch (issue 36 item 3).

    python -m catchat.analysis.torch_train CONFIG [--run-dir D] [--time-budget S] [--set K=V ...]
                                           [--device auto|cuda|cpu] [--amp auto|bf16|off]

(`python tools/speedrun.py --torch NAME[:CHANGES]` runs it as a row beside catchat's; docs/speedrun.md.)
torch is imported only when a run starts; it is no dependency of catchat.

The same as `catchat train CONFIG` (the same config and `--set`s, `--time-budget` applied first as there):
- data: catchat's own corpus loading, vocabulary, train/held-out split, lanes (data.lane_order) and
  per-step windows (`catchat.training.feed.Feed`: resets where a conversation starts, prefix dropout),
  the state carried across windows (data.carry_state), micro-batches;
- the model's arithmetic and initial weights (`catchat.model.init_params(train.seed)`, loaded into torch),
  dropout masks, loss, clipping, skips and the optimizer (catchat/analysis/torch_program.py says how);
- the schedule: `lr_at` over the planned steps, or with a time budget catchat's own pace
  (`catchat.training.budget.TimeBudget`: the clock from the process's start, the eval probe, the reserve
  for the final save and eval, each step's progress and the last step at lr_min);
- evals: the held-out split's lanes in corpus order (eval.eval_windows, 0 = all), at every crossing of
  eval.eval_every_seqs and at the end, with the eval's three samples of eval.sample_chars;
- the run directory's config.toml, metrics.csv and events.jsonl in catchat's formats (what
  tools/speedrun.py's summary, `catchat plot` and `catchat scan` read), and a final model.safetensors
  in catchat's names (catchat/run/tensorfile.py).

What differs, plainly: autocast bf16 (train.precision = "fp16" on CUDA; catchat rounds GEMM operands to
float16 and keeps the state float32, torch's GRU returns its state in bf16), NAdam without a fused kernel
(foreach), torch's sampler for the samples, and evals in float32 where catchat's run at the training
precision. Refused (no cuDNN equivalent or not in the recipe): train.gradh_clamp, train.spectral_bound,
teacher forcing below 1. Not done: free-running evals (eval.free_running is skipped, with a note),
checkpoints along the way and resume (the final weights only), data parallelism.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from catchat import config as cfgmod
from catchat.data import vocab
from catchat.data.lanes import Lanes
from catchat.data.lanes import n_valid as count_valid
from catchat.errors import CatchatError, UsageError
from catchat.fsutil import append_line
from catchat.model import ParamLayout, init_params
from catchat.model.reference import dropout_scales
from catchat.rng import step_seed
from catchat.run.runlog import WRITTEN_COLUMNS
from catchat.run.schedule import interval_crossed
from catchat.training.evals import Evals, eval_lanes
from catchat.training.feed import Feed
from catchat.training.start import plan_info
from catchat.training.step import step_lr
from catchat.training.telemetry import event_record, metrics_values

REFUSED = (("train.gradh_clamp", lambda c: c.train.gradh_clamp > 0, "cuDNN's GRU has no per-timestep gradient hook"),
           ("train.spectral_bound", lambda c: c.train.spectral_bound > 0, "not part of the recipe mirrored"),
           ("teacher_forcing", lambda c: c.teacher_forcing.start < 1 or (c.teacher_forcing.schedule != "constant"
                                                                         and c.teacher_forcing.floor < 1),
            "scheduled sampling is catchat's per-timestep path"))


def refusals(cfg: cfgmod.Config) -> list[str]:
    """Why this config cannot be trained the same in PyTorch (empty: it can)."""
    return [f"{key}: {why}" for key, refused, why in REFUSED if refused(cfg)]


def amp_for(cfg: cfgmod.Config, device: str, amp: str) -> bool:
    """autocast bf16 or not: "auto" is bf16 where catchat trains at fp16 on a CUDA device."""
    if amp == "bf16" and device != "cuda":
        raise UsageError("--amp bf16 runs on CUDA only", "use --amp off on the CPU")
    return amp == "bf16" or (amp == "auto" and device == "cuda" and cfg.train.precision == "fp16")


class MaskedFeed(Feed):
    """catchat's Feed, each micro-batch with its dropout masks (made ahead with the data)."""

    def __init__(self, lanes: Lanes, cfg: cfgmod.Config, layout: ParamLayout):
        super().__init__(lanes, cfg)
        self.layout = layout

    def step_data(self, cursor, global_step: int):
        t = self.cfg.train
        batches, after = super().step_data(cursor, global_step)
        return [(tok, tg, rs, *dropout_scales(self.layout.spec, self.lanes.B, step_seed(t.seed, global_step, k),
                                              t.dropout_embedding, t.dropout_hidden))
                for k, (tok, tg, rs) in enumerate(batches)], after


class RunLog:
    """events.jsonl and metrics.csv in catchat's formats (catchat/run/runlog.py reads them)."""

    def __init__(self, root: Path, state, clock, tokens_per_step: int, echo=None):
        self.root, self.state, self.clock, self.tokens_per_step = root, state, clock, tokens_per_step
        self.echo = echo or (lambda line: None)
        self.metrics = root / "metrics.csv"
        self.metrics.write_text(",".join(WRITTEN_COLUMNS) + "\n")
        self.step_s: list[float] = []

    def event(self, kind: str, **fields) -> None:
        rec = event_record(self.state, kind, **fields)
        append_line(self.root / "events.jsonl", json.dumps(rec))
        if kind in ("eval", "end", "time_budget"):
            shown = {k: v for k, v in rec.items() if k in ("loss", "reason", "training_s", "elapsed_s", "windows")}
            self.echo(f"{kind} at step {rec['global_step']}: {shown}")

    def row(self, st: dict, lr: float, valid: int, seconds: float, progress: float) -> None:
        """catchat's row (telemetry.metrics_values): teacher forcing 1, no clamp, no loss scale."""
        self.step_s.append(seconds)
        row = metrics_values(self.state, self.tokens_per_step, WRITTEN_COLUMNS, lr=lr, tf=1.0, loss=st["loss"],
                             n_valid=valid, skipped=st["skipped"], grad_norm=st["grad_norm"], clipped=st["clipped"],
                             valid=valid, seconds=seconds, clamp_hits=0, elapsed_s=self.clock.now(),
                             progress=progress, loss_scale=1.0)
        append_line(self.metrics, ",".join(map(str, row)))


class TorchEvals:
    """What catchat's Evals gives the loop and the budget's probe (`prog`, `lanes`, `sample_texts`, `run`)."""

    def __init__(self, prog, lanes: Lanes | None, cfg: cfgmod.Config, samples: Path, pace, log: RunLog):
        self.prog, self.lanes, self.cfg, self.samples, self.pace, self.log = prog, lanes, cfg, samples, pace, log

    def sample_texts(self, chars: int) -> list[str]:
        return [f"=== {label} (seed {seed}) ===\n{self.prog.sample(chars, temp, seed)}\n"
                for label, temp, seed in Evals.SAMPLE_SETTINGS]

    def run(self, state) -> dict | None:
        from catchat.inference.evaluate import evaluate_lanes

        started = time.perf_counter()
        state.last_eval_step = state.global_step
        if self.cfg.eval.sample_chars > 0:
            self.samples.mkdir(exist_ok=True)
            text = "\n".join(self.sample_texts(self.cfg.eval.sample_chars))
            (self.samples / f"step-{state.global_step:07d}.txt").write_text(text)
        if self.lanes is None or self.lanes.windows_per_cycle == 0:
            return None
        res = evaluate_lanes(self.prog, self.lanes, self.cfg.eval.eval_windows)
        self.pace.add_eval(time.perf_counter() - started)
        self.log.event("eval", seqs=state.cursor.seqs, tokens=state.global_step * self.log.tokens_per_step, tf=1.0,
                       **res)
        return res


def save_weights(prog, layout: ParamLayout, path: Path) -> float:
    """The final weights as model.safetensors in catchat's names; the seconds it took."""
    from catchat.run import tensorfile

    started = time.perf_counter()
    tensorfile.write(path, layout.unflatten(prog.get_params()), {"written_by": "catchat.analysis.torch_train"})
    return time.perf_counter() - started


def train(cfg: cfgmod.Config, run_dir: Path, *, device: str = "cpu", amp: bool = False, clock_origin=None,
          echo=None, dtype=None) -> str:
    """Train `cfg` in PyTorch into run_dir (which must hold no run); returns why the run ended."""
    bad = refusals(cfg)
    if bad:
        raise UsageError("this config cannot be trained the same in PyTorch: " + "; ".join(bad),
                         "set the keys named to their defaults (off)")
    import torch

    from catchat.analysis.torch_program import TorchProgram
    from catchat.data.corpus import open_corpus
    from catchat.run.budget import Clock
    from catchat.training.budget import make_pace
    from catchat.training.state import RunState

    torch.backends.cuda.matmul.allow_tf32 = False  # evals in float32; autocast's bf16 is unaffected
    torch.backends.cudnn.allow_tf32 = False
    clock = Clock(0.0, clock_origin)
    notes = ["eval.free_running skipped: the PyTorch row scores teacher-forced"] if cfg.eval.free_running else []
    cfg = cfgmod.with_changes(cfg, eval={"free_running": False})  # what it runs (and the budget's eval probe times)
    corpus = open_corpus(cfg.data.corpus)
    lanes = Lanes.from_config(corpus, cfg, "train")
    held = eval_lanes(corpus, cfg)
    total_steps = cfgmod.planned_total_steps(cfg, lanes.seqs_per_cycle)
    layout = ParamLayout(cfgmod.model_spec(cfg, vocab.VOCAB_SIZE))
    prog = TorchProgram(cfg, layout, cfg.data.batch_lanes, device, amp=amp, dtype=dtype)
    prog.set_params(layout.flatten(init_params(layout.spec, cfg.train.seed)))
    state = RunState(cursor=lanes.start())
    pace = make_pace(cfg, total_steps, None, clock, layout)
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / "events.jsonl").exists():
        raise UsageError(f"{run_dir} already holds a run", "choose another --run-dir or remove it")
    (run_dir / "config.toml").write_text(cfgmod.resolved_toml(cfg, "trained by catchat.analysis.torch_train"))
    tokens_per_step = cfgmod.seqs_per_step(cfg) * cfg.data.window
    log = RunLog(run_dir, state, clock, tokens_per_step, echo)
    evals = TorchEvals(prog, held, cfg, run_dir / "samples", pace, log)
    log.event("start", engine="torch", torch=torch.__version__, device=str(prog.dev), amp="bf16" if amp else "off",
              total_steps=total_steps, lanes=lanes.describe(), notes=notes, model=cfgmod.to_dict(cfg)["model"],
              startup_s=round(clock.now(), 3),
              **plan_info(cfg, pace, total_steps, tokens_per_step, lanes.seqs_per_cycle))
    reason = _loop(cfg, state, pace, prog, MaskedFeed(lanes, cfg, layout), evals, log, total_steps)
    pace.add_checkpoint(save_weights(prog, layout, run_dir / "model.safetensors"))
    if reason == "done" and held is not None and state.last_eval_step != state.global_step:
        evals.run(state)
    steps = log.step_s
    log.event("end", reason=reason, applied_steps=state.applied_steps,
              skipped_steps=state.global_step - state.applied_steps,
              median_step_s=round(statistics.median(steps), 6) if steps else None, **pace.end_fields())
    return reason


def _loop(cfg, state, pace, prog, feed: MaskedFeed, evals: TorchEvals, log: RunLog, total_steps: int) -> str:
    """Trainer.run's loop: steps until the pace says done (or too many skips), evals at their crossings."""
    if not pace.finished(state.global_step) and not pace.start(evals, log):
        return "time budget spent before training"
    while not pace.finished(state.global_step):
        if state.consecutive_skips >= cfg.train.max_consecutive_skips:
            return f"stopped: {state.consecutive_skips} consecutive skipped steps"
        decision = pace.next_step(state)
        began = time.perf_counter()
        batches, after_cursor = feed.take(state.cursor, state.global_step)
        lr, progress = step_lr(decision, state.global_step, total_steps, cfg)
        valid = sum(count_valid(b[1]) for b in batches)
        nxt = state.global_step + 1
        st = prog.train_step(batches, lr=lr, n_valid=valid,
                             while_running=lambda c=after_cursor, n=nxt: feed.prepare_next(c, n))
        prev_seqs = state.cursor.seqs
        state.cursor, state.global_step = after_cursor, nxt
        if st["skipped"]:
            state.consecutive_skips += 1
            log.event("skipped_step", reason="non-finite gradient norm or no valid targets",
                      consecutive=state.consecutive_skips)
        else:
            state.applied_steps += 1
            state.consecutive_skips = 0
        seconds = time.perf_counter() - began
        log.row(st, lr, valid, seconds, progress)
        pace.took(decision, seconds)
        if interval_crossed(prev_seqs, state.cursor.seqs, cfg.eval.eval_every_seqs):
            evals.run(state)
    return "done"


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"torch {torch.__version__} sees no CUDA device", "use --device cpu, or a CUDA build of torch")
    return device


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m catchat.analysis.torch_train",
                                 description="catchat's model and recipe trained in PyTorch (the speedrun's row)")
    ap.add_argument("config")
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/<config name>-torch")
    ap.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                    help="as catchat train's: sets train.time_budget_s, total_steps = cycles = 0, before the --sets")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto",
                    help="auto: bf16 on CUDA where train.precision is fp16")
    args = ap.parse_args(argv)
    if args.time_budget is not None and not args.time_budget > 0:
        ap.error("--time-budget must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    from catchat.run.budget import process_start

    origin = process_start()  # the budget counts from the process's start, as catchat train's
    args = parse_args(argv)
    try:
        try:
            import torch  # noqa: F401
        except ImportError as e:
            raise UsageError(f"torch is not importable ({e})", "pip install torch (a CUDA build for the GPU)") from None
        cfg = cfgmod.load(args.config, cfgmod.budget_overrides(args.time_budget, args.overrides))
        device = resolve_device(args.device)
        run_dir = args.run_dir or Path("runs") / f"{Path(args.config).stem}-torch"
        reason = train(cfg, run_dir, device=device, amp=amp_for(cfg, device, args.amp), clock_origin=origin,
                       echo=lambda line: print(line, flush=True))
    except CatchatError as e:
        print(f"error: {e.message}" + (f"\n  fix: {e.hint}" if e.hint else ""), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted: no final weights, no final eval", file=sys.stderr)
        return 130
    return 0 if reason == "done" or reason.startswith("time budget") else 1


if __name__ == "__main__":
    sys.exit(main())
