"""`catchat bench CONFIG`: training and forward-only throughput on this device, optionally beside
PyTorch, the step split into kernel groups, and tile tuning for this GPU.

- `bench_catchat`: tokens/s of a training step (forward + backward + optimizer) and of forward-only
  evaluation, the step split into forward / backward / optimizer (each timed as its own recorded
  sequence) and the device memory catchat allocated. Data is random tokens with conversation
  resets: throughput does not depend on text. `profile` times each group of the micro-batch's
  dispatches (sweeps, GEMMs, the rest) alone.
- `bench_torch`: the same architecture in PyTorch (per-layer nn.GRU + residual + RMSNorm + linear
  head, label-smoothed cross-entropy, fused AdamW, grad clipping) in the same process, in FP32
  (TF32 off), TF32, and automatic mixed precision with fp16 (with a gradient scaler) and bf16.
- `tune`: for every shape a program of the config asks tile pickers about (catchat/vk/tune.py's
  `recording`), time each candidate the tables list that fits this device (GEMM tiles; sweep tiles:
  register-resident, persistent and per-step), check it computes what the tables' choice does,
  and cache the fastest per device, driver and shape; the pickers use it from then on.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from catchat import config as cfgmod
from catchat.model import ParamLayout, init_params
from catchat.precision import INIT_SCALE
from catchat.vk import slots
from catchat.vk import tune as tunecache
from catchat.vk.device import host_view
from catchat.vk.kernels import Axpby, gemm, gru, half_tensor, run_ops

TORCH_MODES = (("fp32", "FP32 (TF32 off)"), ("tf32", "TF32"), ("amp_fp16", "AMP fp16"), ("amp_bf16", "AMP bf16"))


class _NoProgress:
    """A stand-in for a rich Progress: `step(label)` before each unit of long work."""

    def step(self, label: str) -> None:
        pass


def _timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps runs."""
    times = []
    for _ in range(max(1, reps)):
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
    from catchat.parity.model import random_window
    from catchat.training.step import step_hyper
    from catchat.vk.program import Program

    spec = cfgmod.model_spec(cfg)
    T, B = cfg.data.window, cfg.data.batch_lanes
    layout = ParamLayout(spec)
    prog = Program(dev, layout, T, B, optimizer=cfg.train.optimizer, precision=cfg.train.precision)
    flat = layout.flatten(init_params(spec, 0))
    prog.set_params(flat)
    prog.set_optimizer_state(np.zeros_like(flat), np.zeros_like(flat))
    prog.set_carry(None)
    rng = np.random.default_rng(0)
    data = [random_window(rng, spec, T, B, pad_frac=0.0) for _ in range(4)]
    hp = step_hyper(cfg, cfg.train.lr, INIT_SCALE if cfg.train.precision == "fp16" else 1.0)  # a run's first S
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


def bench_catchat(cfg, dev, steps: int, warmup: int, tf: float = 1.0, want_profile: bool = False,
                  progress=None) -> dict:
    """catchat's figures at cfg on dev (see the module docstring); progress: `step(label)` per phase."""
    progress = progress or _NoProgress()
    T, B = cfg.data.window, cfg.data.batch_lanes
    before = dev.allocated_bytes
    t0 = time.perf_counter()
    progress.step("building the program (shaders compile on first use)")
    prog, train_step, eval_step = ready_program(cfg, dev, tf)
    build_s = time.perf_counter() - t0
    train_bytes = dev.allocated_bytes - before

    progress.step(f"warm-up ({warmup} steps)")
    for _ in range(warmup):
        train_step()
    progress.step(f"training steps ({steps})")
    step_s = _timed(train_step, steps)
    # the split: each part as its own recorded sequence (hyper/data already uploaded)
    progress.step("forward / backward / optimizer split")
    fwd_s = _timed(prog.seq_eval_free.eval if tf < 1 else prog.seq_logits.eval, steps)
    micro_s = _timed(prog.seq_first_tf.eval if tf < 1 else prog.seq_first.eval, steps)
    apply_s = _timed(prog.seq_apply.eval, steps)
    tokens = T * B
    progress.step(f"evaluation windows ({steps})")
    eval_s = _timed(eval_step, steps)
    if want_profile:
        progress.step("profile: each group of the micro-batch alone")
    return dict(train_tokens_per_s=tokens / step_s, step_ms=step_s * 1e3, forward_ms=fwd_s * 1e3,
                backward_ms=(micro_s - fwd_s) * 1e3, optimizer_ms=apply_s * 1e3,
                eval_tokens_per_s=tokens / eval_s, device_bytes=train_bytes, build_s=build_s,
                sweeps=sweep_modes(prog), profile=profile(prog, steps) if want_profile else None)


