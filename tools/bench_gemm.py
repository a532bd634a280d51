#!/usr/bin/env python3
"""GEMM tiles at a model's shapes: milliseconds and TFLOP/s per tile choice.

    python tools/bench_gemm.py configs/catchat-v3.toml [--tiles BM,BN,BK,TM,TN ...] [--split-k S ...]
                               [--operands f32|split|f32+split|f16|rf16|coopmat|coopmat-f16|coopmat-khr|coopmat2|
                                           coopmat2-f16|all]
                               [--reps 7] [--repeat 5]
                               [--set k=v]

The shapes are the training step's big GEMMs at CONFIG (rows R = window x lanes):
input projection [R,H]x[H,3H] (B stored [3H,H]), input gradient [R,3H]x[3H,H], weight gradient
[3H,R]x[R,H] (A stored [R,3H], split-K) and the head [R,H]x[H,V]. For each it times the tiles the
program picks (first), then every --tiles (default: a grid of shapes that fit the device), each
with the weight gradient also at every --split-k. Operands are random; each candidate's output is
compared with the first's (outputs NaN-poisoned before each run), so a tile that computes something
else, or nothing, is reported, not ranked. Candidates are timed in interleaved rounds (median).
--loads picks vec4 loads where aligned (the program's choice), float loads, or both. --operands
picks the operands and kernel: f32 (train.precision fp32 on gemm.comp's FMAs), split (float32 on
tensor cores from float16 splits, glsl/gemm_coopmat.comp's SPLIT: the fp32 program's big GEMMs where
tensor cores run, each of gemm.split_candidates; emulated fragments elsewhere), f32+split (both),
rf16 (float32 operands rounded to float16 as staged, gemm.comp's ROUND_HALF: fp16 on a device without
tensor cores), coopmat (the same on
cooperative matrices, glsl/gemm_coopmat.comp: fp16 on tensor cores, each of gemm.coop_candidates), f16 and
coopmat-f16 (operands stored as float16: gemm.comp's HALF, the tensor cores), coopmat-khr (coopmat's first
four tiles on VK_KHR_cooperative_matrix beside VK_NV_cooperative_matrix: glsl/gemm_coopmat_khr.comp, the
same source through the newer glslc), coopmat2 and coopmat2-f16
(the same two on workgroup-scope matrices fed by the driver, glsl/gemm_coopmat2.comp, each of
COOP2_CANDIDATES), or all. Every kind but
f32 and split multiplies the same float16 values (the random operands are drawn alike) and is compared
with the first of them; split rows are compared with the first float32 row (and with cuBLAS FP32).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat import config as cfgmod  # noqa: E402
from catchat import environment  # noqa: E402
from catchat.analysis.timing import timed  # noqa: E402
from catchat.analysis.torch_twin import torch_status  # noqa: E402
from catchat.vk.device import coop2_dimension_name, host_view, open_device  # noqa: E402
from catchat.vk.kernels import gemm, half_tensor, run_ops  # noqa: E402

DEFAULT_TILES = ((128, 128, 8, 16, 8), (128, 64, 8, 8, 4), (128, 128, 8, 8, 16), (64, 128, 8, 8, 8),
                 (256, 64, 8, 16, 8), (128, 128, 8, 8, 8), (128, 128, 16, 16, 8), (64, 64, 8, 8, 4),
                 (64, 64, 8, 4, 4), (32, 32, 8, 4, 4))


def shapes(cfg, dev, half: bool = False) -> dict:
    """name -> (Gemm keyword arguments without tiles, the output tensor) on random operands
    (half: the operands A and B in float16)."""
    H, V, R = cfg.model.hidden, cfgmod.model_spec(cfg).vocab_size, cfg.data.window * cfg.data.batch_lanes
    rng = np.random.default_rng(0)
    t = lambda n: dev.tensor(rng.standard_normal(n).astype(np.float32))  # noqa: E731
    o = (lambda n: half_tensor(dev, rng.standard_normal(n))) if half else t
    x, w, dg, out, dx, grads, head, logits = (o(R * H), o(3 * H * H), o(R * 3 * H), t(R * 3 * H), t(R * H),
                                              t(3 * H * H), o(V * H), t(R * V))
    dev.upload([x, w, dg, out, dx, grads, head, logits])
    return {
        "input projection": (dict(a=(x, 0, H), b=(w, 0, H), c=(out, 0, 3 * H), M=R, N=3 * H, K=H, trans_b=True), out),
        "input gradient": (dict(a=(dg, 0, 3 * H), b=(w, 0, H), c=(dx, 0, H), M=R, N=H, K=3 * H), dx),
        "weight gradient": (dict(a=(dg, 0, 3 * H), b=(x, 0, H), c=(grads, 0, H), M=3 * H, N=H, K=R, trans_a=True,
                                 split_k=gemm.gemm_split_k(dev, 3 * H, H, R)), grads),
        "head": (dict(a=(x, 0, H), b=(head, 0, H), c=(logits, 0, V), M=R, N=V, K=H, trans_b=True), logits),
    }


def interleaved_seconds(dev, op_lists, reps: int) -> list[float]:
    """Median seconds of each recorded op list, timed in rounds (each list once per round, after
    one warm-up round), so that clock ramps and slow episodes hit every candidate alike."""
    seqs = [dev.recorded(ops) for ops in op_lists]
    for seq in seqs:
        seq.eval()
    times = [[] for _ in seqs]
    for _ in range(reps):
        for seq, ts in zip(seqs, times):
            t0 = time.perf_counter()
            seq.eval()
            ts.append(time.perf_counter() - t0)
    return [float(np.median(ts)) for ts in times]


# --operands kind -> Gemm keywords
OPERANDS = {"f32": dict(split=False), "rf16": dict(precision="fp16", coopmat=False),
            "coopmat": dict(precision="fp16", coopmat=True, coopmat2=False), "f16": dict(half=True, coopmat=False),
            "coopmat-f16": dict(half=True, coopmat=True, coopmat2=False),
            "coopmat-khr": dict(precision="fp16", coopmat=True, coopmat2=False),
            "coopmat2": dict(precision="fp16", coopmat=True, coopmat2=True),
            "coopmat2-f16": dict(half=True, coopmat=True, coopmat2=True), "split": dict(split=True)}
# kinds that take float32 operands at float32's precision: compared with each other, and with cuBLAS FP32
FLOAT32_KINDS = ("f32", "split", "f32+split")
# glsl/gemm_coopmat.comp tiles: each --coop, else gemm.coop_candidates(dev, transposes): the program's
# three first, then the grid (subgroups x fragments, slice depth, shared buffers) that fits; with
# --probe the first two get probe rows. coopmat-khr: the program's three and the 128 x 128 one on 4
# subgroups, on either extension.
CT = gemm.CoopTiles
COOP_KHR_CANDIDATES = (gemm.COOP_TILE, CT(2, 2, 4, 4, 32, 1), gemm.COOP_NARROW_TILE, gemm.COOP_SMALL_TILE)


# glsl/gemm_coopmat2.comp tiles (BM, BN, BK, threads): the program's two, then other accumulator shapes,
# slice depths and workgroup sizes (those the device's workgroup-scope dimensions do not list are skipped)
C2 = gemm.Coop2Tiles
COOP2_CANDIDATES = (gemm.COOP2_TILE, gemm.COOP2_NARROW_TILE, C2(256, 128, 32), C2(128, 256, 64), C2(256, 128, 64),
                    C2(128, 128, 64), C2(128, 256, 16), C2(128, 128, 32, 128), C2(64, 128, 32, 128),
                    C2(128, 64, 64, 128), C2(64, 64, 64, 128), C2(256, 256, 32, 512))


@dataclasses.dataclass(frozen=True)
class ProbeTiles(gemm.CoopTiles):
    """A tensor-core tile compiled with one of glsl/gemm_coopmat.comp's diagnostic defines
    (PROBE_NO_GLOBAL: no operand loads; PROBE_MMA_ONLY: nor shared stores): its time against the
    whole kernel's says where the time goes. Its output is meaningless (not compared)."""

    probe: str = "PROBE_NO_GLOBAL"

    def defines(self) -> dict:
        return {**super().defines(), self.probe: 1}


