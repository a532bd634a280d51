"""catchat's own figures at a config on this device (`catchat bench`; docs/benchmarks.md).

- `bench_catchat`: tokens/s of a training step (forward + backward + optimizer) and of forward-only
  evaluation, the step split into forward / backward / optimizer (each timed as its own recorded
  sequence) and the device memory catchat allocated. Data is random tokens with conversation
  resets, drawn with a text's skew (`text_like`): the embedding's token sums walk each token's rows,
  so their time follows how often the commonest characters occur (uniform tokens hid up to ~4x of
  the token sums' cost on text before their row parts, 2026-12-06).
- `sweep_modes`: how each recurrent sweep runs (shader, tiles, persistent workgroups, and why).
- `profile` (--profile): each group of the micro-batch's dispatches (sweeps, GEMMs, the rest,
  `profile_groups`) timed alone.
"""

from __future__ import annotations

import math
import time

import numpy as np

from catchat import config as cfgmod
from catchat.analysis.timing import NoProgress, timed, timed_sequence
from catchat.model import ParamLayout, init_params
from catchat.precision import INIT_SCALE
from catchat.vk.kernels import Axpby, gru
from catchat.vk.program import sequences
from catchat.vk.program.wavefront import recording_info


def text_like(rng, V: int, tokens, targets, resets):
    """The window with its tokens and targets redrawn with a text's skew: token r (1 <= r < V) with
    probability proportional to 1 / r (Zipf), so the commonest takes ~19% of the rows at V = 101 and
    the next ~10%, as a space (~16%) and 'e' do in the built-in corpus."""
    ids = np.arange(1, V, dtype=np.uint32)
    p = 1.0 / ids
    p /= p.sum()
    return rng.choice(ids, size=tokens.shape, p=p), rng.choice(ids, size=targets.shape, p=p), resets


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
    data = [text_like(rng, spec.vocab_size, *random_window(rng, spec, T, B, pad_frac=0.0)) for _ in range(4)]
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
    progress = progress or NoProgress()
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
    step_s = timed(train_step, steps)
    # the split: each part as its own recorded sequence (hyper/data already uploaded)
    progress.step("forward / backward / optimizer split")
    fwd_s = timed(prog.seq_eval_free.eval if tf < 1 else prog.seq_logits.eval, steps)
    micro_s = timed(prog.seq_first_tf.eval if tf < 1 else prog.seq_first.eval, steps)
    apply_s = timed(prog.seq_apply.eval, steps)
    tokens = T * B
    progress.step(f"evaluation windows ({steps})")
    eval_s = timed(eval_step, steps)
    if want_profile:
        progress.step("profile: each group of the micro-batch alone")
    return dict(train_tokens_per_s=tokens / step_s, step_ms=step_s * 1e3, forward_ms=fwd_s * 1e3,
                backward_ms=(micro_s - fwd_s) * 1e3, optimizer_ms=apply_s * 1e3,
                eval_tokens_per_s=tokens / eval_s, device_bytes=train_bytes, build_s=build_s,
                sweeps=sweep_modes(prog), recording=recording_info(prog.dev, prog.geometry, prog.fwd, prog.bwd),
                profile=profile(prog, steps) if want_profile else None,
                gemm_flop=gemm_flops(prog) if want_profile else None)


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
        on = "tensor cores, VK_KHR_cooperative_matrix" if "KHR" in k.defines else "tensor cores"
        shader = k.shader + ((f" (product on {on} from float16 splits)" if k.split else
                              f" (product on {on})") if k.coop else "")
        out.append(dict(sweep=name, shader=shader, tiles=gru.to_cache(k.tiles), workgroups=k.sweep_workgroups,
                        residency=why))
    return out


def profile_groups(prog, flop: dict | None = None) -> list[tuple[str, str, list]]:
    """The training micro-batch's dispatches in (kind, name, ops) groups, in recorded order:
    kind is "sweep" (the serial per-timestep dispatches), "gemm" or "other". `flop`, if given,
    receives each GEMM group's floating-point operations (2 M N K per product) by name."""
    f, k = prog.fwd, prog.bwd

    def gemms(name: str, *kernels) -> tuple[str, str, list]:
        ks = [g for g in kernels if g is not None]
        if flop is not None:
            flop[name] = sum(2.0 * g.M * g.N * g.K for g in ks)
        return ("gemm", name, [op for g in ks for op in g.ops()])

    groups = [("other", "embedding", [f.rows.embedding.op()])]
    for l, (proj, sweep, norm) in enumerate(zip(f.rows.proj, f.gru, f.rows.norm)):
        groups += [("other", "L0 input projection", proj.ops()) if l == 0 else gemms(f"L{l} input projection", proj),
                   ("sweep", f"L{l} forward sweep", sweep.sweep_ops()), ("other", f"L{l} norm", norm.ops())]
    groups += [gemms("head", f.rows.head),
               ("other", "loss", [k.cross_entropy.op(), f.loss_reduce.op()]),
               gemms("head backward", k.head_dx, k.head_dw)]
    for l, lay in reversed(list(enumerate(k.layers))):
        groups += [("other", f"L{l} norm backward", lay.norm.ops()),
                   ("sweep", f"L{l} backward sweep", lay.gru.sweep_ops()),
                   gemms(f"L{l} weight gradients", *lay.weight_grad_gemms()),
                   ("other", f"L{l} bias gradients", lay.bias_grad_ops())]
        if lay.dx:
            groups.append(gemms(f"L{l} input gradient", lay.dx))
    groups += [("other", "embedding + table0 token sums", k.token_sum_ops()),
               gemms("table0 backward GEMMs", k.table0.dw_ih, k.table0.demb)]
    return groups


def optimizer_groups(prog) -> list[tuple[str, str, list]]:
    """The step's optimizer submit (`sequences.optimizer_groups`: a submit of its own after the
    micro-batches) as (kind "optimizer", name, ops) groups, in recorded order."""
    return [("optimizer", name, ops) for name, ops in sequences.optimizer_groups(prog.fwd, prog.bwd)]


def gemm_flops(prog) -> dict:
    """Each GEMM group's floating-point operations per micro-batch (profile_groups' names)."""
    flop: dict = {}
    profile_groups(prog, flop)
    return flop


def profile(prog, reps: int) -> list[tuple[str, str, float]]:
    """Milliseconds of each group of profile_groups and then of optimizer_groups, each recorded and timed
    as its own sequence (after a training step, so the buffers hold real values; the optimizer's groups
    move the parameters again, which nothing after the profile reads), less the time of a sequence
    holding one trivial dispatch (submit, fence wait and host overhead: ~0.1-1 ms, which would otherwise
    swamp the small groups)."""
    scratch = prog.dev.tensor(1, kind="storage")
    groups = [("baseline", "", [Axpby(prog.dev, scratch, scratch, 1)(0.0, 0.0)])] + profile_groups(prog) \
        + optimizer_groups(prog)
    out = [(kind, name, timed_sequence(prog.dev, ops, max(reps, 5)) * 1e3) for kind, name, ops in groups]
    base = out.pop(0)[2]
    return [(kind, name, max(ms - base, 0.0)) for kind, name, ms in out]
