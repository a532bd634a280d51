"""TensorBoard event files of a run, in RUN/tensorboard/, written beside metrics.csv and events.jsonl.

Rank 0's `Telemetry` (catchat/training/telemetry.py) hands every metrics row and event to a
`RunBoard` as well, which writes them through tensorboardX (an optional extra: `pip install
'catchat[live]'`), when the run's config says `log.tensorboard = true` (the default):

    train/loss, train/lr, train/grad_norm, train/tokens_per_s, train/teacher_forcing   every step
    train/loss_scale                                     every step of an fp16 run
    eval/loss, eval/bpc, eval/top1, eval/top5            each eval, teacher-forced
    eval/free_running/loss, .../bpc, .../top1, .../top5  each eval with eval.free_running
    samples (text)                                       each eval: samples/step-N.txt, when written
    weights/<tensor> (histograms)                        each checkpoint: its model.safetensors
    run/config (text)                                    each start or resume: the resolved config.toml
    run/events (text)                                    start, resume, branch, skipped steps, end

Values are the metrics.csv cells as written (so TensorBoard and the CSV agree to float32); a
non-finite value (a skipped step's loss) is left out. The x axis is global_step.

Files. Each process that trains the run writes one file of its own,
`events.out.tfevents.NNNNN.step-SSSSSSS.catchat` (NNNNN: the next number in the directory, so the
files sort in the order they were written, which is how TensorBoard reads them; SSSSSSS: the step
the process started from). tensorboardX's own SummaryWriter names files by the second and host,
so two processes within one second would write the same name (`open(..., "wb")` truncates), and
it writes from a queue thread that a crash loses; here records are written synchronously and
flushed at each eval, checkpoint and end, and at least every FLUSH_EVERY_S.

Resumes. Each file begins with a SessionLog START at the first step it may write (0 for a fresh
start, N + 1 for a resume from checkpoint N): TensorBoard's reader then drops whatever earlier
files hold from that step on (a crash tail or an abandoned branch, which metrics.csv drops too),
so the curves show the run's live history once. Nothing here touches the model: a resume stays
bitwise.

Failures. No error here stops training: the first one is reported in one warning line and the
board is off for the rest of the process.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import numpy as np

TENSORBOARD_DIR = "tensorboard"
FLUSH_EVERY_S = 5.0  # a live TensorBoard sees new steps within seconds; flushing costs an fsync
HISTOGRAM_BINS = 64
INSTALL_HINT = "pip install tensorboardX (in a checkout: .venv/bin/pip install 'catchat[live]')"
ROW_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
            "tokens_per_s": "train/tokens_per_s", "tf": "train/teacher_forcing"}
SCORES = ("loss", "bpc", "top1", "top5")
TEXT_EVENTS = ("start", "resume", "branch", "skipped_step", "end")  # run/events: one line each
_FILE_NUMBER = re.compile(r"^events\.out\.tfevents\.(\d+)\.")


def import_tensorboardx():
    """tensorboardX's summary builders, event proto and record writer (ImportError without it)."""
    from tensorboardX import record_writer, summary
    from tensorboardX.proto import event_pb2

    return summary, event_pb2, record_writer


