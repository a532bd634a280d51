"""What a person sees while training: a rich progress bar (loss, tokens/s, lr, ETA) and event lines.

Without a terminal (CI, a pipe) the bar is replaced by a plain line about every 5% of the run.
Each eval prints a teacher-forced line and (eval.free_running) a free-running line; the first
free-running line is followed by FREE_RUNNING_NOTE, what it measures and why it can rise early.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

# Printed under the first free-running eval line; what Program.eval_window(free_running=True) does.
FREE_RUNNING_NOTE = (
    "[dim]free-running = the model fed its own argmax predictions as inputs instead of the true text (the text "
    "only at each window's first character and at conversation starts), scored against the text: its mistakes "
    "compound, so this loss can rise early, even above ln 101 = 4.62 (a uniform guess), before it falls while "
    "the model learns to stay on track; the teacher-forced loss is the one that should fall from the start.[/dim]")


class TrainReporter:
    """Callable reporter for catchat.train.Trainer (`reporter(kind, **fields)`)."""

    def __init__(self, console: Console):
        self.console = console
        self.live = console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), console=console,
            disable=not self.live)
        self.task = None
        self.loss_ema = None
        self.last_plain = 0.0
        self.free_running_explained = False

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def _print(self, text: str):
        self.console.print(text, highlight=False)

    def __call__(self, kind: str, **f):
        handler = getattr(self, f"on_{kind}", None)
        if handler:
            handler(**f)

    def on_corpus(self, lines, **_):
        for line in lines:
            self.console.print(line, markup=False, highlight=False)

    def on_start(self, total_steps, lanes=(), schedule=None, **_):
        for line in lanes:
            self.console.print(line, markup=False, highlight=False)
        budget = (schedule or {}).get("time_budget_s")
        if budget:
            cap = f", at most {total_steps} steps" if total_steps else ""
            self._print(f"training for {budget:g} s of wall-clock time (start-up included{cap})")
        else:
            self._print(f"training for {total_steps} steps")

    def on_time_budget(self, time_budget_s, elapsed_s, training_s, eval_estimate_s, checkpoint_estimate_s, **_):
        self._print(f"time budget {time_budget_s:g} s: {elapsed_s:.1f} s used so far, {max(training_s, 0):.1f} s to "
                    f"train, then a checkpoint (~{checkpoint_estimate_s:.1f} s) and an eval (~{eval_estimate_s:.1f} s)")

    def on_resume(self, global_step, seqs, **f):
        self._print(f"resumed at step {global_step} ({seqs} seqs) from {f.get('from')}")
        if f.get("dropped_rows"):
            self._print(f"{f['dropped_rows']} metrics rows logged after that checkpoint will be logged again")
        for side in f.get("finished_branches", ()):
            self._print(f"finished a branch a stopped process had begun: {side}")

    def on_branch(self, branch_step, abandoned_step, side_dir, abandoned_checkpoints=(), **_):
        what = f"{len(abandoned_checkpoints)} newer checkpoints and the rows up to step {abandoned_step}"
        self._print(f"[yellow]branch[/yellow] at step {branch_step}: {what} moved to {side_dir}"
                    if branch_step >= 0
                    else f"[yellow]fresh start[/yellow]: an earlier attempt's rows moved to {side_dir}")

    def on_warning(self, text, **_):
        self.console.print(text, markup=False, highlight=False)

    def on_step(self, stats, lr, global_step, total_steps, tokens_per_s, tf=1.0, **_):
        if not stats.skipped:
            self.loss_ema = stats.loss if self.loss_ema is None else 0.9 * self.loss_ema + 0.1 * stats.loss
        info = f"loss {self.loss_ema or float('nan'):.3f}  {tokens_per_s:,.0f} tok/s  lr {lr:.2e}"
        if tf < 1.0:
            info += f"  tf {tf:.2f}"
        if self.task is None:
            self.task = self.progress.add_task("train", total=total_steps, completed=global_step - 1, info=info)
        self.progress.update(self.task, total=total_steps, completed=global_step, info=info)  # a budget's total moves
        if not self.live and (global_step == total_steps or time.monotonic() - self.last_plain > 10
                              or global_step % max(1, total_steps // 20) == 0):
            self.last_plain = time.monotonic()
            self._print(f"step {global_step}/{total_steps}  {info}")

    def on_eval(self, global_step, loss, bpc, top1, top5, free_running=None, **_):
        self._print(f"[cyan]eval[/cyan] step {global_step}: teacher-forced loss {loss:.4f} nats/char, "
                    f"{bpc:.3f} bits/char, top-1 {top1:.1%}, top-5 {top5:.1%}")
        if free_running:
            f = free_running
            self._print(f"[cyan]eval[/cyan] step {global_step}: free-running   loss {f['loss']:.4f} nats/char, "
                        f"{f['bpc']:.3f} bits/char, top-1 {f['top1']:.1%}, top-5 {f['top5']:.1%} "
                        "(fed its own argmax)")
            if not self.free_running_explained:
                self.free_running_explained = True
                self._print(FREE_RUNNING_NOTE)

    def on_checkpoint(self, path, reason, **_):
        self._print(f"[green]checkpoint[/green] {path} ({reason})")

    def on_skipped_step(self, global_step, reason, **_):
        self._print(f"[yellow]skipped step {global_step}[/yellow]: {reason}")

    def on_faults(self, faults, **_):
        self._print(f"[yellow]fault injection ($CATCHAT_FAULT)[/yellow]: {', '.join(faults)}")

    def on_stopping(self, signal, **_):
        self._print(f"[yellow]{signal}[/yellow]: finishing this step, then writing a checkpoint "
                    "(press Ctrl-C again to stop at once)")

    def on_end(self, global_step, reason, time_budget_s=None, elapsed_s=None, **_):
        spent = f" after {elapsed_s:.1f} s of the {time_budget_s:g} s budget" if time_budget_s and elapsed_s else ""
        self._print(f"run ended at step {global_step}: {reason}{spent}")