def sweep_modes(prog) -> list[dict]:
    """How each recurrent sweep of the program runs: shader, tiles, persistent workgroups (0: a
    dispatch per step) and the co-residency reason (None: per step by choice, or forced)."""
    out = []
    kernels = [(f"L{l} forward", k) for l, k in enumerate(prog.fwd.gru)]
    if prog.bwd is not None:
        kernels += [(f"L{l} backward", lay.gru) for l, lay in enumerate(prog.bwd.layers)]
    forced = gru.persistent_override()
    for name, k in kernels:
        res = getattr(k, "residency", None)
        why = res.reason if res else None
        if why is None and forced is not None:
            why = f"CATCHAT_PERSISTENT={forced}"
        elif why is None and not k.sweep_workgroups:
            why = gru.per_step_reason(prog.dev)  # why persistent sweeps are off on this device
        shader = k.shader + (" (product on tensor cores)" if k.coop else "")
        out.append(dict(sweep=name, shader=shader, tiles=gru.to_cache(k.tiles), workgroups=k.sweep_workgroups,
                        residency=why))
    return out


def profile_groups(prog) -> list[tuple[str, str, list]]:
    """The training micro-batch's dispatches in (kind, name, ops) groups, in recorded order:
    kind is "sweep" (the serial per-timestep dispatches), "gemm" or "other"."""
    f, k = prog.fwd, prog.bwd
    groups = [("other", "embedding", [f.rows.embedding.op()])]
    for l, (proj, sweep, norm) in enumerate(zip(f.rows.proj, f.gru, f.rows.norm)):
        groups += [("other" if l == 0 else "gemm", f"L{l} input projection", proj.ops()),
                   ("sweep", f"L{l} forward sweep", sweep.sweep_ops()), ("other", f"L{l} norm", norm.ops())]
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


def profile(prog, reps: int) -> list[tuple[str, str, float]]:
    """Milliseconds of each group of profile_groups, each recorded and timed as its own sequence
    (after a training step, so the buffers hold real values), less the time of a sequence holding
    one trivial dispatch (submit, fence wait and host overhead: ~0.1-1 ms, which would otherwise
    swamp the small groups)."""
    scratch = prog.dev.tensor(1, kind="storage")
    groups = [("baseline", "", [Axpby(prog.dev, scratch, scratch, 1)(0.0, 0.0)])] + profile_groups(prog)
    out = [(kind, name, timed_sequence(prog.dev, ops, max(reps, 5)) * 1e3) for kind, name, ops in groups]
    base = out.pop(0)[2]
    return [(kind, name, max(ms - base, 0.0)) for kind, name, ms in out]


# ------------------------------------------------------------------------------------------ PyTorch
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

    for _ in range(warmup):
        train_step()
    torch.cuda.reset_peak_memory_stats()
    step_s = _timed(train_step, steps)
    peak = torch.cuda.max_memory_allocated()
    eval_s = _timed(eval_step, steps)
    return dict(train_tokens_per_s=T * B / step_s, step_ms=step_s * 1e3, eval_tokens_per_s=T * B / eval_s,
                device_bytes=peak)