def probes(own: tuple) -> list:
    """The first two tensor-core tiles of `own` with each diagnostic define (and the tile's api)."""
    return [ProbeTiles(*dataclasses.astuple(t), probe=p) for t in own[:2] if type(t) is gemm.CoopTiles
            for p in ("PROBE_NO_GLOBAL", "PROBE_MMA_ONLY")]


def candidates(dev, name: str, kw: dict, operands: str, tiles, args) -> list:
    """(Gemm, is the program's choice) per tile, split and load choice for one shape; the program's
    first (None: its own pick)."""
    splits = [kw.get("split_k", 1)] + (args.split_k if "split_k" in kw else [])
    loads = {"vec4": [True], "float": [False], "both": [True, False]}[args.loads]
    if OPERANDS[operands].get("coopmat2"):
        own = tuple(args.coop2) or COOP2_CANDIDATES
    elif operands == "coopmat-khr":  # the subgroup-fragment kernel's best tiles on either extension
        own = tuple(dataclasses.replace(t, api=api) for t in COOP_KHR_CANDIDATES for api in ("khr", "nv"))
    elif operands == "split":  # the float32 GEMM from float16 splits: gemm.SPLIT_GRID's tiles that fit
        own = tuple(args.coop) or tuple(gemm.split_candidates(dev, (bool(kw.get("trans_a")), bool(kw.get("trans_b")))))
    elif OPERANDS[operands].get("coopmat"):
        own = tuple(dataclasses.replace(t, api=gemm.coop_api(dev)) for t in args.coop) or tuple(
            gemm.coop_candidates(dev, (bool(kw.get("trans_a")), bool(kw.get("trans_b")))))
    else:
        own = tiles
    if args.probe and OPERANDS[operands].get("coopmat") and not OPERANDS[operands].get("coopmat2"):
        own = tuple(own) + tuple(probes(own))
    grid = [(t, s, v) for t in [None] + list(own) for s in dict.fromkeys(splits) for v in loads]
    cands, seen = [], set()  # no repeats
    for t, s, vec4 in grid:
        start = time.perf_counter()
        try:
            g = gemm.Gemm(dev, tiles=t, vec4=vec4, **OPERANDS[operands], **{**kw, "split_k": s})
        except ValueError as exc:  # too many threads or too much shared memory here
            print(f"  {name}: tiles {t} skipped ({exc})")
            continue
        built_s = time.perf_counter() - start
        if built_s > 2.0:  # a slow shader or pipeline build is named as it ends (a stuck one: the last line)
            print(f"  {name}: tiles {g.tiles} split-K {s} built in {built_s:.1f} s", flush=True)
        if (g.tiles, g.split_k, g.vec4_a, g.vec4_b) not in seen:
            seen.add((g.tiles, g.split_k, g.vec4_a, g.vec4_b))
            cands.append((g, not cands))
    return cands


