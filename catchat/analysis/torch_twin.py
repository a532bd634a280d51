"""The PyTorch twin of catchat's model, for the comparison rows of `catchat bench --compare-torch`,
tools/bench_generate.py and the speedrun's PyTorch row: `torch_model` alone, `bench_torch` its
throughput. torch is imported only when asked for (it is no dependency of catchat).
"""

from __future__ import annotations

import math

import numpy as np

from catchat import config as cfgmod
from catchat.analysis.timing import step_times, timed

TORCH_MODES = (("fp32", "FP32 (TF32 off)"), ("tf32", "TF32"), ("amp_fp16", "AMP fp16"), ("amp_bf16", "AMP bf16"))
# PyTorch's rows warm up and time at least this many steps, whatever catchat's --warmup and --steps: its
# AMP rows moved by 27-63% between H100 calls of `catchat bench --steps 2-4 --warmup 1` (2026-12-06) while
# catchat's own moved by under 1%, and one warmup step leaves a fresh model's first-use costs (the caching
# allocator's growth, the library's kernel choices) for the timed steps. Each row also records its slowest
# and fastest step, so a call's spread shows beside the median.
TORCH_MIN_WARMUP, TORCH_MIN_STEPS = 3, 5


def torch_status() -> tuple[bool, str]:
    """(usable, a line saying which torch and GPU, or why the comparison cannot run)."""
    try:
        import torch
    except ImportError as e:
        return False, f"torch is not importable ({e}); install a CUDA build of torch to compare"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} has no CUDA device here (the comparison runs on CUDA only)"
    return True, f"torch {torch.__version__} on {torch.cuda.get_device_name()}"


def torch_model(spec, dev):
    """The architecture in PyTorch, as torch users would write it (default init): per layer an
    nn.GRU + residual + nn.RMSNorm, a linear head without bias. `forward(tok [T, B], h0: L x [B, H])`
    runs a window (logits [T, B, V], the last states); `step(tok [B], hs: L x [1, B, H])` is one
    decode step (logits [B, V], new hs). The one PyTorch twin of the benchmarks (catchat bench,
    tools/bench_generate.py)."""
    import torch
    import torch.nn.functional as F

    H, L, V = spec.hidden, spec.layers, spec.vocab_size

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, H)
            self.grus = torch.nn.ModuleList(torch.nn.GRU(H, H) for _ in range(L))
            self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(H, eps=spec.norm_eps) for _ in range(L))
            self.head = torch.nn.Linear(H, V, bias=False)

        def forward(self, tok, h0):
            x = self.emb(tok) * math.sqrt(H)
            hs = []
            for g, norm, h in zip(self.grus, self.norms, h0):
                o, hT = g(x, h[None].to(x.dtype))
                x = norm(x + F.dropout(o, 0.0, self.training))
                hs.append(hT[0])
            return self.head(x), hs

        def step(self, tok, hs):
            x = (self.emb(tok) * math.sqrt(H))[None]  # [1, B, H]
            new = []
            for g, norm, h in zip(self.grus, self.norms, hs):
                o, h = g(x, h)
                x = norm(x + o)
                new.append(h)
            return self.head(x[0]), new  # [B, V]

    return Model().to(dev)


def bench_torch(cfg, steps: int, warmup: int, mode: str = "fp32") -> dict:
    """PyTorch's figures at cfg in `mode` (TORCH_MODES): FP32 with TF32 off, TF32, or autocast to
    fp16 (with a GradScaler) or bf16 around the forward pass and the loss."""
    import torch
    import torch.nn.functional as F

    tf32 = mode == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    amp = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(mode)
    dev = torch.device("cuda")
    H, L, V = cfg.model.hidden, cfg.model.layers, cfgmod.model_spec(cfg).vocab_size
    T, B = cfg.data.window, cfg.data.batch_lanes

    model = torch_model(cfgmod.model_spec(cfg), dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=cfg.train.weight_decay, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=mode == "amp_fp16")
    tok = torch.randint(1, V, (T, B), device=dev)
    tgt = torch.randint(1, V, (T, B), device=dev)
    h0 = [torch.zeros(B, H, device=dev) for _ in range(L)]

    def autocast():
        return torch.autocast("cuda", dtype=amp, enabled=amp is not None)

    def train_step():
        with autocast():
            logits, _ = model(tok, h0)
            loss = F.cross_entropy(logits.reshape(-1, V).float(), tgt.reshape(-1),
                                   label_smoothing=cfg.train.label_smoothing)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip or 1e9)
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()

    def eval_step():
        with torch.no_grad(), autocast():
            model(tok, h0)
        torch.cuda.synchronize()

    for _ in range(max(warmup, TORCH_MIN_WARMUP)):
        train_step()
    torch.cuda.reset_peak_memory_stats()
    steps = max(steps, TORCH_MIN_STEPS)
    step_s = step_times(train_step, steps)
    peak = torch.cuda.max_memory_allocated()
    eval_s = timed(eval_step, steps)
    median = float(np.median(step_s))
    return dict(train_tokens_per_s=T * B / median, step_ms=median * 1e3, eval_tokens_per_s=T * B / eval_s,
                device_bytes=peak, step_ms_min=min(step_s) * 1e3, step_ms_max=max(step_s) * 1e3, steps=steps)