# ------------------------------------------------------------------------------------------- tuning
@dataclass
class TuneRow:
    """One shape's measurement: the candidates with seconds (None: failed or computed something
    else), the tables' choice and the winner (None: nothing to choose from)."""

    kind: str
    key: str
    table: object
    candidates: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    winner: object = None

    def micros(self, tiles) -> float | None:
        """Microseconds measured for `tiles` (None: not measured, failed, or no such candidate)."""
        for c, s in zip(self.candidates, self.seconds):
            if tiles is not None and tuple(c) == tuple(tiles) and s is not None:
                return s * 1e6
        return None


def tune_shapes(cfg, dev) -> dict:
    """(kind, key) -> shape for every tile choice the config's training and evaluation programs make
    on dev (built once under catchat/vk/tune.py's `recording`, then dropped)."""
    from catchat.vk.program import Program

    layout = ParamLayout(cfgmod.model_spec(cfg))
    with tunecache.recording() as asked:
        Program(dev, layout, cfg.data.window, cfg.data.batch_lanes, optimizer=cfg.train.optimizer)
    return dict(asked)


def candidates_of(dev, kind: str, shape: dict) -> tuple[object, list]:
    """(the tables' choice, every candidate the tables list that fits dev) for one shape."""
    if kind == "gemm":
        return gemm.table_gemm_tiles(dev, shape["M"], shape["N"], shape["split_k"]), gemm.gemm_candidates(dev)
    args = (dev, shape["B"], shape["H"], shape["backward"], shape["resident"])
    return gru.table_tiles(*args), gru.sweep_candidates(*args)


class SweepCase:
    """Buffers of one B x H recurrent sweep of T steps on random weights (no resets), in the program's
    layout (o holds the state sequence, dGh goes over save), and its sweeps over `persistent`
    workgroups; `half`: W_hh from a float16 copy (HALF_W, `w16`). The tuner's and tools/bench_gru.py's."""

    def __init__(self, dev, B: int, H: int, T: int, persistent: int):
        rng = np.random.default_rng(0)
        self.dev, self.B, self.H, self.T, self.persistent = dev, B, H, T, persistent
        t = dev.tensor
        w = (rng.standard_normal(3 * H * H + 3 * H) / np.sqrt(H)).astype(np.float32)
        self.params, self._w_hh, self._w16 = t(w), w[:3 * H * H], None
        self.gi = t(rng.standard_normal(T * B * 3 * H).astype(np.float32))
        self.do = t((0.01 * rng.standard_normal(T * B * H)).astype(np.float32))
        self.h0, self.hT, self.dh0 = t(B * H), t(B * H), t(B * H)
        self.resets = t(np.zeros(T * B, np.uint32), np.uint32)
        self.o = t((T + 1) * B * H)  # rows [0, T) hprev, [1, T+1) the outputs (catchat/vk/program/plan.py)
        self.save = t(T * B * 4 * H)
        self.dgi = t(T * B * 3 * H)
        self.hyper = t(np.zeros(slots.HP_WORDS, np.uint32), np.uint32)
        self.stats = t(np.zeros(slots.ST_WORDS, np.uint32), np.uint32)
        run_ops(dev, [self.params, self.gi, self.do, self.h0, self.resets, self.hyper, self.stats], [], [])

    @property
    def w16(self):
        """W_hh as float16 for HALF_W, made on first use (the tuner never asks: 3H^2 halves saved)."""
        if self._w16 is None:
            self._w16 = half_tensor(self.dev, self._w_hh)
            run_ops(self.dev, [self._w16], [], [])
        return self._w16

    def forward(self, tiles, half: bool = False):
        return gru.GruForward(self.dev, self.gi, self.params, self.h0, self.resets, self.o, self.o, self.save,
                              self.hT, T=self.T, B=self.B, H=self.H, w_off=0, b_off=3 * self.H * self.H,
                              o_off=gru.state_rows(self.B, self.H), tiles=tiles, persistent=self.persistent,
                              w_half=self.w16 if half else None)

    def backward(self, tiles, half: bool = False):
        return gru.GruBackward(self.dev, self.do, self.save, self.o, self.resets, self.params, self.hyper,
                               self.dgi, None, self.dh0, self.stats, T=self.T, B=self.B, H=self.H, w_off=0,
                               tiles=tiles, persistent=self.persistent, w_half=self.w16 if half else None)


