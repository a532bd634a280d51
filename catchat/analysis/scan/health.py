"""Checks of the training's health: the running loss, grad-norm spikes, throughput drops, memory growth."""

from __future__ import annotations

import math
import statistics

from catchat.analysis.scan.report import FAIL, MAX_STEPS, OK, WARN, Finding, steps_text
from catchat.analysis.scan.timeline import Row, Segment, Segments
from catchat.data.vocab import VOCAB_SIZE

# Thresholds (docs/reliability.md)
SPIKE_FACTOR = 5.0  # grad norm > this x the running mean of the previous SPIKE_WINDOW finite norms
SPIKE_WINDOW, SPIKE_MIN_HISTORY = 50, 10
LOSS_RISE = 1.10  # a block of steps whose mean loss exceeds the previous block's by 10%: warn
LOSS_DIVERGED = 1.5  # the last block's mean loss above 1.5x the best block's: FAIL
# A loss this far above a uniform prediction's (ln V nats) is no model at all: divergence, already in
# the first rows (the block comparison above needs a good block first). >= 3 such applied steps: FAIL.
LOSS_UNIFORM = math.log(VOCAB_SIZE)
LOSS_ABSURD, ABSURD_STEPS = 2 * LOSS_UNIFORM, 3
DROP_FACTOR, DROP_RUN, DROP_WINDOW = 0.5, 5, 50  # >= 5 steps in a row below half the running median
MEMORY_GROWTH_MB, MEMORY_GROWTH_FRACTION = 64.0, 0.25  # RSS growth within one process: warn above both


def _blocks(rows: list[Row]) -> tuple[int, list[tuple[int, float]]]:
    """(block size, [(last step of block, mean loss of its applied finite steps)])."""
    good = [r for r in rows if not r.skipped and math.isfinite(r.loss)]
    w = max(10, len(good) // 30)
    out = []
    for i in range(0, len(good) - w + 1, w):
        chunk = good[i:i + w]
        out.append((chunk[-1].step, sum(r.loss for r in chunk) / len(chunk)))
    return w, out


def check_running_loss(rows: list[Row]) -> Finding:
    """Divergence: losses far above a uniform prediction's (from the first row on), or the last block
    of steps well above the best one; a rise from one block to the next is a warning."""
    name = "running loss"
    absurd = [r for r in rows if not r.skipped and math.isfinite(r.loss) and r.loss > LOSS_ABSURD]
    if absurd:
        top = max(absurd, key=lambda r: r.loss)
        what = (f"loss above 2 x ln {VOCAB_SIZE} = {LOSS_ABSURD:.2f} nats (a uniform prediction scores "
                f"{LOSS_UNIFORM:.2f}) at {len(absurd)} applied step(s) ({steps_text([r.step for r in absurd])}; "
                f"highest {top.loss:.6g} at step {top.step})")
        if len(absurd) >= ABSURD_STEPS:
            return Finding(name, FAIL, f"diverged: {what}: lower train.lr, or check the data",
                           [r.step for r in absurd][:MAX_STEPS], total=len(absurd))
        return Finding(name, WARN, what, [r.step for r in absurd])
    w, blocks = _blocks(rows)
    if len(blocks) < 2:
        return Finding(name, OK, f"too few steps for blocks of {w}")
    rises = [blocks[i][0] for i in range(1, len(blocks)) if blocks[i][1] > blocks[i - 1][1] * LOSS_RISE]
    best = min(b[1] for b in blocks)
    last = blocks[-1][1]
    if last > best * LOSS_DIVERGED and blocks[-1][1] != best:
        return Finding(name, FAIL, f"diverged: mean loss of the last {w} steps {last:.3f} vs best {best:.3f}",
                       [blocks[-1][0]])
    if rises:
        return Finding(name, WARN, f"mean loss over {w}-step blocks rose by > {LOSS_RISE - 1:.0%} "
                       f"at the block ending at {steps_text(rises)}", rises)
    return Finding(name, OK, f"{blocks[0][1]:.3f} -> {last:.3f} over {len(blocks)} blocks of {w} steps, no rise "
                   f"> {LOSS_RISE - 1:.0%}")


def check_grad_spikes(rows: list[Row]) -> Finding:
    name = "grad-norm spikes"
    hist: list[float] = []
    spikes = []
    for r in rows:
        g = r.grad_norm
        if not math.isfinite(g):
            continue
        if len(hist) >= SPIKE_MIN_HISTORY:
            mean = sum(hist[-SPIKE_WINDOW:]) / len(hist[-SPIKE_WINDOW:])
            if g > SPIKE_FACTOR * mean:
                spikes.append(r.step)
        hist.append(g)
    if spikes:
        return Finding(name, WARN, f"{len(spikes)} step(s) with a gradient norm > {SPIKE_FACTOR:g}x the running "
                       f"mean of the previous {SPIKE_WINDOW} ({steps_text(spikes)})", spikes)
    return Finding(name, OK, f"none > {SPIKE_FACTOR:g}x the running mean")


def check_throughput(rows: list[Row], segs: Segments) -> Finding:
    """Sustained drops: DROP_RUN steps in a row below DROP_FACTOR x the running median, within one process."""
    name = "throughput"
    drops = []
    hist: list[float] = []
    run: list[int] = []
    owner = None
    for r in rows:
        seg = segs.of(r.step)
        if seg is not owner:  # a new process: its own warm-up and speed
            owner, hist, run = seg, [], []
        if not math.isfinite(r.tps) or r.tps <= 0:
            continue
        if len(hist) >= SPIKE_MIN_HISTORY and r.tps < DROP_FACTOR * statistics.median(hist[-DROP_WINDOW:]):
            run.append(r.step)
            if len(run) == DROP_RUN:
                drops.append(run[0])
            continue  # a slow step does not lower the baseline
        run = []
        hist.append(r.tps)
    if drops:
        return Finding(name, WARN, f"tokens/s fell below {DROP_FACTOR:g}x the running median for >= {DROP_RUN} steps "
                       f"from {steps_text(drops)}", drops)
    tps = [r.tps for r in rows if math.isfinite(r.tps)]
    return Finding(name, OK, f"median {statistics.median(tps):,.0f} tokens/s, no sustained drop" if tps else "no data")


def check_memory(segs: list[Segment]) -> Finding:
    """Resident memory within each process, from the rss_mb (else peak_rss_mb) of its events after the first."""
    name = "memory growth"
    grown, seen = [], 0
    for seg in segs:
        vals = [(int(e.get("global_step", 0)), e.get("rss_mb") if e.get("rss_mb") is not None else e.get("peak_rss_mb"))
                for e in seg.events if e["event"] in ("eval", "checkpoint", "end")]
        vals = [(s, float(v)) for s, v in vals if v is not None]
        if len(vals) < 3:
            continue
        seen += 1
        base = vals[0][1]  # after the first step's allocations
        step, top = max(vals[1:], key=lambda sv: sv[1])
        if top - base > MEMORY_GROWTH_MB and top > base * (1 + MEMORY_GROWTH_FRACTION):
            grown.append((step, base, top))
    if grown:
        s, a, b = grown[0]
        return Finding(name, WARN, f"resident memory grew {a:.0f} -> {b:.0f} MiB within one process (by step {s})",
                       [g[0] for g in grown])
    if not seen:
        return Finding(name, OK, "not measured (events without rss_mb, or fewer than 3 per process)")
    return Finding(name, OK, f"no growth > {MEMORY_GROWTH_MB:.0f} MiB and {MEMORY_GROWTH_FRACTION:.0%} "
                   f"in {seen} process(es)")
