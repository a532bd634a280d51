#!/usr/bin/env python3
"""The whole model against the numpy reference at a config's full shape, on whatever device runs it.

    python tools/full_shape_parity.py configs/catchat-v3.toml [--set k=v] [--precision fp32]

`catchat parity` checks every kernel at small and odd sizes, where every loop runs a few iterations. A
kernel whose loops end early at a real size (lavapipe ends a shader invocation's loops after 65,535
iterations in all, silently: docs/architecture.md "lavapipe's loop limit") passes there and is wrong at
the config's window, lanes and width. This runs one training step and one eval window of the config's
model at its own window and lanes (`model_parity`: logits, loss, hT, every gradient, the parameters after
the optimizer step) with the config's recipe, against the float64 reference, and prints each tensor's
largest difference as a fraction of its largest magnitude. A loop cut short loses whole terms (~1 of
that); float32 sums in another order over 65,536 rows are ~1e-6. FAIL (exit 1) past --max-error.

On lavapipe a v3 or speedrun step takes a few minutes on 2 cores (the reference ~1); not part of CI.
docs/architecture.md lists the configs checked and when."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat import config as cfgmod  # noqa: E402
from catchat.errors import CatchatError  # noqa: E402
from catchat.parity import model as model_parity  # noqa: E402
from catchat.training.step import step_hyper  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402

MAX_ERROR = 1e-3  # of a tensor's largest magnitude: a lost term is ~1, float32 reordering ~1e-6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--precision", choices=("fp32", "fp16"), default="fp32")
    ap.add_argument("--max-error", type=float, default=MAX_ERROR,
                    help="largest difference allowed, as a fraction of a tensor's largest magnitude")
    args = ap.parse_args()
    cfg = cfgmod.load(args.config, args.overrides)
    spec, T, B = cfgmod.model_spec(cfg), cfg.data.window, cfg.data.batch_lanes
    hp = step_hyper(cfg, cfg.train.lr, loss_scale=model_parity.FP16_SCALE if args.precision == "fp16" else 1.0)
    dev = open_device()
    print(f"{args.config}: H={spec.hidden} L={spec.layers} T={T} B={B} {args.precision} on {dev.info.name}",
          flush=True)
    start = time.perf_counter()
    try:
        results = model_parity.model_parity(dev, spec, T, B, hp, seed=5, label=Path(args.config).stem,
                                            precision=args.precision, wide=True)
    except CatchatError as e:  # e.g. a shape past the device's memory or buffer size: `catchat train`'s words and code
        print(f"{e.label}: {e}", file=sys.stderr)
        return e.exit_code
    worst = 0.0
    for r in results:
        err = r.scaled_error()
        worst = max(worst, err)
        verdict = "ok" if err <= args.max_error else "FAIL"
        own = "ok" if r.ok else "missed"
        print(f"{r.kernel:36s} {err:9.2e} of its size   (parity's own tolerance: {own}) {verdict}")
    ok = worst <= args.max_error
    print(f"{'OK' if ok else 'FAIL'}: largest {worst:.2e} (limit {args.max_error:g}), "
          f"{len(results)} tensors in {time.perf_counter() - start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