class Measurer:
    """Times tile candidates on random operands, one buffer set per shape; `__call__(kind, shape,
    tiles)` gives seconds per run (a GEMM recorded `gemm_repeat` times in one sequence, a sweep of
    `steps` steps), or None when the candidate failed or computed something other than the first
    candidate of its shape (the tables' choice)."""

    def __init__(self, dev, reps: int = 5, steps: int = 32, gemm_repeat: int = 8):
        self.dev, self.reps, self.steps, self.gemm_repeat = dev, reps, steps, gemm_repeat
        self.rng = np.random.default_rng(0)
        self.shape_key, self.bufs, self.reference = None, None, None

    def _tensor(self, n: int):
        return self.dev.tensor(self.rng.standard_normal(max(1, n)).astype(np.float32))

    def _setup(self, kind: str, shape: dict):
        key = (kind, tuple(sorted(shape.items())))
        if key == self.shape_key:
            return
        self.shape_key, self.reference, dev = key, None, self.dev
        if kind == "gemm":
            M, N, K = shape["M"], shape["N"], shape["K"]
            self.bufs = dict(a=self._tensor(M * K), b=self._tensor(K * N), c=self._tensor(M * N),
                             work=dev.tensor(max(1, shape["split_k"] * M * N), kind="storage"))
            dev.upload([self.bufs[n] for n in "abc"])
            return
        case = SweepCase(dev, shape["B"], shape["H"], self.steps, shape["resident"])
        self.bufs = dict(case=case, stats=case.stats)
        if shape["backward"]:  # the backward reads the save and state sequence of a forward sweep
            run_ops(dev, [], case.forward(None).sweep_ops(), [case.o])

    def _kernel(self, kind: str, shape: dict, tiles):
        """(ops to time, the output tensor)."""
        b = self.bufs
        if kind == "gemm":
            M, N, K, ta, tb = shape["M"], shape["N"], shape["K"], shape["trans_a"], shape["trans_b"]
            k = gemm.Gemm(self.dev, (b["a"], 0, M if ta else K), (b["b"], 0, K if tb else N), (b["c"], 0, N),
                          M, N, K, trans_a=ta, trans_b=tb, split_k=shape["split_k"], tiles=tiles, workspace=b["work"])
            return k.ops(), b["c"]
        case = b["case"]
        if not shape["backward"]:
            return case.forward(tiles).sweep_ops(), case.o
        return case.backward(tiles).sweep_ops(), case.dgi

    def __call__(self, kind: str, shape: dict, tiles) -> float | None:
        self._setup(kind, shape)
        try:
            ops, out = self._kernel(kind, shape, tiles)
        except (ValueError, RuntimeError):
            return None
        host_view(out)[:] = np.nan  # a kernel that writes nothing cannot pass as a match
        self.dev.upload([out])
        n = self.gemm_repeat if kind == "gemm" else 1  # a GEMM recorded n times: the submit's cost spread
        sec = timed_sequence(self.dev, ops * n, self.reps) / n
        stats = self.bufs.get("stats")
        got, *st = run_ops(self.dev, [], [], [out] + ([stats] if stats is not None else []))  # one download
        if st and st[0][slots.ST_SYNC_TIMEOUTS]:
            host_view(stats)[:] = 0
            self.dev.upload([stats])
            return None  # its grid barrier gave up: not all its workgroups were resident
        if self.reference is None:
            self.reference = got
        scale = max(float(np.nanmax(np.abs(self.reference))), 1e-30)
        err = float(np.abs(got - self.reference).max()) / scale
        return sec if np.isfinite(err) and err <= 1e-4 else None