class EventFile:
    """One process's event file: Summary protos wrapped in Events, written as TFRecords."""

    def __init__(self, directory: Path, start_step: int, purge_from_step: int):
        self.summary, self.event_pb2, record_writer = import_tensorboardx()
        directory.mkdir(exist_ok=True)
        numbers = [int(m.group(1)) for p in directory.iterdir() if (m := _FILE_NUMBER.match(p.name))]
        self.path = directory / f"events.out.tfevents.{max(numbers, default=0) + 1:05d}.step-{start_step:07d}.catchat"
        self.writer = record_writer.RecordWriter(str(self.path))
        self.last_flush = time.monotonic()
        self._write(self.event_pb2.Event(wall_time=time.time(), step=purge_from_step, file_version="brain.Event:2"))
        start = self.event_pb2.SessionLog(status=self.event_pb2.SessionLog.START)
        self._write(self.event_pb2.Event(wall_time=time.time(), step=purge_from_step, session_log=start))

    def _write(self, event) -> None:
        self.writer.write(event.SerializeToString())

    def add(self, step: int, summary) -> None:
        self._write(self.event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """One Event of every finite value (tag -> value)."""
        Summary = self.summary.Summary
        kept = [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in values.items() if math.isfinite(v)]
        if kept:
            self.add(step, Summary(value=kept))

    def text(self, step: int, tag: str, markdown: str) -> None:
        self.add(step, self.summary.text(tag, markdown))

    def histograms(self, step: int, tensors: dict[str, np.ndarray]) -> None:
        for name, values in sorted(tensors.items()):
            if (proto := histogram_of(values)) is not None:
                self.add(step, self.summary.histogram_raw(f"weights/{name}", **proto))

    def flush(self) -> None:
        self.writer.flush()
        self.last_flush = time.monotonic()

    def flush_now_and_then(self) -> None:
        if time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
            self.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class RunBoard:
    """What Telemetry hands its rows and events to. Off until a start or resume event opens it (the
    run's config.toml is written by then and says whether to); `warn(text)` says why it is off."""

    def __init__(self, run_root: Path, warn):
        self.root, self.warn = Path(run_root), warn
        self.file: EventFile | None = None
        self.fp16 = False
        self.failed = False

    @property
    def directory(self) -> Path:
        return self.root / TENSORBOARD_DIR

    def event(self, rec: dict) -> None:
        """An event as events.jsonl has it (`event`, `global_step`, its fields). Never raises."""
        self._guarded(self._event, rec)

    def row(self, cells: dict[str, str]) -> None:
        """A metrics.csv row as written: column -> cell text. Never raises."""
        if self.file is not None:
            self._guarded(self._row, cells)

    def close(self) -> None:
        if self.file is not None:
            self._guarded(self.file.close)
            self.file = None

    # ------------------------------------------------------------------ behind the guard
    def _guarded(self, work, *args) -> None:
        """Run `work`; an error turns the board off with one line (training must not stop for it)."""
        if self.failed:
            return
        try:
            work(*args)
        except Exception as exc:  # noqa: BLE001 (any failure of an optional writer: disk, protobuf, a bug)
            self.failed = True
            where = self.file.path if self.file is not None else self.directory
            self.warn(f"warning: TensorBoard logging stopped ({type(exc).__name__}: {exc}) writing {where}; "
                      "training goes on, metrics.csv and events.jsonl have everything")
            try:
                if self.file is not None:
                    self.file.writer.close()
            except Exception:  # noqa: BLE001 (already reported: the first error is the one that matters)
                pass
            self.file = None

    def _event(self, rec: dict) -> None:
        kind, step = rec["event"], rec["global_step"]
        if kind in ("start", "resume"):
            self._open(kind, step)
        if self.file is None:
            return
        if kind in TEXT_EVENTS:
            self.file.text(step, "run/events", f"`{kind}` at step {step}: {_describe(rec)}")
        if kind == "eval":
            self._eval(rec, step)
        elif kind == "checkpoint":
            self._checkpoint(rec, step)
        elif kind == "end":
            self.file.flush()

    def _open(self, kind: str, step: int) -> None:
        from catchat import config as cfgmod

        self.close()
        cfg_path = self.root / "config.toml"  # written by the start (catchat/training/start.py) before its event
        cfg = cfgmod.load(cfg_path)
        if not cfg.log.tensorboard:
            return
        try:
            import_tensorboardx()
        except ImportError:
            self.warn(f"TensorBoard logging is off: tensorboardX is not installed. To turn it on: {INSTALL_HINT}; "
                      "to silence this: log.tensorboard = false")
            self.failed = True  # said once: nothing more to try in this process
            return
        self.fp16 = cfg.train.precision == "fp16"
        purge_from = 0 if kind == "start" else step + 1
        self.file = EventFile(self.directory, step, purge_from)
        self.file.text(step, "run/config", _code_block(cfg_path.read_text()))

    def _row(self, cells: dict[str, str]) -> None:
        values = {tag: _number(cells.get(col, "")) for col, tag in ROW_TAGS.items()}
        if self.fp16:
            values["train/loss_scale"] = _number(cells.get("loss_scale", ""))
        self.file.scalars(int(cells["global_step"]), values)
        self.file.flush_now_and_then()

    def _eval(self, rec: dict, step: int) -> None:
        values = {f"eval/{k}": _number(rec.get(k)) for k in SCORES}
        free = rec.get("free_running")
        if isinstance(free, dict):
            values.update({f"eval/free_running/{k}": _number(free.get(k)) for k in SCORES})
        self.file.scalars(step, values)
        samples = self.root / "samples" / f"step-{step:07d}.txt"  # catchat/training/evals.py writes it first
        if samples.is_file():
            self.file.text(step, "samples", _code_block(samples.read_text(errors="replace")))
        self.file.flush()

    def _checkpoint(self, rec: dict, step: int) -> None:
        from catchat.run import checkpoint as ck
        from catchat.run import tensorfile

        tensors, _ = tensorfile.read(Path(rec["path"]) / ck.MODEL_FILE)
        self.file.histograms(step, tensors)
        self.file.flush()


def histogram_of(values: np.ndarray) -> dict | None:
    """histogram_raw's fields for the finite values (None when there are none), computed in the
    tensor's own float32: tensorboardX's `histogram` copies to float64 first, which made a 76 M
    parameter checkpoint cost ~8 s on the training thread instead of ~2 s. The layout is its
    make_histogram's: an empty bucket first, then HISTOGRAM_BINS buckets whose right edges are the
    limits (TensorBoard reads each bucket as ending at its limit)."""
    flat = values.reshape(-1)
    if not np.isfinite(flat).all():
        flat = flat[np.isfinite(flat)]
    if flat.size == 0:
        return None
    counts, limits = np.histogram(flat, bins=HISTOGRAM_BINS)
    return dict(min=float(flat.min()), max=float(flat.max()), num=int(flat.size),
                sum=float(np.sum(flat, dtype=np.float64)), sum_squares=float(np.dot(flat, flat)),
                bucket_limits=limits.tolist(), bucket_counts=[0, *counts.tolist()])


def _number(value) -> float:
    """A cell or field as a float; nan for an empty cell or anything that is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _code_block(text: str) -> str:
    """Text shown verbatim by TensorBoard's markdown: every line indented four spaces (a fence
    would end at the first ``` the text itself holds)."""
    return "\n".join("    " + line for line in text.splitlines())


def _describe(rec: dict) -> str:
    """The fields of an event worth a line in run/events."""
    keys = ("reason", "from", "side_dir", "total_steps", "seqs", "skipped_steps", "applied_steps")
    return ", ".join(f"{k} {rec[k]}" for k in keys if rec.get(k) is not None) or "-"
