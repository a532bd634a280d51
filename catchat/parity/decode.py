"""Generation's decode step and on-device sampling (glsl/decode_layer.comp, both variants;
glsl/decode_layer_coop.comp and decode_layer.comp's HALF (fused16) against their float16-operand twin,
catchat.model.reference.decode;
glsl/decode_head.comp; glsl/decode_sample.comp; the batched step: the forward's kernels at T = 1,
glsl/decode_carry.comp, decode_sample.comp's RESETS) against catchat.model.reference: the state and logits
after feeding tokens (odd H, partial stream tiles, one to three layers, tied head, a <bos> reset
inside), the choice from given logits under every
sampling rule (reference.sample_choice, the same uniforms), and whole generations replayed through
the numpy model (n-gram blocking, stop tokens, lengths).

Choices are compared exactly wherever the twin's margin (the distance of the draw, or of top_p, to
a boundary that would change the choice) exceeds MARGIN; closer rows may pick either neighbour,
because the GPU's float32 exp and sums differ from the float64 twin in the last bits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from catchat import rng as crng
from catchat.data import vocab
from catchat.inference.generate import Generator, Sampling, choose_with_margin
from catchat.model import ModelSpec, ParamLayout, head_name, init_params
from catchat.model import reference as ref
from catchat.model.reference.decode import decode_step_half
from catchat.parity import ParityResult, compare
from catchat.vk.device import Device
from catchat.vk.kernels.gru.stream import FRAG_W_ENV, w_frag_order
from catchat.vk.program.decoder import DECODE_KINDS, HALF_KINDS, PERSISTENT_KINDS, decode_step
from catchat.vk.switches import env_override

ATOL, RTOL = 5e-6, 3e-5  # measured worst: 2.4e-6 abs (lavapipe, tied head, B=70), 9.5e-7 on the H200
MARGIN = 1e-5
# The tensor-core step (coop) against its float16-operand twin: most elements agree to float32 sum order
# (lavapipe: 1e-6), but an operand that lands within a float32 ulp of a float16 rounding boundary rounds
# the other way on one side and moves that stream by up to ~1e-4 (lavapipe worst: 8.6e-5 over 7
# free-running steps, H=32 B=70). The step cases run both twins from the GPU's state each step, so such
# a rounding cannot carry over, and ask the float16 twin to explain the GPU: its median distance at most
# COOP_CLOSER of the float32 twin's. Whole generations cannot be run so (the twin replays its own
# state), hence their wider choice margin.
COOP_ATOL, COOP_RTOL, COOP_MARGIN = 3e-4, 1e-3, 3e-4
COOP_CLOSER = 0.1


def _generator(dev: Device, spec: ModelSpec, B: int, seed: int, chunk: int = 4, peaky: float = 1.0):
    params = init_params(spec, seed)
    head = head_name(spec)
    params[head] = (params[head] * peaky).astype(np.float32)  # sharper distributions exercise top-k/top-p
    layout = ParamLayout(spec)
    return (Generator(dev, layout, layout.flatten(params, np.float32), streams=B, prefill=1, chunk=chunk),
            params)


def _ref_step(params, spec, tok, h, kind: str = "fused"):
    """One token per stream through the numpy model: (logits [B,V], state [L,B,H]); the float16 steps'
    twin (coop, fused16) rounds the products' operands to float16."""
    if kind in HALF_KINDS:
        return decode_step_half(params, spec, tok, h)
    B = tok.shape[0]
    tok = np.asarray(tok, np.uint32)[None, :]
    r = ref.model_forward_backward(params, spec, tok, np.zeros((1, B), np.uint32),
                                   (tok == vocab.BOS).astype(np.uint32), h, 1, need_grads=False)
    return r.logits[0], r.hT


def choices(kernel: str, shape: str, got, expected, margin, min_margin: float = MARGIN) -> ParityResult:
    """Token choices: equal wherever margin > min_margin (max_abs = how many of those differ)."""
    got, expected = np.asarray(got), np.asarray(expected)
    decisive = np.asarray(margin) > min_margin
    wrong = int(np.count_nonzero((got != expected) & decisive))
    return ParityResult(kernel, f"{shape}, {int(decisive.sum())}/{decisive.size} decisive", float(wrong), 0.0,
                        0.0, 0.0, wrong == 0 and decisive.sum() > 0)


