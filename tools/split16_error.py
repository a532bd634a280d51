#!/usr/bin/env python3
"""How close float32 products come when taken on float16 tensor cores as three products of split
operands (x = hi + lo, hi = float16(x)), against float32 itself: the numbers behind docs/benchmarks.md
"v5 at fp32", "Float32 products from float16 splits".

A recurrent step's product y = W_hh h (W_hh [rows, H] ~ U(+-1/sqrt(H)), h = tanh(...) in (-1, 1), the
v5 sweep's shapes by default) is taken in float64 (the reference) and in these ways, each summing a
k-group of `--k-group` products in one accumulator, then the k-groups in float32 (as the sweeps fold
theirs through `red`):

- fp32: float32 products and sums;
- fp16: one float16 product (what train.precision = "fp16" takes);
- split, two accumulators: hi*hi into one, hi*lo' + lo'*hi into another (lo' = 2^11 (x - hi) in
  float16, normal for the sizes here), summed as main + 2^-11 lo at the k-group's end;
- split, one accumulator: hi*hi + hi*lo + lo*hi into one (lo = x - hi in float16, unscaled).

Tensor cores add a product into their float32 accumulator with truncation (toward zero) rather than
to nearest, so each split is taken both ways ("rn", "rz"): the truncating rows are the ones that say
what the hardware would give. float16 x float16 products are exact in float32, so only the sums
round. Prints the error of each as a fraction of the largest |y|; --recurrence T also runs a GRU layer
of --hidden units T steps with its product taken each way and prints how far its state drifts from
the same layer in float64 (each step's error feeds the next); --json F writes the rows.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def toward_zero(x64: np.ndarray) -> np.ndarray:
    """float64 -> float32, rounded toward zero."""
    f = x64.astype(np.float32)
    away = np.abs(f.astype(np.float64)) > np.abs(x64)
    f[away] = np.nextafter(f[away], np.float32(0))
    return f


def chain(a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    """sum over k of a[:, k] b[k, :], one float32 accumulator, each exact product added in `mode`."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for k in range(a.shape[1]):
        s = acc.astype(np.float64) + np.outer(a64[:, k], b64[k])
        acc = toward_zero(s) if mode == "rz" else s.astype(np.float32)
    return acc