MARGIN = 0.03  # a candidate replaces the tables' choice only when it is this much faster (timing noise)


def tune(cfg, dev, measure=None, progress=None) -> tuple[list[TuneRow], object]:
    """Measure every candidate of every shape the config's programs choose tiles for, cache the
    fastest per shape (catchat/vk/tune.py; the tables' choice unless one is MARGIN faster), and
    return (the rows, the cache file). measure(kind, shape, tiles) -> seconds or None (default: a
    `Measurer`; the tables' choice is timed first, and is the reference the others must match)."""
    progress = progress or _NoProgress()
    progress.step("collecting the config's tile choices")
    shapes = tune_shapes(cfg, dev)
    measure = measure or Measurer(dev, steps=min(cfg.data.window, 128))
    rows, chosen, measured = [], {"gemm": {}, "gru": {}}, {}
    for (kind, key), shape in sorted(shapes.items()):
        table, cands = candidates_of(dev, kind, shape)
        cands = [table] + [c for c in cands if c != table] if table in cands else cands
        row = TuneRow(kind, key, table, cands)
        for c in cands:
            progress.step(f"{kind} {key}: {tuple(c)}")
            row.seconds.append(measure(kind, shape, c) if len(cands) > 1 else None)
        timed = [(s, i) for i, s in enumerate(row.seconds) if s is not None]
        if timed:
            best, i = min(timed)
            base = row.seconds[0] if cands[0] == table else None
            row.winner = table if base is not None and best > base * (1 - MARGIN) else cands[i]
            chosen[kind][key] = [int(v) for v in row.winner] if kind == "gemm" else gru.to_cache(row.winner)
            measured[f"{kind}/{key}"] = [[gru.to_cache(c) if kind == "gru" else [int(v) for v in c],
                                          None if s is None else round(s * 1e6, 2)] for c, s in zip(cands, row.seconds)]
        rows.append(row)
    path = tunecache.store(dev.info, chosen, measured)
    return rows, path


# ------------------------------------------------------------------------------------------ the command
class _Steps:
    """The long work of `catchat bench` as a transient spinner line (at a terminal only)."""

    def __init__(self, console):
        from rich.markup import escape
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=self.console, disable=not self.console.is_terminal, transient=True)
        self.task, self.escape = None, escape

    def __enter__(self):
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def step(self, label: str) -> None:
        self.progress.update(self.task, description=self.escape(label))


