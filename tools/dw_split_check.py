#!/usr/bin/env python3
"""dW_hh's n third split over K, checked at a config's full shape on the device.

    python tools/dw_split_check.py configs/catchat-v5.toml [--set k=v]

Where the fp16 program keeps dGh's n third apart (float16 saves: v5 on the streamed sweeps), its
[H, H] weight gradient takes its own split-K count (`Geometry.split_wn`). The model parity runs far
fewer rows than that split needs (K = T*B >= 2,048), so this runs one fp16 training step at the
config's window and lanes twice, with the program's splits and with that GEMM unsplit, and compares
every gradient: the layers' weight_hh may differ by float32 rounding (the same sums in another
order), everything else must be the same bits. Prints the splits, a line per parameter, then OK or
FAIL (exit 1)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat import config as cfgmod  # noqa: E402
from catchat.model import ParamLayout  # noqa: E402
from catchat.parity import model as model_parity  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.program import Program, plan  # noqa: E402

WEIGHT_HH_RTOL = 1e-4  # of each weight_hh gradient's largest magnitude (float32 sums in another order)


def step_grads(dev, layout, T, B, inputs, hp, unsplit_n: bool) -> np.ndarray:
    """One fp16 training step's gradients; unsplit_n: the [H, H] GEMM's split-K forced to 1."""
    flat, tokens, targets, resets, h0 = inputs
    split_k = plan.gemm_split_k
    if unsplit_n:
        plan.gemm_split_k = lambda dev, M, N, K: 1 if M == N else split_k(dev, M, N, K)
    try:
        prog = Program(dev, layout, T, B, precision="fp16")
    finally:
        plan.gemm_split_k = split_k
    g = prog.geometry
    prog.set_params(flat)
    prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
    prog.set_carry(h0)
    st = prog.train_step([(tokens, targets, resets)], hp, global_step=0)
    (grads,) = prog.read("grads")
    print(f"{'unsplit' if unsplit_n else 'program'}: split_w={g.split_w} split_wn={g.split_wn} save16={g.save16} "
          f"loss={st.loss:.6f} skipped={st.skipped}")
    return grads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = ap.parse_args()
    cfg = cfgmod.load(args.config, args.overrides)
    spec, T, B = cfgmod.model_spec(cfg), cfg.data.window, cfg.data.batch_lanes
    layout = ParamLayout(spec)
    dev = open_device()
    inputs = model_parity.model_inputs(spec, T, B, seed=2)
    hp = replace(model_parity.MODEL_CASES[0][4], loss_scale=1024.0)
    split = step_grads(dev, layout, T, B, inputs, hp, unsplit_n=False)
    unsplit = step_grads(dev, layout, T, B, inputs, hp, unsplit_n=True)
    ok = True
    for name in layout.names:
        a, b = layout.view(split, name), layout.view(unsplit, name)
        if np.array_equal(a, b):
            print(f"{name:28s} identical")
            continue
        rel = float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))
        good = "weight_hh" in name and rel <= WEIGHT_HH_RTOL
        ok &= good
        print(f"{name:28s} max difference {rel:.2e} of its largest {'(ok)' if good else 'FAIL'}")
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
