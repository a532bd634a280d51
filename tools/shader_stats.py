#!/usr/bin/env python3
"""What the driver's compiler made of the register-resident sweep shaders and the GEMMs: registers.

    python tools/shader_stats.py configs/catchat-v3.toml [--forward C,L,P,K,B,S ...] [--backward C,L,P,K,B,S ...]
                                 [--gemm] [--coop] [--resident-split] [--stream-backward] [--decode]
                                 [--decode-coop SG,...]

Builds a layer's forward and backward sweep kernels at CONFIG's B x H as the program would on
this device (or with the given ResidentTiles fields: cols, lanes, per_thread, kv, batch, sl),
compiles their persistent variants, creates each as a pipeline with statistics capture
(VK_KHR_pipeline_executable_properties, tools/pipeline_stats.py) and prints every statistic
the driver reports (NVIDIA: register count, binary, stack, local and shared memory sizes): whether
a tile shape spills its W_hh slice. --coop builds the sweeps with their products on tensor cores
(what fp16 runs on a GPU with cooperative matrices): how many registers are left for a second
workgroup per SM. --resident-split the register-resident fp32 forward from float16 splits on tensor cores
(CATCHAT_RESIDENT_SPLIT's: W_hh's hi and lo fragments held, 512 threads: does it stay within 128 registers
a thread?). --stream-backward the streamed fp16 backward (v5's) with and without its bias
sums. --gemm adds the step's four big GEMMs (tools/bench_gemm.py's
shapes) as the program builds them, with vec4 and with float loads; --coop-gemm the tensor-core
GEMM's candidate tiles at the input projection (registers, local memory: does a tile spill?);
--decode generation's fused decode layer and head at --decode-batch streams for each stream tile
(CATCHAT_DECODE_TILE: 6 partial sums per stream in registers: where does a tile spill?);
--decode-coop SG,... the tensor-core decode layer at --decode-batch streams with at most SG subgroups a
workgroup (8 or 16: CATCHAT_DECODE_COOP_SUBGROUPS): how many registers its ring of loads takes, and
whether it spills.
Drivers without the extension (lavapipe) still compile and create the pipelines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_gemm  # noqa: E402
from pipeline_stats import compute_pipeline_statistics  # noqa: E402

from catchat import config as cfgmod  # noqa: E402
from catchat.model import ModelSpec, ParamLayout  # noqa: E402
from catchat.vk import slots  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.kernels import gemm, gru  # noqa: E402
from catchat.vk.shaders import compile_shader  # noqa: E402


def parse_tiles(text: str) -> gru.ResidentTiles:
    try:
        return gru.ResidentTiles(*(int(v) for v in text.split(",")))
    except (TypeError, ValueError):
        raise SystemExit(f"{text!r}: expected cols,lanes,per_thread,kv,batch,sl, e.g. 16,16,2,2,4,32") from None


def sweep_kernels(dev, B: int, H: int, forward_tiles=None, backward_tiles=None, coop: bool = False,
                  split: bool = False, resident_split: bool = False):
    """A one-step forward and backward sweep kernel at [B, H] on zero buffers (tiles None: the
    program's choice on this device; coop: products on tensor cores; split: the forward is the float32
    one from float16 splits, CATCHAT_STREAM32_SPLIT's; resident_split: the same register-resident,
    CATCHAT_RESIDENT_SPLIT's, on the tensor-core forward's tiles)."""
    layout = ParamLayout(ModelSpec(vocab_size=11, hidden=H, layers=1))
    f32 = lambda n: dev.tensor(np.zeros(n, np.float32))  # noqa: E731
    u32 = lambda n: dev.tensor(np.zeros(n, np.uint32), np.uint32)  # noqa: E731
    params, resets, stats = f32(layout.total), u32(B), u32(slots.ST_WORDS)
    rows, state = (lambda w: f32(B * w * H)), f32(B * H)
    w_off, b_off = layout.offsets["layers.0.gru.weight_hh"], layout.offsets["layers.0.gru.bias_hh"]
    hprev, save = rows(1), rows(4)
    split_w = {"w_off": 0, "w_half": u32(3 * H * H), "split": True} if split else \
        {"w_off": w_off, "coop": coop, "split": resident_split}  # split: W_hh's hi and lo copy
    if resident_split and forward_tiles is None:
        forward_tiles = gru.plan_sweep(dev, B, H, False, coop=True).tiles
    fwd = gru.GruForward(dev, rows(3), params, state, resets, rows(1), hprev, save, f32(B * H), T=1, B=B, H=H,
                         b_off=b_off, tiles=forward_tiles, stats=stats, **split_w)
    bwd = gru.GruBackward(dev, rows(1), save, hprev, resets, params, u32(slots.HP_WORDS), rows(3), rows(3),
                          f32(B * H), stats, T=1, B=B, H=H, w_off=w_off, tiles=backward_tiles, coop=coop)
    return fwd, bwd


def stream_backward(dev, B: int, H: int, bias_sums: bool):
    """The program's streamed fp16 backward sweep at [B, H] (W_hh's float16 copy, float16 saves; the
    k-split where it takes the shape), on zero buffers, summing the bias gradients or not (BIAS_SUMS)."""
    layout = ParamLayout(ModelSpec(vocab_size=11, hidden=H, layers=1))
    f32 = lambda n: dev.tensor(np.zeros(n, np.float32))  # noqa: E731
    u32 = lambda n: dev.tensor(np.zeros(n, np.uint32), np.uint32)  # noqa: E731
    rows = lambda w: f32(B * w * H)  # noqa: E731
    return gru.GruBackward(dev, rows(1), u32(2 * B * H), rows(1), u32(B), f32(layout.total), u32(slots.HP_WORDS),
                           rows(3), rows(1), f32(B * H), u32(slots.ST_WORDS), T=1, B=B, H=H, w_off=0,
                           w_half=u32(3 * H * H // 2), coop=True, save_half=True, bias_sums=bias_sums)


def decode_buffers(dev, cfg, B: int):
    """Zero buffers a decode layer for B streams at CONFIG's shape binds: (layout, params, table0, state,
    ysum, token, ctl), as the Decoder lays them out."""
    layout = ParamLayout(cfgmod.model_spec(cfg))
    s = layout.spec
    f32 = lambda n: dev.tensor(np.zeros(n, np.float32))  # noqa: E731
    u32 = lambda n: dev.tensor(np.zeros(n, np.uint32), np.uint32)  # noqa: E731
    return (layout, f32(layout.total), f32(s.vocab_size * 3 * s.hidden), f32(2 * s.layers * B * s.hidden),
            f32(s.layers * B * s.hidden), u32(B), u32(B * slots.DS_WORDS))


def decode_kernels(dev, cfg, B: int, tile: int):
    """Generation's fused decode layer for B streams at CONFIG's shape, built with stream tile `tile` (what
    CATCHAT_DECODE_TILE asks for), and its head (k parts, no stream tile), on zero buffers."""
    from catchat.vk.kernels import decode
    from catchat.vk.switches import env_override

    layout, params, table0, state, ysum, token, ctl = decode_buffers(dev, cfg, B)
    with env_override(decode.TILE_ENV, str(tile)):
        layer = decode.DecodeLayer(dev, layout, params, table0, state, ysum, token, ctl, B=B)
    return layer, decode.DecodeHead(dev, layout, params, ysum, B=B)


def decode_coop_kernel(dev, cfg, B: int, subgroups: int):
    """Generation's tensor-core decode layer for B streams at CONFIG's shape with `subgroups` a workgroup
    at most, on zero buffers."""
    from catchat.vk.kernels import decode
    from catchat.vk.switches import env_override

    layout, *buffers = decode_buffers(dev, cfg, B)
    with env_override(decode.COOP_SUBGROUPS_ENV, str(subgroups)):
        return decode.DecodeLayerCoop(dev, layout, *buffers, B=B)


def parse_subgroups(text: str) -> list[int]:
    """SG,... for --decode-coop: subgroup counts, each 8 or 16."""
    counts = [item.strip() for item in text.split(",")]
    if not all(c in ("8", "16") for c in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: give subgroup counts, each 8 or 16, e.g. 16,8")
    return [int(c) for c in counts]


def print_statistics(dev, kernel, title: str, defines: dict) -> None:
    """Create `kernel`'s pipeline (with `defines` over its own) with statistics capture; print them."""
    spirv = compile_shader(kernel.shader, {**kernel.defines, **defines})
    supported, executables = compute_pipeline_statistics(spirv, kernel.bindings, 4 * kernel.push_words,
                                                         kernel.spec, dev.info.index)
    print(title)
    if not supported:
        print("  (pipeline created; this driver reports no statistics: VK_KHR_pipeline_executable_properties)")
    for name, stats in executables:
        print(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in stats.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--forward", action="append", type=parse_tiles, default=[], metavar="TILES")
    ap.add_argument("--backward", action="append", type=parse_tiles, default=[], metavar="TILES")
    ap.add_argument("--gemm", action="store_true", help="also the step's GEMMs")
    ap.add_argument("--coop", action="store_true", help="the sweeps' products on tensor cores (fp16)")
    ap.add_argument("--coop-gemm", action="store_true",
                    help="the tensor-core GEMM's candidate tiles (tools/bench_gemm.py) at the input projection, fp16")
    ap.add_argument("--split", action="store_true",
                    help="the float32 forward from float16 splits on tensor cores (CATCHAT_STREAM32_SPLIT)")
    ap.add_argument("--resident-split", action="store_true",
                    help="the register-resident fp32 forward from float16 splits (CATCHAT_RESIDENT_SPLIT)")
    ap.add_argument("--stream-backward", action="store_true",
                    help="the streamed fp16 backward sweep with and without its bias sums (BIAS_SUMS)")
    ap.add_argument("--decode", action="store_true", help="generation's decode layer and head per stream tile")
    ap.add_argument("--decode-batch", type=int, default=64, help="streams for --decode(-coop) (default 64)")
    ap.add_argument("--decode-coop", type=parse_subgroups, default=[], metavar="SG,...",
                    help="the tensor-core decode layer at at most SG subgroups a workgroup (8 or 16)")
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    cfg = cfgmod.load(args.config, args.overrides)
    dev = open_device(args.device)
    B, H = cfg.data.batch_lanes, cfg.model.hidden
    print(f"{args.config}: B={B} H={H} on {dev.info.name}")
    pairs = [(None, None)] + [(t, None) for t in args.forward] + [(None, t) for t in args.backward]
    for ft, bt in pairs:
        fwd, bwd = sweep_kernels(dev, B, H, ft, bt, args.coop)
        for kernel, given in ((fwd, ft), (bwd, bt)):
            if (ft or bt) and given is None:
                continue  # a candidate run shows only the sweep it changes
            if not isinstance(kernel.tiles, gru.ResidentTiles):
                print(f"{kernel.shader}: tiles {kernel.tiles} are not register-resident here; nothing to show")
                continue
            print_statistics(dev, kernel, f"{kernel.shader} {kernel.tiles}: {kernel.spec[0]} threads, estimated "
                             f"{gru.resident_registers(kernel.tiles, kernel.backward)} registers per thread",
                             {"PERSISTENT": 1})
    if args.stream_backward:
        for sums in (False, True):
            k = stream_backward(dev, B, H, sums)
            print_statistics(dev, k, f"{k.shader} {k.tiles}: {k.spec[0]} threads, bias sums "
                             f"{'on' if sums else 'off'}", {"PERSISTENT": 1})
    for name, kw in (("split", {"split": True}), ("resident split", {"resident_split": True})):
        if getattr(args, name.replace(" ", "_")):
            fwd, _ = sweep_kernels(dev, B, H, **kw)
            print_statistics(dev, fwd, f"{fwd.shader} ({name}) {fwd.tiles}: {fwd.spec[0]} threads", {"PERSISTENT": 1})
    if args.gemm:
        for name, (kw, _) in bench_gemm.shapes(cfg, dev).items():
            for vec4 in (True, False):
                g = gemm.Gemm(dev, vec4=vec4, **kw)
                loads = "vec4" if g.vec4_a or g.vec4_b else "float"
                print_statistics(dev, g, f"gemm, {name}: {g.tiles}, {g.tiles.threads} threads, {loads} loads", {})
    if args.coop_gemm and gemm.coopmat_runs(dev):
        kw, _ = bench_gemm.shapes(cfg, dev)["input projection"]
        for t in gemm.coop_candidates(dev, (False, True)):
            g = gemm.Gemm(dev, tiles=t, precision="fp16", coopmat=True, **kw)
            print_statistics(dev, g, f"{t.shader}, input projection: {t}, {t.threads} threads", {})
    if args.decode:
        for tile in (8, 16, 32):
            layer, head = decode_kernels(dev, cfg, args.decode_batch, tile)
            print_statistics(dev, layer, f"{layer.shader}, {args.decode_batch} streams: tile {layer.shape.tile}, "
                             f"{layer.shape.workgroup} threads", {})
        print_statistics(dev, head, f"{head.shader}, {args.decode_batch} streams: {head.kp} k parts of "
                         f"{head.k_per_part}, {head.streams} streams a workgroup", {})
    for sg in args.decode_coop:
        k = decode_coop_kernel(dev, cfg, args.decode_batch, sg)
        print_statistics(dev, k, f"{k.shader}, {args.decode_batch} streams: {k.shape.workgroup} threads "
                         f"({sg} subgroups at most), {k.shape.ks} k parts", {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
