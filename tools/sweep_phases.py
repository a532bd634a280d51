#!/usr/bin/env python3
"""Where a step of the register-resident or streamed recurrent sweeps goes, in SM clock cycles.

    python tools/sweep_phases.py configs/catchat-v3.toml [--layer 1] [--steps 512] [--reps 3] [--set k=v]

Builds the training program for CONFIG (as `catchat bench` does) and runs one training step, so
its buffers hold real activations. Then it runs layer --layer's forward and backward sweeps again
as twins compiled with phase clocks (glsl/include/phase_clock.glsl): workgroup 0 stamps the SM
clock at each phase boundary of the first --steps steps. Prints the median cycles of each phase
and of a step, the sweep's time per step, and the SM clock that implies. Needs register-resident
tiles: a GPU whose driver reports its SMs (persistent sweeps on), or CATCHAT_PERSISTENT=1 with a
layer that fits one workgroup (H <= 16: what the test suite does on lavapipe); or the streamed
tensor-core sweeps (glsl/gru_*_stream.comp: v5 at fp16), whose phases are fewer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from catchat import config as cfgmod  # noqa: E402
from catchat.analysis.bench import ready_program  # noqa: E402
from catchat.analysis.timing import timed_sequence  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.kernels import gru, run_ops  # noqa: E402

# Phase p runs from stamp p to stamp p+1 (the last to the next step's stamp 0); the shaders'
# PHASE(step, p) calls mark the boundaries.
FORWARD_PHASES = ("stage h_prev", "matmul, reduction, gates", "arrive", "save writes (hprev at t = 0), next gi",
                  "wait for the lane tile")
BACKWARD_PHASES = ("partials, gate backward", "product with W, partial stores", "arrive",
                   "dGi/dhz writes, next inputs", "wait for the lane tile")
STREAM_FORWARD_PHASES = ("W_hh ring loads, grid barrier wait", "product, k-group sums", "gates, h16 writes",
                         "barrier arrival, deferred writes, next inputs")
STREAM_BACKWARD_PHASES = ("W_hh ring loads, grid barrier wait", "product, k-group sums",
                          "element: dh, gate backward, g16 writes", "barrier arrival, deferred writes, next inputs")
KSPLIT_BACKWARD_PHASES = ("W_hh ring loads, k-part wait, dGh staged", "product, partial stores",
                          "arrival, next inputs, partials' wait and sums", "element, g16 writes, arrival, writes",
                          "to the next step")


class _Clocked:
    """A register-resident or streamed sweep whose shaders stamp phase clocks into `clock` (uint32
    [8 * steps]): PHASE_CLOCK is its binding, the one after the sweep's own (glsl/include/phase_clock.glsl)."""

    def __init__(self, *args, clock, **kwargs):
        self.clock = clock
        super().__init__(*args, **kwargs)
        if not (self.stream or isinstance(self.tiles, gru.ResidentTiles)):
            raise ValueError("phase clocks need register-resident tiles or a streamed sweep")

    def _extra_bindings(self, tensors: list, defines: dict) -> list:
        defines.update(PHASE_CLOCK=len(tensors), PHASE_STEPS=self.clock.size() // 8)
        return tensors + [self.clock]


class ClockedForward(_Clocked, gru.GruForward):
    pass


class ClockedBackward(_Clocked, gru.GruBackward):
    pass


def clocked_twins(prog, layer: int, steps: int):
    """Layer `layer`'s sweeps rebuilt on the program's buffers with phase clocks (the same tiles, and
    the products on tensor cores where the program's are), and the clock tensors (uint32 [steps, 8] each)."""
    dev, T, B, H = prog.dev, prog.T, prog.B, prog.spec.hidden
    kf, kb, b = prog.fwd.gru[layer], prog.bwd.layers[layer].gru, prog.buffers
    # the streamed sweeps read W_hh's float16 copy (None: float32; the resident ones hold their own), the
    # float32 forward from float16 splits its hi and lo
    w_fwd = prog.fwd.w16_split if kf.split else prog.fwd.w16 if kf.stream else None
    w_bwd = prog.fwd.w16 if kb.stream else None
    if not all(k.stream or isinstance(k.tiles, gru.ResidentTiles) for k in (kf, kb)):
        raise SystemExit(f"layer {layer}'s sweeps are not register-resident here (tiles {kf.tiles}, {kb.tiles}): "
                         "run on a GPU that reports its SMs, or set CATCHAT_PERSISTENT=1 with H <= 16")
    clocks = [dev.tensor(np.zeros(8 * steps, np.uint32), np.uint32) for _ in range(2)]
    gi_off, w_off, b_off, h0_off, o_off, hprev_off, save_off, hT_off = kf.offsets
    # o[l] holds the state sequence: rows [0, T) are hprev, rows [1, T+1) the outputs (plan.py)
    fwd = ClockedForward(dev, b.gi, b.params, b.h0, b.resets, b.o[layer], b.o[layer], b.save[layer], b.hT,
                         T=T, B=B, H=H, w_off=w_off, b_off=b_off, gi_off=gi_off, h0_off=h0_off, o_off=o_off,
                         hprev_off=hprev_off, save_off=save_off, hT_off=hT_off,
                         tiles=None if kf.stream_f32 else kf.tiles, stats=b.stats, coop=kf.coop, w_half=w_fwd,
                         stream_f32=kf.stream_f32, save_half=kf.save_half, split=kf.split, clock=clocks[0])
    w_off, do_off, save_off, hprev_off, dgi_off, dgh_off, dh0_off = kb.offsets
    # the backward's do and dGi live in x[L] and gi, dGh over save or its n third in dgh_n (plan.py)
    bwd = ClockedBackward(dev, b.x[-1], b.save[layer], b.o[layer], b.resets, b.params, b.hyper,
                          b.gi, b.dgh_n, b.dh0, b.stats, T=T, B=B, H=H, w_off=w_off, do_off=do_off,
                          save_off=save_off, hprev_off=hprev_off, dgi_off=dgi_off, dgh_off=dgh_off,
                          dh0_off=dh0_off, tiles=None if kb.stream_f32 else kb.tiles, coop=kb.coop, w_half=w_bwd,
                          stream_f32=kb.stream_f32, save_half=kb.save_half, clock=clocks[1])
    return fwd, bwd, clocks


def phase_cycles(stamps: np.ndarray, n_phases: int) -> tuple[list[float], float]:
    """Median cycles of each phase and of a step from uint32 stamps [steps, 8] (the clock's low
    word: differences mod 2^32). The first 10% of the steps are left out (warm-up)."""
    n = len(stamps)
    c = stamps.astype(np.int64)
    lo = max(1, n // 10)
    rows = np.arange(lo, n - 1)
    nxt = lambda p: c[rows, p + 1] if p + 1 < n_phases else c[rows + 1, 0]  # noqa: E731
    phases = [float(np.median((nxt(p) - c[rows, p]) % 2**32)) for p in range(n_phases)]
    return phases, float(np.median((c[rows + 1, 0] - c[rows, 0]) % 2**32))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--steps", type=int, default=512, help="steps stamped (from the sweep's start)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    cfg = cfgmod.load(args.config, args.overrides)
    dev = open_device(args.device)
    prog, train_step, _ = ready_program(cfg, dev)
    if not 0 <= args.layer < prog.spec.layers:
        raise SystemExit(f"--layer {args.layer}: the model has layers 0..{prog.spec.layers - 1}")
    train_step()
    steps = max(3, min(args.steps, prog.T))
    fwd, bwd, clocks = clocked_twins(prog, args.layer, steps)
    print(f"{args.config}: H={prog.spec.hidden} B={prog.B} T={prog.T} layer {args.layer} on {dev.info.name}; "
          f"tiles {fwd.tiles} / {bwd.tiles}; workgroup 0, steps {steps // 10}..{steps - 1}")
    # each sweep's labels by its own design (v3's mixed sweeps: a resident forward, a streamed backward)
    labels_f = STREAM_FORWARD_PHASES if fwd.stream else FORWARD_PHASES
    labels_b = (KSPLIT_BACKWARD_PHASES if bwd.tiles.ksplit else STREAM_BACKWARD_PHASES) if bwd.stream \
        else BACKWARD_PHASES
    for name, kernel, clock, labels, n_steps in (("forward", fwd, clocks[0], labels_f, prog.T),
                                                 ("backward", bwd, clocks[1], labels_b, prog.T + 1)):
        ops = kernel.sweep_ops()
        sec = timed_sequence(dev, ops, args.reps)
        stamps = run_ops(dev, [], ops, [clock])[0].reshape(steps, 8)
        phases, step = phase_cycles(stamps, len(labels))
        us = sec * 1e6 / n_steps
        print(f"{name}: {step:,.0f} cycles per step; the sweep takes {us:.2f} us per step "
              f"(~{step / us / 1e3:.2f} GHz)")
        for label, cyc in zip(labels, phases):
            print(f"  {label:<34} {cyc:>9,.0f} cycles  {100 * cyc / step:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