def split(x: np.ndarray, lo_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """x (float32) as float16 hi and lo_scale * (x - hi) in float16."""
    hi = x.astype(np.float16)
    return hi, ((x - hi.astype(np.float32)) * np.float32(lo_scale)).astype(np.float16)


def product(W: np.ndarray, h: np.ndarray, way: str, mode: str, k_group: int) -> np.ndarray:
    """W h in float32 the given way (module docstring), k-groups summed in float32."""
    W32, h32 = W.astype(np.float32), h.astype(np.float32)
    if way == "split2":
        (Wh, Wl), (hh, hl) = split(W32, 2.0 ** 11), split(h32, 2.0 ** 11)
    elif way == "split1":
        (Wh, Wl), (hh, hl) = split(W32, 1.0), split(h32, 1.0)
    total = np.zeros((W.shape[0], h.shape[1]), np.float32)
    for g in range(0, W.shape[1], k_group):
        s = slice(g, g + k_group)
        if way == "fp32":
            part = chain(W32[:, s], h32[s], "rn")
        elif way == "fp16":
            part = chain(W32[:, s].astype(np.float16), h32[s].astype(np.float16), mode)
        elif way == "split2":
            main = chain(Wh[:, s], hh[s], mode)
            lo = chain(np.concatenate([Wh[:, s], Wl[:, s]], 1), np.concatenate([hl[s], hh[s]], 0), mode)
            part = (main + (lo * np.float32(2.0 ** -11))).astype(np.float32)
        else:
            part = chain(np.concatenate([Wh[:, s], Wh[:, s], Wl[:, s]], 1),
                         np.concatenate([hh[s], hl[s], hh[s]], 0), mode)
        total = (total + part).astype(np.float32)
    return total


WAYS = (("fp32", "rn"), ("fp16", "rn"), ("split2", "rn"), ("split2", "rz"), ("split1", "rn"), ("split1", "rz"))


def study(rows: int, hidden: int, lanes: int, k_group: int, seed: int = 0) -> list[dict]:
    """Each way's error against float64 (max and mean |error| over the largest |y|)."""
    rng = np.random.default_rng(seed)
    W = rng.uniform(-1.0, 1.0, (rows, hidden)) / np.sqrt(hidden)
    h = np.tanh(1.5 * rng.standard_normal((hidden, lanes)))
    ref = W @ h
    scale = float(np.abs(ref).max())
    out = []
    for way, mode in WAYS:
        err = np.abs(product(W, h, way, mode, k_group).astype(np.float64) - ref)
        out.append(dict(way=way, sums=mode, max_error=float(err.max()) / scale, mean_error=float(err.mean()) / scale))
    return out


def recurrence(hidden: int, lanes: int, steps: int, k_group: int, ways=WAYS[:4], seed: int = 0) -> list[dict]:
    """A GRU layer run `steps` steps with its recurrent product taken each way (the gates in float32)
    against the same layer in float64: how far h drifts when a product's error feeds the next step."""
    rng = np.random.default_rng(seed)
    W = rng.uniform(-1.0, 1.0, (3 * hidden, hidden)) / np.sqrt(hidden)
    gi = rng.standard_normal((steps, 3 * hidden, lanes)) * 0.7

    def run(prod, dtype):
        h, out = np.zeros((hidden, lanes), dtype), []
        for t in range(steps):
            gh, g = prod(h).astype(dtype), gi[t].astype(dtype)
            r = 1 / (1 + np.exp(-(g[:hidden] + gh[:hidden])))
            z = 1 / (1 + np.exp(-(g[hidden:2 * hidden] + gh[hidden:2 * hidden])))
            n = np.tanh(g[2 * hidden:] + r * gh[2 * hidden:])
            h = ((1 - z) * n + z * h).astype(dtype)
            out.append(h)
        return np.stack(out)

    ref = run(lambda h: W @ h, np.float64)
    rows = []
    for way, mode in ways:
        got = run(lambda h, way=way, mode=mode: product(W, h, way, mode, k_group), np.float32)
        err = np.abs(got.astype(np.float64) - ref)
        rows.append(dict(way=way, sums=mode, max_error=float(err.max()), last_step_max_error=float(err[-1].max())))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=192, help="rows of W_hh taken (v5: 6144; a sample keeps it quick)")
    ap.add_argument("--hidden", type=int, default=2048, help="H: the product's depth")
    ap.add_argument("--lanes", type=int, default=32)
    ap.add_argument("--k-group", type=int, default=128, help="products summed in one accumulator")
    ap.add_argument("--recurrence", type=int, default=0, metavar="T",
                    help="also run a GRU layer of --hidden units T steps each way: h's drift from float64")
    ap.add_argument("--json", metavar="F", help="write the rows to F")
    args = ap.parse_args(argv)
    rows = study(args.rows, args.hidden, args.lanes, args.k_group)
    print(f"W [{args.rows} x {args.hidden}] h [{args.hidden} x {args.lanes}], k-groups of {args.k_group}:")
    print("| products | sums | max error | mean error |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['way']} | {r['sums']} | {r['max_error']:.2e} | {r['mean_error']:.2e} |")
    drift = recurrence(args.hidden, args.lanes, args.recurrence, args.k_group) if args.recurrence else []
    if drift:
        print(f"GRU layer, H = {args.hidden}, {args.lanes} lanes, {args.recurrence} steps: |h - h(float64)|")
        print("| products | sums | max over the steps | at the last step |\n|---|---|---|---|")
        for r in drift:
            print(f"| {r['way']} | {r['sums']} | {r['max_error']:.2e} | {r['last_step_max_error']:.2e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), rows=rows, recurrence=drift), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
