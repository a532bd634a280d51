#!/usr/bin/env python3
"""How much independent dispatches of a training step overlap when recorded side by side (the layer
wavefront's question, issue 35; kp patch 0007, `Device.beside`).

    python tools/bench_concurrency.py configs/catchat-v3.toml [--precision fp16] [--reps 5] [--json F]

Builds the training program for CONFIG (as `catchat bench` does) and runs one training step, so its
buffers hold real activations. Then, for each pair of groups of the step's own dispatches, times (median
wall clock of --reps submits) each group alone, the two in order, and the two side by side: the second
group's first dispatch recorded without the barrier before it. The groups:
- the backward sweeps of the top two layers (on the streamed or resident kernels the program plans);
- the forward sweeps of two layers, and of every layer at once (what a wavefront would run together);
- the top layer's dW_hh GEMM beside the backward sweep of the layer below (issue 35 item 2).
The pairs are timed for overlap only: side by side they race on buffers the step shares between
layers (dGi), so the program's results are not used afterwards. Two persistent dispatches that do not
fit on the GPU together run one after the other (the later one's workgroups wait), which the times
show. Without kp patch 0007 the side-by-side rows are the ordered ones (`dispatches_concurrent` says).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat import config as cfgmod  # noqa: E402
from catchat import environment  # noqa: E402
from catchat.analysis.bench import ready_program  # noqa: E402
from catchat.analysis.timing import timed_sequence  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.program.sequences import side_by_side  # noqa: E402


def workgroups(kernel) -> int:
    """Workgroups of a sweep's persistent dispatch (0: a dispatch per step), or of a GEMM's main grid."""
    n = getattr(kernel, "sweep_workgroups", None)
    return int(n) if n is not None else int(np.prod(kernel.grid))


def pairs(prog) -> list[tuple[str, list, list]]:
    """(name, kernels, op groups) for each timed set of groups, from the program's own kernels."""
    fwd, layers, L = prog.fwd, prog.bwd.layers, prog.spec.layers
    top, below = L - 1, max(L - 2, 0)
    out = []
    if L > 1:
        out.append((f"backward sweeps, layers {top} and {below}", [layers[top].gru, layers[below].gru],
                    [layers[top].gru.sweep_ops(), layers[below].gru.sweep_ops()]))
        out.append((f"forward sweeps, layers {below} and {top}", [fwd.gru[below], fwd.gru[top]],
                    [fwd.gru[below].sweep_ops(), fwd.gru[top].sweep_ops()]))
        dw = layers[top].dw_hh
        out.append((f"layer {top}'s dW_hh beside layer {below}'s backward sweep", [layers[below].gru, dw],
                    [layers[below].gru.sweep_ops(), dw.ops()]))
    if L > 2:
        out.append((f"forward sweeps of all {L} layers", list(fwd.gru), [g.sweep_ops() for g in fwd.gru]))
    return out


def measure(dev, groups: list[list], reps: int) -> dict:
    """Milliseconds: each group alone, all in order, all side by side."""
    alone = [timed_sequence(dev, g, reps) * 1e3 for g in groups]
    ordered = timed_sequence(dev, [op for g in groups for op in g], reps) * 1e3
    together = timed_sequence(dev, side_by_side(dev, groups), reps) * 1e3
    saved = ordered - together
    return dict(alone_ms=[round(a, 3) for a in alone], ordered_ms=round(ordered, 3), beside_ms=round(together, 3),
                saved_ms=round(saved, 3), overlap=round(saved / (sum(alone) - max(alone)), 3) if len(alone) > 1
                and sum(alone) > max(alone) else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--precision", choices=("fp32", "fp16"), default=None,
                    help="train.precision (default: the config's)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    overrides = args.overrides + ([f'train.precision="{args.precision}"'] if args.precision else [])
    cfg = cfgmod.load(args.config, overrides)
    dev = open_device(args.device)
    prog, train_step, _ = ready_program(cfg, dev)
    train_step()
    print(f"{args.config}: H={prog.spec.hidden} L={prog.spec.layers} B={prog.B} T={prog.T} at "
          f"{cfg.train.precision} on {dev.info.name}; dispatches side by side: "
          f"{'yes (kp patch 0007)' if dev.dispatches_concurrent else 'no (kp without patch 0007: ordered)'}")
    rows = []
    print(f"{'groups':<58}{'workgroups':>14}{'alone ms':>20}{'in order':>10}{'beside':>9}{'saved':>8}{'overlap':>9}")
    for name, kernels, groups in pairs(prog):
        row = dict(groups=name, workgroups=[workgroups(k) for k in kernels], **measure(dev, groups, args.reps))
        rows.append(row)
        alone = " + ".join(f"{a:.2f}" for a in row["alone_ms"])
        overlap = "-" if row["overlap"] is None else f"{row['overlap']:.2f}"
        print(f"{name:<58}{'/'.join(map(str, row['workgroups'])):>14}{alone:>20}{row['ordered_ms']:>10.2f}"
              f"{row['beside_ms']:>9.2f}{row['saved_ms']:>8.2f}{overlap:>9}")
    print("overlap: the time saved over what the shorter groups took alone (1: fully hidden)")
    if args.json:
        args.json.write_text(json.dumps(dict(config=str(args.config), device=dev.info.name, env=environment.settings(),
                                             precision=cfg.train.precision, hidden=prog.spec.hidden,
                                             layers=prog.spec.layers, lanes=prog.B, window=prog.T,
                                             concurrent=dev.dispatches_concurrent, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