def run_command(config_path, overrides, *, steps: int, warmup: int, tf: float, compare_torch: bool,
                want_profile: bool, want_tune: bool, json_path, device, console, err_console) -> None:
    """`catchat bench`: measure, print (tables on `console`, progress on `err_console`), write JSON."""
    import json

    from rich.markup import escape

    from catchat.console import new_table
    from catchat.fsutil import atomic_write_text
    from catchat.vk.device import format_bytes, open_device

    cfg = cfgmod.load(config_path, list(overrides))
    dev = open_device(device)
    m, say = cfg.model, functools.partial(console.print, highlight=False, soft_wrap=True)
    precision = gemm.products(dev, cfg.train.precision)
    say(escape(f"config {config_path}: H={m.hidden} L={m.layers} B={cfg.data.batch_lanes} T={cfg.data.window} "
               f"optimizer={cfg.train.optimizer} precision={precision} on {dev.info.name} "
               f"({dev.info.type}, {dev.info.driver})"))
    res = {"config": str(config_path), "device": dev.info.name, "driver": dev.info.driver}
    with _Steps(err_console) as progress:
        if want_tune:
            rows, path = tune(cfg, dev, progress=progress)
            table = new_table("kind", "shape", "tables' choice", "fastest", "us (tables')", "us (fastest)",
                              title=f"tuned on {dev.info.name}")
            for r in rows:
                fmt = lambda us: "-" if us is None else f"{us:.1f}"  # noqa: E731
                table.add_row(r.kind, r.key, escape(str(tuple(r.table))),
                              escape(str(tuple(r.winner))) if r.winner is not None else "(one candidate)",
                              fmt(r.micros(r.table)), fmt(r.micros(r.winner)))
            console.print(table)
            say(escape(f"cached {sum(r.winner is not None for r in rows)} choices in {path}"))
            res["tune"] = {"cache": str(path), "rows": [
                dict(kind=r.kind, key=r.key, table=list(r.table), winner=None if r.winner is None else list(r.winner),
                     candidates=[list(c) for c in r.candidates], seconds=r.seconds) for r in rows]}
        c = bench_catchat(cfg, dev, steps, warmup, tf, want_profile, progress=progress)
        res["catchat"] = c
        torch_rows = {}
        if compare_torch:
            ok, line = torch_status()
            res["torch_status"] = line
            if ok:
                for mode, label in TORCH_MODES:
                    progress.step(f"torch {label}")
                    try:
                        torch_rows[label] = bench_torch(cfg, steps, warmup, mode)
                    except Exception as e:  # noqa: BLE001 (a mode this torch or GPU lacks: say so, run the rest)
                        torch_rows[label] = {"error": f"{e.__class__.__name__}: {e}".splitlines()[0]}
                res["torch"] = torch_rows
    path_note = f" (per-timestep path, tf={tf:g})" if tf < 1 else ""
    table = new_table("run", "train tok/s", "step ms", "eval tok/s", "memory", "train vs catchat")
    table.add_row(f"catchat{path_note}", f"{c['train_tokens_per_s']:,.0f}", f"{c['step_ms']:.1f}",
                  f"{c['eval_tokens_per_s']:,.0f}", format_bytes(c["device_bytes"]), "1.00x")
    for label, t in torch_rows.items():
        if "error" in t:
            table.add_row(f"torch {label}", "failed", "-", "-", "-", escape(t["error"]))
        else:
            table.add_row(f"torch {label}", f"{t['train_tokens_per_s']:,.0f}", f"{t['step_ms']:.1f}",
                          f"{t['eval_tokens_per_s']:,.0f}", f"{format_bytes(t['device_bytes'])} (peak)",
                          f"{c['train_tokens_per_s'] / t['train_tokens_per_s']:.2f}x")
    console.print(table)
    say(f"step: forward {c['forward_ms']:.1f} ms, backward {c['backward_ms']:.1f} ms, optimizer "
        f"{c['optimizer_ms']:.1f} ms; program built in {c['build_s']:.1f} s")
    if compare_torch and not torch_rows:
        say(escape(f"torch comparison skipped: {res['torch_status']}"))
    for sw in c["sweeps"]:
        mode = (f"one persistent dispatch of {sw['workgroups']} workgroups" if sw["workgroups"]
                else "a dispatch per step")
        why = f" ({sw['residency']})" if sw["residency"] else ""
        kind = "resident tiles" if sw["tiles"][0] == "ResidentTiles" else "tiles"
        say(escape(f"sweep {sw['sweep']}: {sw['shader']}, {kind} {tuple(sw['tiles'][1])}, {mode}{why}"))
    if c["profile"]:
        table = new_table("group", "ms", "kind", title="where a micro-batch goes (each group timed alone)")
        for kind, name, ms in c["profile"]:
            table.add_row(name, f"{ms:.2f}", kind)
        for kind in ("sweep", "gemm", "other"):
            table.add_row(f"{kind} total", f"{sum(ms for k, _, ms in c['profile'] if k == kind):.2f}", "")
        table.add_row("sum of groups", f"{sum(ms for _, _, ms in c['profile']):.2f}", f"step {c['step_ms']:.1f}")
        console.print(table)
    if json_path:
        atomic_write_text(json_path, json.dumps(res, indent=1, default=str) + "\n")
        say(escape(f"wrote {json_path}"))


