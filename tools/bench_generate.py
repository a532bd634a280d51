#!/usr/bin/env python3
"""Generation speed of catchat: generated characters per second at a config, optionally beside PyTorch.

    python tools/bench_generate.py configs/catchat-v3.toml [--batches 1,64] [--steps 200] [--compare-torch]

For each batch size B (independent streams generated at once) catchat runs its generation loop:
the forward-only T = 1 program on the Vulkan device (embedding, every GRU layer, residual + RMSNorm,
head), logits [B, V] read back, the next character chosen on the host (`generate.choose`,
temperature 0.8), and fed back. Reported: characters/s (B * steps / time), the step split into
the device forward (with the read-back) and the host sampling. Weights are random (init_params):
speed does not depend on them, and no stream stops early (<eos> is not honoured here).

With --compare-torch and a CUDA build of torch, the same architecture generates in PyTorch eager
mode in the same run: per layer an nn.GRU step + residual + nn.RMSNorm, a linear head, softmax and
torch.multinomial on the device (TF32 off). It is timed twice: with no host synchronisation
inside the loop (the fastest eager can go), and with the tokens copied to the host every step
(what streaming text to a terminal needs, as catchat does).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catchat import config as cfgmod  # noqa: E402
from catchat import vocab  # noqa: E402
from catchat.generate import Generator, Sampling, choose  # noqa: E402
from catchat.model import ParamLayout, init_params  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402

TEMPERATURE = 0.8


def bench_catchat(spec, dev, B: int, steps: int, warmup: int) -> dict:
    layout = ParamLayout(spec)
    gen = Generator(dev, layout, layout.flatten(init_params(spec, 0), np.float32), streams=B, prefill=0)
    s = Sampling(temperature=TEMPERATURE)
    rng = np.random.default_rng(0)
    gen.feed(np.array([vocab.BOS], np.uint32))

    def loop(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            nxt = choose(gen.logits, s, rng)
            gen.feed(nxt[None, :])
        return time.perf_counter() - t0

    loop(warmup)
    total = loop(steps)
    tok = np.full((1, B), vocab.FIRST_PRINTABLE, np.uint32)
    t0 = time.perf_counter()
    for _ in range(steps):
        gen.feed(tok)
    fwd = (time.perf_counter() - t0) / steps
    logits = gen.logits
    t0 = time.perf_counter()
    for _ in range(steps):
        choose(logits, s, rng)
    sample = (time.perf_counter() - t0) / steps
    return dict(batch=B, chars_per_s=B * steps / total, step_ms=total / steps * 1e3, forward_ms=fwd * 1e3,
                sample_ms=sample * 1e3)


def bench_torch(spec, B: int, steps: int, warmup: int, device: str) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(device)
    H, L, V = spec.hidden, spec.layers, spec.vocab_size

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, H)
            self.grus = torch.nn.ModuleList(torch.nn.GRU(H, H) for _ in range(L))
            self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(H, eps=spec.norm_eps) for _ in range(L))
            self.head = torch.nn.Linear(H, V, bias=False)

        def step(self, tok, hs):  # tok [B], hs: L x [1, B, H]
            x = (self.emb(tok) * math.sqrt(H))[None]  # [1, B, H]
            new = []
            for gru, norm, h in zip(self.grus, self.norms, hs):
                o, h = gru(x, h)
                x = norm(x + o)
                new.append(h)
            return self.head(x[0]), new  # [B, V]

    model = Model().to(dev).eval()

    def loop(n: int, host_copy: bool) -> float:
        with torch.no_grad():
            tok = torch.full((B,), vocab.BOS, dtype=torch.long, device=dev)
            hs = [torch.zeros(1, B, H, device=dev) for _ in range(L)]
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                logits, hs = model.step(tok, hs)
                probs = torch.softmax(logits / TEMPERATURE, dim=-1)
                tok = torch.multinomial(probs, 1)[:, 0]
                if host_copy:
                    tok.cpu()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            return time.perf_counter() - t0

    loop(warmup, False)
    t_async = loop(steps, False)
    t_sync = loop(steps, True)
    return dict(batch=B, chars_per_s=B * steps / t_async, step_ms=t_async / steps * 1e3,
                chars_per_s_host_copy=B * steps / t_sync, step_ms_host_copy=t_sync / steps * 1e3)


def _torch_device(want: str) -> tuple[str | None, str]:
    """(device, '') when torch can run there, else (None, why not)."""
    try:
        import torch
    except ImportError as exc:
        return None, f"torch is not importable ({exc})"
    if want.startswith("cuda") and not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    name = torch.cuda.get_device_name(torch.device(want)) if want.startswith("cuda") else "cpu"
    return want, f"torch {torch.__version__} on {name}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--batches", default="1,64", help="comma-separated stream counts (default 1,64)")
    ap.add_argument("--steps", type=int, default=200, help="characters generated per stream and timing")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--device", default=None, help="Vulkan device (index or name)")
    ap.add_argument("--compare-torch", action="store_true", help="also time PyTorch eager generation")
    ap.add_argument("--torch-device", default="cuda", help="where torch runs (default cuda)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not batches or min(batches) < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--batches, --steps must be >= 1 and --warmup >= 0")
    cfg = cfgmod.load(args.config, args.overrides)
    spec = cfgmod.model_spec(cfg)
    dev = open_device(args.device)
    print(f"config {args.config}: H={spec.hidden} L={spec.layers} V={spec.vocab_size}; "
          f"{args.steps} characters per stream; Vulkan device {dev.info.name}")
    res: dict = {"config": str(args.config), "hidden": spec.hidden, "layers": spec.layers,
                 "vulkan_device": dev.info.name, "steps": args.steps, "catchat": []}
    for B in batches:
        c = bench_catchat(spec, dev, B, args.steps, args.warmup)
        res["catchat"].append(c)
        print(f"catchat  batch {B:>4}: {c['chars_per_s']:>12,.0f} chars/s  step {c['step_ms']:8.3f} ms "
              f"(device forward + read-back {c['forward_ms']:.3f}, host sampling {c['sample_ms']:.3f})")
    if args.compare_torch:
        where, what = _torch_device(args.torch_device)
        if where is None:
            res["torch_skipped"] = what
            print(f"torch comparison skipped: {what}")
        else:
            res["torch_device"], res["torch"] = what, []
            for B in batches:
                t = bench_torch(spec, B, args.steps, args.warmup, where)
                res["torch"].append(t)
                print(f"torch    batch {B:>4}: {t['chars_per_s']:>12,.0f} chars/s  step {t['step_ms']:8.3f} ms "
                      f"(eager, sampling on the device; with a host copy per step: "
                      f"{t['chars_per_s_host_copy']:,.0f} chars/s, {t['step_ms_host_copy']:.3f} ms)")
            for c, t in zip(res["catchat"], res["torch"]):
                print(f"ratio catchat / torch at batch {c['batch']}: {c['chars_per_s'] / t['chars_per_s']:.2f}x "
                      f"({c['chars_per_s'] / t['chars_per_s_host_copy']:.2f}x against torch with host copies)")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