def torch_rates(kw: dict, reps: int, repeat: int) -> dict:
    """TFLOP/s of torch.matmul (cuBLAS) at the same shape and transposes, with float16, bfloat16 and
    float32 (TF32 off) operands, float32 accumulation (torch_twin.torch_status says whether it can
    run): `repeat` products and a synchronize per timing, the median of `reps` after a warm-up."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    M, N, K = kw["M"], kw["N"], kw["K"]
    out = {}
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(*((K, M) if kw.get("trans_a") else (M, K)), device="cuda", dtype=dtype, generator=g)
        b = torch.randn(*((N, K) if kw.get("trans_b") else (K, N)), device="cuda", dtype=dtype, generator=g)
        a = a.t() if kw.get("trans_a") else a
        b = b.t() if kw.get("trans_b") else b
        c = torch.matmul(a, b)

        def products(a=a, b=b, c=c):
            for _ in range(repeat):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize()

        products()  # warm-up: cuBLAS picks its kernel
        out[name] = 2.0 * M * N * K / (timed(products, reps) / repeat) / 1e12
    return out


def parse_coop(text: str) -> gemm.CoopTiles:
    """WM,WN,FM,FN,BK,STAGES -> CoopTiles (its api set per device later)."""
    try:
        nums = [int(v) for v in text.split(",")]
    except ValueError:
        nums = []
    if len(nums) != 6:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WM,WN,FM,FN,BK,STAGES")
    return gemm.CoopTiles(*nums)


def parse_coop2(text: str) -> gemm.Coop2Tiles:
    """BM,BN,BK,THREADS[,UNROLL[,UNCLAMPED]] -> Coop2Tiles"""
    try:
        nums = [int(v) for v in text.split(",")]
    except ValueError:
        nums = []
    if not 4 <= len(nums) <= 6:
        raise argparse.ArgumentTypeError(f"{text!r}: expected BM,BN,BK,THREADS[,UNROLL[,UNCLAMPED 0|1]]")
    return gemm.Coop2Tiles(*nums[:5], *(bool(v) for v in nums[5:]))


def parse_tiles(text: str) -> gemm.GemmTiles:
    try:
        return gemm.GemmTiles(*(int(v) for v in text.split(",")))
    except (TypeError, ValueError):
        raise SystemExit(f"--tiles {text!r}: expected BM,BN,BK,TM,TN[,WX], e.g. 128,128,8,8,8") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--tiles", action="append", type=parse_tiles, default=[], metavar="BM,BN,BK,TM,TN[,WX]")
    ap.add_argument("--coop", action="append", type=parse_coop, default=[], metavar="WM,WN,FM,FN,BK,STAGES",
                    help="tensor-core tiles to time instead of the grid")
    ap.add_argument("--coop2", action="append", type=parse_coop2, default=[],
                    metavar="BM,BN,BK,THREADS[,UNROLL[,UNCLAMPED]]",
                    help="workgroup-scope tiles to time instead of the grid (UNROLL: k-slices per iteration of "
                         "the unclamped loop; UNCLAMPED 0: every tile clamped)")
    ap.add_argument("--split-k", dest="split_k", action="append", type=int, default=[], metavar="S")
    ap.add_argument("--loads", choices=("vec4", "float", "both"), default="both",
                    help="operand loads from global memory (vec4 where aligned, the program's choice; or floats)")
    ap.add_argument("--operands", choices=(*OPERANDS, "f32+split", "all"), default="f32",
                    help="float32; float32 rounded to float16 on gemm.comp (rf16) or tensor cores (coopmat); "
                         "float16 storage on either (f16, coopmat-f16); or all")
    ap.add_argument("--reps", type=int, default=7, help="timed runs (median)")
    ap.add_argument("--repeat", type=int, default=5,
                    help="dispatches of each GEMM per run (amortizes the submit's ~0.1-1 ms)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--compare-torch", action="store_true",
                    help="also time torch.matmul (cuBLAS: float16, bfloat16, float32) at each shape")
    ap.add_argument("--probe", action="store_true",
                    help="also time each tensor-core tile without its operand loads (PROBE_NO_GLOBAL) and "
                         "without its shared stores too (PROBE_MMA_ONLY): where the time goes")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every row (and torch's) to FILE")
    args = ap.parse_args(argv)
    cfg = cfgmod.load(args.config, args.overrides)
    dev = open_device(args.device)
    tiles = args.tiles or [gemm.GemmTiles(*t) for t in DEFAULT_TILES]
    print(f"{args.config}: H={cfg.model.hidden} R={cfg.data.window * cfg.data.batch_lanes} on {dev.info.name}")
    operands = {"all": tuple(OPERANDS), "f32+split": ("f32", "split")}.get(args.operands, (args.operands,))
    if dev.coop2_limits:
        dims = ", ".join(coop2_dimension_name(d) for d in dev.coop2_dimensions)
        print(f"cooperative matrix 2: at most {dev.coop2_limits[0]} threads, dimensions up to {dev.coop2_limits[1]}, "
              f"{dev.coop2_limits[2]} B of shared memory reserved; {dims}")
    if any(OPERANDS[p].get("coopmat") and not OPERANDS[p].get("coopmat2") for p in operands) \
            and not gemm.coopmat_runs(dev):
        print(f"{dev.info.name} has no cooperative matrices of {gemm.COOP_SHAPE} (VK_NV_cooperative_matrix; "
              f"offered: {', '.join(dev.coop_shapes) or 'none'}): no coopmat rows")
        operands = tuple(p for p in operands if not OPERANDS[p].get("coopmat") or OPERANDS[p].get("coopmat2"))
    if "coopmat-khr" in operands and not gemm.coopmat_khr_runs(dev):
        print(f"{dev.info.name} does not run VK_KHR_cooperative_matrix GEMMs: no coopmat-khr rows")
        operands = tuple(p for p in operands if p != "coopmat-khr")
    if any(OPERANDS[p].get("coopmat2") for p in operands) and not gemm.coopmat2_runs(dev):
        print(f"{dev.info.name} does not run cooperative-matrix-2 GEMMs (VK_NV_cooperative_matrix2 and the newer "
              f"glslc; features: {', '.join(sorted(dev.features)) or 'none'}): no coopmat2 rows")
        operands = tuple(p for p in operands if not OPERANDS[p].get("coopmat2"))
    if not operands:
        print(f"nothing to measure on {dev.info.name}", file=sys.stderr)
        return 2
    half = {p: bool(OPERANDS[p].get("half")) for p in operands}  # operands stored as float16
    problems = {h: shapes(cfg, dev, half=h) for h in dict.fromkeys(half.values())}
    use_torch = False
    if args.compare_torch:
        use_torch, status = torch_status()
        print(status)
    report = dict(tool="tools/bench_gemm.py", argv=list(sys.argv[1:] if argv is None else argv),
                  date=time.strftime("%Y-%m-%d"), device=dev.info.name, driver=getattr(dev.info, "driver", ""),
                  env=environment.settings(), config=args.config, hidden=cfg.model.hidden, shapes={})
    for name in problems[next(iter(problems))]:
        rows, refs = [], {}
        for p in operands:
            kw, out = problems[half[p]][name]
            cands = candidates(dev, name, kw, p, tiles, args)
            secs = interleaved_seconds(dev, [g.ops() * max(1, args.repeat) for g, _ in cands], max(1, args.reps))
            for (g, current), sec in zip(cands, secs):
                host_view(out)[:] = np.nan  # a kernel that writes nothing cannot pass as a match
                got = run_ops(dev, [out], g.ops(), [out])[0]
                ref = refs.setdefault(p in FLOAT32_KINDS, got)  # float16 rows against the first float16 one
                diff = float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
                kind = f"{p} " + ("vec4" if g.vec4_a or g.vec4_b else "float")
                if g.unclamped_share() is not None:  # the workgroup-scope kernel: how much took its fast path
                    kind += f" ({g.unclamped_share():.0%} unclamped)"
                if isinstance(g.tiles, ProbeTiles):
                    diff, kind = 0.0, f"{kind} {g.tiles.probe}"  # not the product: nothing to compare
                fp32 = "split" if gemm.split_gemm(dev, kw["M"], kw["N"], kw["K"]) else "f32"
                program = current and p in (fp32, "coopmat2" if gemm.coopmat2_runs(dev) else "coopmat")
                rows.append((sec / max(1, args.repeat), g.tiles, g.split_k, kind, diff, program))
        flop = 2.0 * kw["M"] * kw["N"] * kw["K"]
        torch_tflops = torch_rates(kw, max(1, args.reps), max(1, args.repeat)) if use_torch else {}
        print(f"{name}: [{kw['M']},{kw['K']}] x [{kw['K']},{kw['N']}], {flop / 1e9:.1f} GFLOP"
              + "".join(f", torch {k} {v:.1f}" for k, v in torch_tflops.items()) + (" TFLOP/s" if torch_tflops else ""))
        entry = dict(M=kw["M"], N=kw["N"], K=kw["K"], trans_a=bool(kw.get("trans_a")),
                     trans_b=bool(kw.get("trans_b")), gflop=flop / 1e9, torch_tflops=torch_tflops, rows=[])
        for sec, t, s, kind, diff, current in sorted(rows, key=lambda r: r[0]):
            rate = flop / sec / 1e12 if sec else 0.0
            flag = "  (program's choice)" if current else ""  # at fp32, and at fp16 on tensor cores
            bad = "" if diff <= 1e-4 else f"  DIFFERS: rel {diff:.1e}"  # NaN too
            fp32 = kind.split()[0] in FLOAT32_KINDS
            base = "fp32" if fp32 else "fp16"  # cuBLAS at the row's precision
            vs = f"  {rate / torch_tflops[base]:.2f}x cuBLAS {base}" if base in torch_tflops else ""
            print(f"  {sec * 1e3:8.3f} ms {rate:6.1f} TFLOP/s  {t}  split-K {s}  {kind} loads{flag}{vs}{bad}")
            entry["rows"].append(dict(ms=sec * 1e3, tflops=rate, tiles=list(dataclasses.astuple(t)), split_k=s,
                                      kind=kind, program=bool(current), max_rel_diff=diff, ok=bool(diff <= 1e-4)))
        report["shapes"][name] = entry
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
