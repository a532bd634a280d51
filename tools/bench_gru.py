#!/usr/bin/env python3
"""Tile search for the recurrent step kernels (glsl/gru_forward.comp, glsl/gru_backward.comp).

    python tools/bench_gru.py --shape 64x512 --shape 32x2048 [--steps 64] [--reps 5] [--max 60] [--persistent N]
                              [--half-whh]

For each B x H shape, times a sweep of `--steps` dependent steps per tile candidate (the current
choice first, then a seeded sample of valid tiles that fill the GPU) and prints the microseconds
per step, fastest first. Sweeps run as the program would run them on this device (one persistent
dispatch where the GPU reports its SMs, else a dispatch per step); --persistent N overrides. Every
candidate's outputs are compared with the default tiles' (a tile that computes something else is
reported, not ranked). --apply CONFIG then reruns
`catchat bench`'s training measurement for that config with the fastest tiles patched in.
--half-whh also times every tiled candidate reading W_hh from a float16 copy (HALF_W: half the
bytes of the sweep's largest stream, float32 arithmetic), compared with the first such run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from catchat.analysis import bench, timing, tuner  # noqa: E402
from catchat.vk.device import host_view, open_device  # noqa: E402
from catchat.vk.kernels import gru, run_ops  # noqa: E402
from catchat.vk.kernels.gru import plan as gru_plan  # noqa: E402
from catchat.vk.shaders import compile_shader  # noqa: E402


def candidates(dev, B: int, H: int, backward: bool, n_max: int, resident: int, seed: int = 0) -> list[tuple]:
    """Valid tiles (threads, shared memory) that give at least 64 workgroups, current choice first."""
    grid = itertools.product((2, 4, 8, 16, 32), (2, 4, 8, 16), (1, 2, 4, 8, 16), (1, 2, 4), (1, 2, 4),
                             (32, 64, 128, 256, 512) if backward else (32, 64, 128, 256))
    ok = []
    for t in grid:
        nt = t[0] * t[1] * t[2]
        if not 64 <= nt <= min(1024, dev.info.max_workgroup_invocations):
            continue
        try:
            gru._check_tiles(dev, t, backward)
        except ValueError:
            continue
        if gru.n_workgroups(t, B, H, backward) >= 64:
            ok.append(t)
    rng = np.random.default_rng(seed)
    pick = [ok[i] for i in rng.permutation(len(ok))[:n_max]]
    if resident:  # register-resident W_hh: every variant that fits, first
        pick = resident_candidates(dev, B, H, resident, backward) + pick
    first = gru.default_tiles(dev, B, H, backward, resident)
    return [first] + [t for t in pick if t != first]


def resident_candidates(dev, B: int, H: int, resident: int, backward: bool) -> list:
    """Every resident tile (a grid of candidates, at most 96 floats of W per thread, >= 64 threads)
    that fits (`gru.resident_fits`)."""
    info, out = dev.info, []
    # forward (cols, per_thread, kv, batch, shuffle slices); backward (units, columns per thread,
    # -, lanes per batch, row slices)
    grid = (itertools.product((4, 8, 16, 32), (1, 2, 4, 8), (0,), (4, 8, 16), (1, 2, 4, 8)) if backward else
            itertools.product((4, 8, 16, 32), (1, 2, 4), (1, 2, 3, 4, 6, 8), (2, 4, 8), (8, 32)))
    for cols, per, kv, batch, sl in grid:
        w = gru.ceil_div(3 * cols, sl) * per if backward else 12 * per * kv  # floats of W per thread
        if (not backward and cols % per) or w > 96:
            continue
        t = gru.resident_candidate(B, H, resident, cols, per, kv, batch, sl)
        if t and gru.resident_shape(t, B, H, backward)[2] >= 64 and gru.resident_fits(
                t, B, H, backward, resident, info.max_workgroup_invocations, info.max_shared_memory_bytes,
                info.subgroup_size):
            out.append(t)
    return out


def time_sweep(case: tuner.SweepCase, kernel, ops, out, reps: int, steps: int) -> tuple[float, np.ndarray]:
    """Median microseconds per step of one recorded sweep of `steps` steps, and its output (NaN
    first: a kernel that writes nothing cannot pass as a match)."""
    host_view(out)[:] = np.nan
    case.dev.upload([out])
    sec = timing.timed_sequence(case.dev, ops, reps, warmup=3)  # warm-up: clocks ramp up on an idle GPU
    (got,) = run_ops(case.dev, [], [], [out])
    return sec / steps * 1e6, got


def search(dev, B: int, H: int, T: int, reps: int, n_max: int, persistent: int, half_whh: bool = False) -> dict:
    case = tuner.SweepCase(dev, B, H, T, persistent)
    best = {}
    for backward in (False, True):
        cands = candidates(dev, B, H, backward, n_max, persistent)
        with ThreadPoolExecutor(8) as pool:  # compile every variant up front, in parallel
            list(pool.map(lambda t, b=backward: compile_shader(*gru.sweep_shader(t, B, H, dev.info.subgroup_size, b)),
                          cands))
        rows, refs = [], {}
        if backward:  # the backward reads save/hprev of a forward sweep
            run_ops(dev, [], case.forward(None).sweep_ops(), [case.o])
        runs = [(t, False) for t in cands] + [(t, True) for t in cands
                                              if half_whh and not isinstance(t, gru.ResidentTiles)]
        for tiles, half in runs:
            if backward:
                k = case.backward(tiles, half)
                us, out = time_sweep(case, k, k.sweep_ops(), case.dgi, reps, T + 1)
            else:
                k = case.forward(tiles, half)
                us, out = time_sweep(case, k, k.sweep_ops(), case.o, reps, T)
            ref_out = refs.setdefault(half, out)  # float16 W_hh against the first float16 run
            err = float(np.abs(out - ref_out).max() / max(np.abs(ref_out).max(), 1e-30))
            err = err if np.isfinite(err) else float("inf")
            rows.append((us, tiles, gru.tile_count(tiles, B, H, backward), err, half))
        rows.sort(key=lambda r: (r[3] > 1e-4, r[0]))
        kind = "backward" if backward else "forward"
        mode = f"persistent sweeps over <= {persistent} workgroups" if persistent else "a dispatch per step"
        print(f"B={B} H={H} {kind} ({mode}): current {cands[0]}")
        for us, tiles, wgs, err, half in rows[:12]:
            w = "  W_hh float16" if half else ""
            print(f"  {us:8.1f} us/step  tiles {tiles}  workgroups {wgs}  rel diff {err:.1e}{w}")
        bad = [r for r in rows if r[3] > 1e-4]
        if bad:
            print(f"  {len(bad)} candidates computed something else, e.g. {bad[0][1]} (rel diff {bad[0][3]:.1e})")
        best[kind] = next(r[1] for r in rows if not r[4])
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", default=[], metavar="BxH", help="lanes x hidden (repeatable)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max", type=int, default=60, help="candidates sampled per shape and direction")
    ap.add_argument("--device", default=None)
    ap.add_argument("--persistent", type=int, default=None, metavar="N",
                    help="sweeps as one dispatch of N workgroups (0: a dispatch per step; default: as the program "
                         "would run them here, see CATCHAT_PERSISTENT)")
    ap.add_argument("--apply", metavar="CONFIG", help="then bench CONFIG's training step with the fastest tiles")
    ap.add_argument("--half-whh", action="store_true",
                    help="also time the tiled candidates with W_hh read from a float16 copy (HALF_W)")
    args = ap.parse_args(argv)
    dev = open_device(args.device)
    print(f"device: {dev.info.name}")
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in (args.shape or ["64x512"])]
    persistent = gru.resident_workgroups(dev) if args.persistent is None else args.persistent
    if args.persistent is not None:  # the --apply run builds its program under the same choice
        os.environ["CATCHAT_PERSISTENT"] = str(args.persistent)
    found = {shape: search(dev, *shape, args.steps, args.reps, args.max, persistent, args.half_whh) for shape in shapes}
    if args.apply:
        from catchat import config as cfgmod

        cfg = cfgmod.load(args.apply)
        shape = (cfg.data.batch_lanes, cfg.model.hidden)
        best = found.get(shape) or search(dev, *shape, args.steps, args.reps, args.max, persistent)
        orig = gru_plan.default_tiles  # the one place sweeps (and the memory plan) take their tiles from
        gru_plan.default_tiles = lambda dev, B, H, backward, resident: (
            best["backward" if backward else "forward"] if (B, H) == shape else orig(dev, B, H, backward, resident))
        c = bench.bench_catchat(cfg, dev, 3, 1)
        print(f"{args.apply} with tiles {best}: train {c['train_tokens_per_s']:,.0f} tok/s, step {c['step_ms']:.1f} ms "
              f"(forward {c['forward_ms']:.1f}, backward {c['backward_ms']:.1f}), "
              f"eval {c['eval_tokens_per_s']:,.0f} tok/s")


if __name__ == "__main__":
    main()