def _step_case(dev, H, L, B, tied, seed, kind: str = "fused") -> list[ParityResult]:
    spec = ModelSpec(hidden=H, layers=L, tie_embeddings=tied)
    gen, params = _generator(dev, spec, B, seed)
    rng = np.random.default_rng(seed)
    h0 = rng.standard_normal((L, B, H)).astype(np.float32)
    ids = rng.integers(vocab.FIRST_PRINTABLE, spec.vocab_size, (7, B)).astype(np.uint32)
    ids[3, B // 2] = vocab.BOS  # one stream starts a conversation in the middle: zero state there
    gen.prog.set_carry(h0)
    shape = f"H={H} L={L} B={B}{' tied' if tied else ''}, 7 steps"
    if kind in HALF_KINDS:
        return _half_steps(gen, params, spec, ids, h0, shape)
    got_logits = gen.feed(ids)
    got_h = gen.prog.get_carry()
    h, lg = h0, None
    for t in ids:
        lg, h = _ref_step(params, spec, t, h)
    return [compare("decode step: state", shape, got_h, h, ATOL, RTOL),
            compare("decode step: logits", shape, got_logits, lg, ATOL, RTOL)]


def _half_steps(gen, params, spec, ids, h0, shape) -> list[ParityResult]:
    """A float16 step (coop, fused16) one token at a time, each step's state and logits against both twins run
    from the GPU's own state before it (so a float16 rounding the two sides take apart cannot carry
    into the steps after): within COOP_ATOL / COOP_RTOL of the float16-operand twin, and closer to it
    than to the float32 twin by COOP_CLOSER in the median (a step that rounded nothing would be as
    far from both)."""
    got, half, full = [], [], []
    h = h0
    for t in ids:
        logits = gen.feed(t[None])
        h_gpu = gen.prog.get_carry()
        got.append(np.concatenate([h_gpu.ravel(), logits.ravel()]))
        half.append(np.concatenate([a.ravel() for a in _ref_step(params, spec, t, h, "coop")[::-1]]))
        full.append(np.concatenate([a.ravel() for a in _ref_step(params, spec, t, h)[::-1]]))
        h = h_gpu
    got, half, full = np.stack(got), np.stack(half), np.stack(full)
    n = h0.size  # each step's row: the state [L, B, H], then the logits [B, V]
    to_half, to_full = np.median(np.abs(got - half)), np.median(np.abs(got - full))
    closer = ParityResult("decode step: nearer the float16 twin", f"{shape}, median {to_half:.1e} against "
                          f"{to_full:.1e}", float(to_half), 0.0, 0.0, 0.0, bool(to_half <= COOP_CLOSER * to_full))
    return [compare("decode step: state", shape, got[:, :n], half[:, :n], COOP_ATOL, COOP_RTOL),
            compare("decode step: logits", shape, got[:, n:], half[:, n:], COOP_ATOL, COOP_RTOL), closer]


SAMPLINGS = [Sampling(greedy=True), Sampling(temperature=1.0), Sampling(temperature=0.7, top_k=5),
             Sampling(temperature=1.3, top_p=0.8), Sampling(temperature=0.9, top_k=12, top_p=0.6),
             Sampling(temperature=2.0, top_k=1)]


def _choice_case(dev, B, seed) -> list[ParityResult]:
    """The first choice of a call, from logits given by the host, against the twin."""
    spec = ModelSpec(hidden=16, layers=1)
    gen, _ = _generator(dev, spec, B, seed)
    rng = np.random.default_rng(seed)
    out = []
    for i, s in enumerate(SAMPLINGS):
        logits = (rng.standard_normal((B, spec.vocab_size)) * 3).astype(np.float32)
        logits[:, 7] = logits.max(axis=1)  # a tie at the top: the lower index wins
        gen.logits = logits
        call_seed = crng.derive_seed(seed, i)
        got = [o[0] for o in gen.generate(None, 1, s, seed=call_seed)]
        exp, margin = choose_with_margin(logits, s, crng.decode_uniforms(call_seed, np.arange(B), 0))
        out.append(choices("decode choice", f"B={B} {s.describe()}", got, exp, margin))
    return out


def _generation_case(dev, H, L, B, s: Sampling, length, seed, stops=(vocab.EOS,), kind: str = "fused"
                     ) -> list[ParityResult]:
    """A whole generation, replayed through the numpy model: each token is the twin's choice from
    the numpy logits after the tokens before it (n-gram bans from the stream's own history)."""
    spec = ModelSpec(hidden=H, layers=L)
    gen, params = _generator(dev, spec, B, seed, chunk=6, peaky=8.0)
    prompt = np.array([vocab.BOS] + list(vocab.encode("ROMEO: ").ids), np.uint32)
    outs = gen.generate(prompt, length, s, seed=seed, stop_at=stops)
    h = np.zeros((L, B, H), np.float32)
    for t in prompt:
        lg, h = _ref_step(params, spec, np.full(B, t, np.uint32), h, kind)
    got, exp, margin, ends_ok = [], [], [], True
    for b, o in enumerate(outs):
        hb, lgb = h[:, b:b + 1].copy(), lg[b:b + 1]
        for n, tok in enumerate(o):
            banned = ref.ngram_banned(o[:n], s.ngram_block, spec.vocab_size, stops)[None] if s.ngram_block else None
            c, m = choose_with_margin(lgb, s, crng.decode_uniforms(seed, [b], n), banned)
            got.append(tok)
            exp.append(c[0])
            margin.append(m[0])
            lgb, hb = _ref_step(params, spec, np.array([tok], np.uint32), hb, kind)
        ends_ok &= len(o) == length or (len(o) < length and o[-1] in stops)
        ends_ok &= all(t not in stops for t in o[:-1])
    shape = f"H={H} L={L} B={B} {length} tokens {s.describe()}"
    end = ParityResult("decode generation: stops", shape, 0.0 if ends_ok else 1.0, 0.0, 0.0, 0.0, bool(ends_ok))
    return [choices("decode generation", shape, got, exp, margin, COOP_MARGIN if kind in HALF_KINDS else MARGIN),
            end]


def parity_checks(dev: Device) -> list[ParityResult]:
    """Decode steps at odd sizes and whole generations with blocking and stops, on every decode step
    (the other steps' rows named "(fused16)", "(batched)", "(coop)"; coop's odd H rounded up to 64,
    which takes four k parts; H = 112 walks 7 k fragments through its ring of 3; the persistent steps also
    at H = 640, where a GPU's plan gives them wider workgroups); every sampling rule."""
    out = []
    for kind in DECODE_KINDS:
        def h_(H: int, kind: str = kind) -> int:  # coop: whole 16 x 16 fragments (odd H: 64, four k parts)
            return H if kind != "coop" or H % 16 == 0 else -(-H // 64) * 64

        with decode_step(kind):
            rows = []
            # odd H (no vec4), partial stream tiles (B = 9, 17, 20, 70), L = 1-3, tied heads, a long k walk
            for H, L, B, tied, seed in ((37, 1, 1, False, 1), (48, 3, 3, False, 2), (33, 2, 9, True, 3),
                                        (64, 2, 17, False, 4), (37, 2, 20, False, 11), (64, 3, 70, True, 12),
                                        (96, 1, 16, False, 13), (112, 2, 5, False, 14)):
                rows += _step_case(dev, h_(H), L, B, tied, seed, kind)
            if kind in PERSISTENT_KINDS:  # on a GPU, workgroups of 8 subgroups (a unit each over one per SM)
                rows += _step_case(dev, 640, 2, 1, False, 15, kind)
            rows += _generation_case(dev, h_(40), 2, 3, Sampling(temperature=1.0, ngram_block=3), 60, 7, kind=kind)
            rows += _generation_case(dev, h_(40), 2, 2, Sampling(temperature=0.8, top_k=8, top_p=0.9), 50, 8,
                                     stops=(vocab.EOS, vocab.NEWLINE), kind=kind)
            rows += _generation_case(dev, h_(24), 1, 2, Sampling(greedy=True, ngram_block=2), 40, 9, kind=kind)
            rows += _generation_case(dev, h_(40), 2, 17, Sampling(temperature=1.0, top_k=20), 20, 10, kind=kind)
        tag = "" if kind == "fused" else f" ({kind})"
        out += [replace(r, kernel=r.kernel.replace("decode ", f"decode{tag} ", 1)) for r in rows]
    out += _coop_other_order(dev)
    for B, seed in ((1, 5), (67, 6)):
        out += _choice_case(dev, B, seed)
    return out


def _coop_other_order(dev: Device) -> list[ParityResult]:
    """The tensor-core step with its weights' blocks in the order the default does not use (`w_frag_order`:
    fragment order or blocks), at a few of the shapes above: partial stream tiles, three layers, a long k walk."""
    frag = not w_frag_order()
    with decode_step("coop"), env_override(FRAG_W_ENV, "1" if frag else "0"):
        rows = []
        for H, L, B, tied, seed in ((48, 3, 3, False, 2), (64, 3, 70, True, 12), (112, 2, 5, False, 14)):
            rows += _step_case(dev, H, L, B, tied, seed, "coop")
        rows += _generation_case(dev, 48, 2, 17, Sampling(temperature=1.0, top_k=20), 20, 10, kind="coop")
    tag = " (coop, W in fragment order)" if frag else " (coop, W in blocks)"
    return [replace(r, kernel=r.kernel.replace("decode ", f"decode{tag} ", 1)) for r in rows]
