"""What a person sees while training: a rich progress bar (loss, tokens/s, lr, ETA) and event lines.

The loss shown is the step's own, then the mean of the last AVERAGE_STEPS applied steps, labelled
with how many it holds (`loss 3.137 (avg100 3.200)`); a resume seeds that mean from the rows
metrics.csv already has, so it goes on where the run was rather than starting again.
Without a terminal (CI, a pipe, a log file) the bar is replaced by a plain line at the first and last
step, at every 5% of the run and at least every 30 s (catchat.progress.plain_line_due): step/total, loss, tokens/s, lr,
the time this process has trained and the ETA at its pace.
Each eval prints a teacher-forced line and (eval.free_running) a free-running line; the first
free-running line is followed by FREE_RUNNING_NOTE, what it measures and why it can rise early.
"""

from __future__ import annotations

import math
import time
from collections import deque

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from catchat.progress import clock, plain_line_due

AVERAGE_STEPS = 100  # applied steps in the running mean of the loss
PLAIN_SHARE = 20  # a piped log gets a line every 1/PLAIN_SHARE of the run, and at least every
# catchat.progress.PLAIN_EVERY_S (30 s: a days-long run, ~3k lines a day)

# Printed under the first free-running eval line; what Program.eval_window(free_running=True) does.
FREE_RUNNING_NOTE = (
    "[dim]free-running = the model fed its own argmax predictions as inputs instead of the true text (the text "
    "only at each window's first character and at conversation starts), scored against the text: its mistakes "
    "compound, so this loss can rise early, even above ln 101 = 4.62 (a uniform guess), and falls only once "
    "the model stays on track over many characters (not within a run as short as the demo); the teacher-forced "
    "loss is the one that should fall from the start.[/dim]")


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
        self.losses: deque[float] = deque(maxlen=AVERAGE_STEPS)  # the last applied steps' losses
        self.last_plain = 0.0
        self.last_plain_step = 0
        self.first_step: tuple[int, float] | None = None  # (step before this process's first, when it began)
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

    def on_plan_change(self, global_step, changes, schedule=None, **_):
        """A resume that changes the run's plan: each key old -> new, then where the schedule moved."""
        from catchat.training.plan import BY_CONFIG_FILE, shown

        for key, c in changes.items():
            by = " (from the edited config file)" if c.get("by") == BY_CONFIG_FILE else ""
            self._print(f"[yellow]changed:[/yellow] {key} {shown(c.get('old'))} -> {shown(c.get('new'))}{by}")
        total, lr = (schedule or {}).get("total_steps"), (schedule or {}).get("lr_next")
        words = []
        if total:
            words.append(f"{total['new']} planned steps (were {total['old']})")
        if lr and isinstance(lr.get("new"), float):
            words.append(f"the next step's lr {lr['new']:.2e}" + (f" (was {lr['old']:.2e})"
                                                                  if isinstance(lr.get("old"), float) else ""))
        if words:
            self._print(f"schedule from step {global_step}: " + "; ".join(words)
                        + " (docs/training.md, changing the plan)")
        if total and isinstance(total.get("new"), int) and 0 < total["new"] <= global_step:
            self._print(f"[yellow]the run has taken its {total['new']} planned steps: it ends without another[/yellow]")

    def on_branch(self, branch_step, abandoned_step, side_dir, abandoned_checkpoints=(), **_):
        what = f"{len(abandoned_checkpoints)} newer checkpoints and the rows up to step {abandoned_step}"
        self._print(f"[yellow]branch[/yellow] at step {branch_step}: {what} moved to {side_dir}"
                    if branch_step >= 0
                    else f"[yellow]fresh start[/yellow]: an earlier attempt's rows moved to {side_dir}")

    def on_metrics_gap(self, note, **_):
        """Rows cut from metrics.csv outside catchat: on stderr, where a person or a log watcher looks for
        what went wrong, not between the progress lines."""
        from catchat.console import make_console

        make_console(stderr=True).print(f"warning: {note}", markup=False, highlight=False, soft_wrap=True)

    def on_warning(self, text, **_):
        self.console.print(text, markup=False, highlight=False)

    def on_history(self, metrics, **_):
        """A resume: the running mean goes on from the losses the run's metrics.csv already holds."""
        from catchat.run.runlog import recent_losses

        self.losses.extend(recent_losses(metrics, AVERAGE_STEPS))

    def on_step(self, stats, lr, global_step, total_steps, tokens_per_s, tf=1.0, seconds=0.0, **_):
        now = time.monotonic()
        if self.first_step is None:
            self.first_step = (global_step - 1, now - seconds)
        if not stats.skipped and math.isfinite(stats.loss):
            self.losses.append(stats.loss)
        info = f"{self._loss_text(stats)}  {tokens_per_s:,.0f} tok/s  lr {lr:.2e}"
        if tf < 1.0:
            info += f"  tf {tf:.2f}"
        if self.task is None:
            self.task = self.progress.add_task("train", total=total_steps, completed=global_step - 1, info=info)
        self.progress.update(self.task, total=total_steps, completed=global_step, info=info)  # a budget's total moves
        if not self.live and (global_step == self.first_step[0] + 1 or plain_line_due(
                global_step, total_steps, self.last_plain_step, self.last_plain, now, PLAIN_SHARE)):
            self.last_plain, self.last_plain_step = now, global_step
            self._print(f"step {global_step}/{total_steps}  {info}  {self._times(global_step, total_steps, now)}")

    def _loss_text(self, stats) -> str:
        """'loss 3.137 (avg100 3.200)': the step's loss, then the running mean and how many steps it holds."""
        own = "skipped" if stats.skipped else f"{stats.loss:.3f}"
        if not self.losses:
            return f"loss {own}"
        return f"loss {own} (avg{len(self.losses)} {sum(self.losses) / len(self.losses):.3f})"

    def _times(self, global_step: int, total_steps: int, now: float) -> str:
        """'elapsed 0:01:05  eta 0:02:10': this process's training time, and the rest of the run at its pace."""
        before, began = self.first_step
        elapsed = now - began
        done, left = global_step - before, max(0, total_steps - global_step)
        eta = clock(elapsed / done * left, hours=True) if done > 0 and elapsed > 0 else "?"
        return f"elapsed {clock(elapsed, hours=True)}  eta {eta}"

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

