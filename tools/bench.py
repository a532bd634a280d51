#!/usr/bin/env python3
"""Training and forward-only throughput of catchat at a config, optionally beside PyTorch (+cuDNN).

    python tools/bench.py configs/catchat-v3.toml [--steps 10] [--warmup 2] [--compare-torch] [--profile] [--set k=v]

Prints tokens/s for a training step (forward + backward + optimizer) and for forward-only
evaluation, the step split into forward / backward / optimizer (each timed as its own recorded
sequence), and the device memory catchat allocated. With --compare-torch and a CUDA build of torch,
the same architecture runs in PyTorch in the same process: per-layer nn.GRU + residual + RMSNorm +
linear head, label-smoothed cross-entropy, fused AdamW, grad clipping (TF32 off, and on for
information). Data is random tokens with conversation resets: throughput does not depend on text.
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
from catchat.model import ParamLayout, init_params  # noqa: E402
from catchat.parity.model import random_window  # noqa: E402
from catchat.train import step_hyper  # noqa: E402
from catchat.vk.device import open_device  # noqa: E402
from catchat.vk.kernels import Axpby  # noqa: E402
from catchat.vk.program import Program  # noqa: E402


def _timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps runs."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def timed_sequence(dev, ops, reps: int, warmup: int = 1) -> float:
    """Median seconds of one recorded sequence of ops over reps runs, after warmup runs."""
    seq = dev.recorded(ops)
    for _ in range(warmup):
        seq.eval()
    return _timed(seq.eval, reps)


def ready_program(cfg, dev, tf: float = 1.0):
    """The training program for cfg with initial parameters, and (train_step, eval_step): one
    training step / one evaluation window each on random data."""
    spec = cfgmod.model_spec(cfg)
    T, B = cfg.data.window, cfg.data.batch_lanes
    layout = ParamLayout(spec)
    prog = Program(dev, layout, T, B, optimizer=cfg.train.optimizer)
    flat = layout.flatten(init_params(spec, 0))
    prog.set_params(flat)
    prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
    prog.set_carry(None)
    rng = np.random.default_rng(0)
    data = [random_window(rng, spec, T, B, pad_frac=0.0) for _ in range(4)]
    hp = step_hyper(cfg, cfg.train.lr)
    state = {"i": 0}

    def train_step():
        w = data[state["i"] % len(data)]
        state["i"] += 1
        st = prog.train_step([w], hp, global_step=state["i"], tf=tf)
        assert math.isfinite(st.loss)

    def eval_step():
        w = data[state["i"] % len(data)]
        state["i"] += 1
        prog.eval_window(*w)

    return prog, train_step, eval_step


def bench_catchat(cfg, dev, steps: int, warmup: int, tf: float = 1.0, want_profile: bool = False) -> dict:
    T, B = cfg.data.window, cfg.data.batch_lanes
    before = dev.allocated_bytes
    t0 = time.perf_counter()
    prog, train_step, eval_step = ready_program(cfg, dev, tf)
    build_s = time.perf_counter() - t0
    train_bytes = dev.allocated_bytes - before

    for _ in range(warmup):
        train_step()
    step_s = _timed(train_step, steps)
    # the split: each part as its own recorded sequence (hyper/data already uploaded)
    fwd_s = _timed(prog.seq_eval_free.eval if tf < 1 else prog.seq_logits.eval, steps)
    micro_s = _timed(prog.seq_first_tf.eval if tf < 1 else prog.seq_first.eval, steps)
    apply_s = _timed(prog.seq_apply.eval, steps)
    tokens = T * B
    eval_s = _timed(eval_step, steps)
    return dict(train_tokens_per_s=tokens / step_s, step_ms=step_s * 1e3, forward_ms=fwd_s * 1e3,
                backward_ms=(micro_s - fwd_s) * 1e3, optimizer_ms=apply_s * 1e3,
                eval_tokens_per_s=tokens / eval_s, device_bytes=train_bytes, build_s=build_s,
                profile=profile(prog, steps) if want_profile else None)


def profile_groups(prog: Program) -> list[tuple[str, str, list]]:
    """The training micro-batch's dispatches in (kind, name, ops) groups, in recorded order:
    kind is "sweep" (the serial per-timestep dispatches), "gemm" or "other"."""
    f, k = prog.fwd, prog.bwd
    groups = [("other", "embedding", [f.rows.embedding.op()])]
    for l, (proj, gru, norm) in enumerate(zip(f.rows.proj, f.gru, f.rows.norm)):
        groups += [("other" if l == 0 else "gemm", f"L{l} input projection", proj.ops()),
                   ("sweep", f"L{l} forward sweep", gru.sweep_ops()), ("other", f"L{l} norm", norm.ops())]
    groups += [("gemm", "head", f.rows.head.ops()),
               ("other", "loss", [k.cross_entropy.op(), f.loss_reduce.op()]),
               ("gemm", "head backward", k.head_dx.ops() + k.head_dw.ops())]
    for l, lay in reversed(list(enumerate(k.layers))):
        groups += [("other", f"L{l} norm backward", lay.norm.ops()),
                   ("sweep", f"L{l} backward sweep", lay.gru.sweep_ops()),
                   ("gemm", f"L{l} weight gradients", (lay.dw_ih.ops() if lay.dw_ih else []) + lay.dw_hh.ops()),
                   ("other", f"L{l} bias gradients", lay.db_ih.ops() + lay.db_hh.ops())]
        if lay.dx:
            groups.append(("gemm", f"L{l} input gradient", lay.dx.ops()))
    t0 = k.table0
    groups += [("other", "embedding + table0 token sums", [k.embedding.op(), t0.zero(0.0, 0.0), t0.sum.op()]),
               ("gemm", "table0 backward GEMMs", t0.dw_ih.ops() + t0.demb.ops())]
    return groups


def profile(prog: Program, reps: int) -> list[tuple[str, str, float]]:
    """Milliseconds of each group of profile_groups, each recorded and timed as its own sequence
    (after a training step, so the buffers hold real values), less the time of a sequence holding
    one trivial dispatch (submit, fence wait and host overhead: ~0.1-1 ms, which would otherwise
    swamp the small groups)."""
    scratch = prog.dev.tensor(1, kind="storage")
    groups = [("baseline", "", [Axpby(prog.dev, scratch, scratch, 1)(0.0, 0.0)])] + profile_groups(prog)
    out = [(kind, name, timed_sequence(prog.dev, ops, max(reps, 5)) * 1e3) for kind, name, ops in groups]
    base = out.pop(0)[2]
    return [(kind, name, max(ms - base, 0.0)) for kind, name, ms in out]


def print_profile(rows, step_ms: float) -> None:
    print(f"{'group':<34} {'ms':>8}")
    for kind, name, ms in rows:
        print(f"  {name:<32} {ms:8.2f}  {kind}")
    for kind in ("sweep", "gemm", "other"):
        print(f"{kind + ' total':<34} {sum(ms for k, _, ms in rows if k == kind):8.2f}")
    total = sum(ms for _, _, ms in rows)
    print(f"{'sum of groups':<34} {total:8.2f}  (one micro-batch, each group timed alone less a one-dispatch "
          f"sequence's time; the whole step took {step_ms:.1f} ms)")


def bench_torch(cfg, steps: int, warmup: int, tf32: bool) -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dev = torch.device("cuda")
    H, L, V = cfg.model.hidden, cfg.model.layers, 101
    T, B = cfg.data.window, cfg.data.batch_lanes

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, H)
            self.grus = torch.nn.ModuleList(torch.nn.GRU(H, H) for _ in range(L))
            self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(H, eps=1e-6) for _ in range(L))
            self.head = torch.nn.Linear(H, V, bias=False)

        def forward(self, tok, h0):
            x = self.emb(tok) * math.sqrt(H)
            hs = []
            for gru, norm, h in zip(self.grus, self.norms, h0):
                o, hT = gru(x, h[None])
                x = norm(x + F.dropout(o, 0.0, self.training))
                hs.append(hT[0])
            return self.head(x), hs

    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=cfg.train.weight_decay, fused=True)
    tok = torch.randint(1, V, (T, B), device=dev)
    tgt = torch.randint(1, V, (T, B), device=dev)
    h0 = [torch.zeros(B, H, device=dev) for _ in range(L)]

    def train_step():
        logits, _ = model(tok, h0)
        loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), label_smoothing=cfg.train.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip or 1e9)
        opt.step()
        torch.cuda.synchronize()

    def eval_step():
        with torch.no_grad():
            model(tok, h0)
        torch.cuda.synchronize()

    for _ in range(warmup):
        train_step()
    torch.cuda.reset_peak_memory_stats()
    step_s = _timed(train_step, steps)
    peak = torch.cuda.max_memory_allocated()
    eval_s = _timed(eval_step, steps)
    return dict(train_tokens_per_s=T * B / step_s, step_ms=step_s * 1e3, eval_tokens_per_s=T * B / eval_s,
                device_bytes=peak)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default=None)
    ap.add_argument("--compare-torch", action="store_true")
    ap.add_argument("--tf", type=float, default=1.0,
                    help="teacher forcing < 1 times the per-timestep (scheduled-sampling) path")
    ap.add_argument("--profile", action="store_true",
                    help="also time each group of the micro-batch's dispatches (sweeps, GEMMs, the rest)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    cfg = cfgmod.load(args.config, args.overrides)
    dev = open_device(args.device)
    m = cfg.model
    print(f"config {args.config}: H={m.hidden} L={m.layers} B={cfg.data.batch_lanes} T={cfg.data.window} "
          f"optimizer={cfg.train.optimizer} on {dev.info.name}")
    res = {"catchat": bench_catchat(cfg, dev, args.steps, args.warmup, args.tf, args.profile)}
    c = res["catchat"]
    path = f" (per-timestep path, tf={args.tf:g})" if args.tf < 1 else ""
    print(f"catchat{path}  train {c['train_tokens_per_s']:>12,.0f} tok/s  step {c['step_ms']:8.1f} ms "
          f"(forward {c['forward_ms']:.1f}, backward {c['backward_ms']:.1f}, optimizer {c['optimizer_ms']:.1f})  "
          f"eval {c['eval_tokens_per_s']:>12,.0f} tok/s  memory {c['device_bytes'] / 2**30:.2f} GiB")
    if c["profile"]:
        print_profile(c["profile"], c["step_ms"])
    if args.compare_torch:
        try:
            import torch

            if not torch.cuda.is_available():
                raise ImportError("no CUDA device")
        except ImportError as exc:
            print(f"torch comparison skipped: {exc}")
        else:
            for tf32 in (False, True):
                t = bench_torch(cfg, args.steps, args.warmup, tf32)
                res[f"torch_tf32_{'on' if tf32 else 'off'}"] = t
                print(f"torch (TF32 {'on ' if tf32 else 'off'}) train {t['train_tokens_per_s']:>12,.0f} tok/s  "
                      f"step {t['step_ms']:8.1f} ms  eval {t['eval_tokens_per_s']:>12,.0f} tok/s  "
                      f"peak memory {t['device_bytes'] / 2**30:.2f} GiB")
            t = res["torch_tf32_off"]
            print(f"ratio catchat / torch (TF32 off): train {c['train_tokens_per_s'] / t['train_tokens_per_s']:.2f}x, "
                  f"eval {c['eval_tokens_per_s'] / t['eval_tokens_per_s']:.2f}x, "
                  f"memory {c['device_bytes'] / t['device_bytes']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
