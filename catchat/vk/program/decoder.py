"""Generation on the device: K tokens per submit, sampled and fed back without the host.

A `Decoder` sits beside a forward-only `Program` (whose parameters, layer-0 table and carried
state it shares) and owns the decode state: the next input token, the last logits and a few words
per stream (done, tokens generated, forced tokens taken), the call's settings and the n-gram
history. A call is one start sequence (upload the settings, take the carry, make the first
choice), a first chunk that ends a few choices after the forced tokens (`first_chunk`: the first text
reaches the host then), and then chunks of K steps, two recorded chunk sequences used in turn so one
runs while the host reads the other's tokens. The host never sees logits inside a call; it reads back only
the chosen tokens (NONE where a stream emitted nothing: it was being fed known tokens, or had
stopped).

A step is one of six programs of the same model (CATCHAT_DECODE chooses; by default `decode_kind`'s
rule: at precision fp16 coop from 4 streams (2 above H = 1024) where the device has tensor cores and fused16 for one
stream where H >= 1024; below H = 1024 where the device shows the persistent grid co-resident, persistent
at one stream (persistent16 at two at fp16); else from the H200's measurements, batched from 32 streams
where H >= 1024, else fused):
- fused (`FusedStep`): a dispatch per layer (glsl/decode_layer.comp: the norm of the layer below,
  both projections, the GRU cell, the residual in one pass over the layer's weights), the head
  and the choice, on a ping-pong state of its own. The latency race: batch 1.
- fused16 (`FusedStep(kind="fused16")`): the same kernels reading float16 copies of the weights (half
  the bytes of a step that reads every weight from memory) with the coop step's numerics: its
  products' operands rounded to float16, float32 sums. The race at batch 1 where the weights' bytes
  bound it (v5), not their latency (v3).
- coop (`FusedStep(kind="coop")`): the same dispatches with the layers' products on tensor cores
  (glsl/decode_layer_coop.comp: float16 operands, float32 sums, as an fp16 training step's), every
  weight read once per step for up to 64 streams.
- batched (`BatchedStep`): the batched forward's own kernels at T = 1 (a second forward-only
  Program, its weights copied from the first at each call's start): the input projections as
  GEMMs, the recurrent sweeps (register-resident or streamed where the training sweeps are),
  the norms, the head; then DecodeCarry (glsl/decode_carry.comp: the new state and logits kept
  for the streams still live) and the choice, which writes the next step's resets beside its
  token. Each weight is read once per step for every stream: the throughput race, batch 64.
- persistent, persistent16 (`PersistentStep`): fused's and fused16's kernels with a chunk of steps in
  one dispatch (glsl/decode_persistent.comp: their bodies with a grid barrier between stages), the same
  bits. The latency race below H = 1024, where a step's L + 2 dependent dispatches cost more than the
  work: batch 1 (and 2 at fp16).

    dec = Decoder(prog, chunk=64, history_cap=1024)
    for rows in dec.run(settings, forced, logits, steps):  # rows [k, B] uint32, k = 1 then K
        ...
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from catchat.errors import UsageError
from catchat.vk import slots
from catchat.vk.device import host_view
from catchat.vk.kernels import Axpby
from catchat.vk.kernels.decode import (
    DecodeCarry,
    DecodeHead,
    DecodeLayer,
    DecodeLayerCoop,
    DecodeSample,
    coop_decode_ok,
)
from catchat.vk.kernels.decode_persistent import DecodePersistent, PersistentPlan, steps_within_loop_limit
from catchat.vk.kernels.gemm_tiles import coopmat_runs
from catchat.vk.program import sequences as sq
from catchat.vk.switches import env_override

NONE = 0xFFFFFFFF  # an output slot where the stream emitted no token
DEFAULT_CHUNK = 64  # tokens per submit on a GPU: the submit's cost (~0.5 ms on an H200) spread over 64 steps
# A call's first chunk stops this many choices after its forced tokens (`first_chunk`), so the first text
# reaches the host a few steps after the prompt instead of a whole chunk later (v5 at 64 streams on an H100:
# 64 steps of 0.22 ms, 15-25 ms to the first character of a call against a CUDA graph's 8.9).
FIRST_CHOICES = 2
CPU_CHUNK = 16  # on a CPU device a step costs ~0.5 ms: a shorter chunk keeps the first character quick
DECODE_ENV = "CATCHAT_DECODE"  # one of DECODE_KINDS, or unset / "auto": the decode step's program
DECODE_KINDS = ("fused", "fused16", "batched", "coop", "persistent", "persistent16")
HALF_KINDS = ("fused16", "coop", "persistent16")  # on float16 operands (float16 arithmetic and 16-bit storage)
PERSISTENT_KINDS = ("persistent", "persistent16")  # a chunk in one dispatch: fused and fused16 with grid barriers
# Where the batched step wins (H200, 2026-12-05, device us per step, docs/generation.md): v5 (H = 2048)
# 858 against the fused step's 1,535 at 32 streams and 990 against 2,992 at 64, but 826 against 414 at
# 8; v3 (H = 512) never (194 against 181 at 64). The fused kernel reads the weights once per tile of
# 8 streams, so its cost grows with B x H^2; the batched step's is near flat in B.
BATCHED_MIN_STREAMS, BATCHED_MIN_HIDDEN = 32, 1024
# At fp16, the tensor-core step where it wins (H100, 2026-12-05, device us per step,
# docs/results/2026-12-05-h100-catchat-v{3,5}-gen-coop-ring.json against -gen-coop.json's fused and
# batched rows): v3 48.5 against the fused step's 96.9 at 8 streams and 79.7 against 160.4 (batched)
# at 64; v5 156.3 against 439.8 at 8 and 295.6 against 633.9 at 64; but at 1 stream the fused step
# wins (v3 32.3 against 44.3, v5 120.3 against 146.2). Between 2 and 7 streams at v5 (H100, 2026-12-06,
# docs/results/2026-12-06-h100-catchat-v5-gen-small.json, chars/s): coop 18,786 / 36,072 at 2 / 4 streams
# against fused16's 16,065 / 15,816 (its layers ~35 us a step from 1 to 8 streams); so above H = 1024
# from 2 streams. Up to it (v3, H100, 2026-12-06, -v3-gen-small.json, chars/s): coop 94,128 against the
# fused step's 68,464 at 4 streams, but 48,772 against 52,556 at 2 (layers 9-12 us a step either way);
# so from 4 streams.
COOP_MIN_STREAMS, COOP_MIN_STREAMS_WIDE, COOP_WIDE_HIDDEN = 4, 2, 1024
# At fp16 and 1 stream, the fused step on float16 copies of the weights where the layers are bound by
# the weights' bytes (H100, 2026-12-05, docs/results/2026-12-05-h100-catchat-v5-gen-fused16.json): v5
# 11,381 chars/s against the fused step's 8,535 (layers 17-29 us against 23-40), but at 4 streams
# 13,565 against 16,660, and v3 (H = 512, bound by latency) 35,829 against 36,795 at 1 stream. On float16
# shadows rounded once where written (decode_layer.comp's HALF, H100, 2026-12-06, -gen-small.json): v5
# 11,379 at 1 stream, 16,065 / 15,816 at 2 / 4, where the tensor-core step makes 18,786 / 36,072
# (COOP_MIN_STREAMS_WIDE above): so still one stream.
FUSED16_MAX_STREAMS, FUSED16_MIN_HIDDEN = 1, 1024
# A chunk in one dispatch, in L grid crossings a step (H100, 2026-12-07, one call with torch's float16 graph:
# docs/results/2026-12-07-h100-catchat-v{3,5}-gen-persistent.json; chars/s, device us a step): v3 (H = 512)
# at 1 stream persistent 45,826 (16.9 us) against persistent16 42,443 (18.3) and fused 35,716 (32.9);
# at 2 streams persistent 61,892 (23.6) against persistent16 56,412 and fused 53,132. v5 (H = 2048) at
# 1 stream persistent16 12,284 (73.9) against fused16 11,474 (91.5), and at fp32 persistent 10,026 (93.5)
# against fused 8,655 (119.7); at 2 streams persistent 16,756 against fused 13,674 (at fp16 the
# tensor-core step starts there: COOP_MIN_STREAMS_WIDE). So where the grid is shown co-resident, a
# chunk up to PERSISTENT_MAX_STREAMS streams: on float16 weights (persistent16) at fp16 where H >=
# FUSED16_MIN_HIDDEN (the weights' bytes bound the layers) and the device has float16, else persistent.
PERSISTENT_MAX_STREAMS = 2


def default_chunk(dev) -> int:
    """Tokens per submit when the caller does not choose."""
    return CPU_CHUNK if dev.info.type == "CPU" else DEFAULT_CHUNK


def first_chunk(K: int, forced: int) -> int:
    """Steps of a call's first chunk: the forced tokens the start's choice leaves (forced - 1), then
    FIRST_CHOICES choices, rounded up to even (a chunk ends on state half 0), at most K."""
    k = max(0, forced - 1) + FIRST_CHOICES
    return min(K, k + k % 2)


def decode_kind(B: int = 1, H: int = 0, environ=os.environ, *, precision: str = "fp32",
                tensor_cores: bool = False, float16: bool = False, grid: bool = False) -> str:
    """The decode step a Decoder of B streams at hidden size H records: CATCHAT_DECODE, else (unset or
    "auto") at precision fp16 the tensor-core step from COOP_MIN_STREAMS streams (COOP_MIN_STREAMS_WIDE
    above H = COOP_WIDE_HIDDEN) where the device has tensor cores and H is whole fragments; then, where the
    persistent step's `grid` is shown co-resident, a chunk in one dispatch up to PERSISTENT_MAX_STREAMS
    streams (persistent16 at fp16 where H >= FUSED16_MIN_HIDDEN and the device has float16 arithmetic and
    storage, else persistent); then fused16 up to FUSED16_MAX_STREAMS streams where H >= FUSED16_MIN_HIDDEN
    and the device has float16; else batched from BATCHED_MIN_STREAMS streams where H >= BATCHED_MIN_HIDDEN,
    else fused. Only fp16 rounds the products' operands to float16 (the coop, fused16 and persistent16
    steps; the batched step's GEMMs)."""
    raw = environ.get(DECODE_ENV, "").strip() or "auto"
    if raw == "auto":
        wide = H > COOP_WIDE_HIDDEN
        if (precision == "fp16" and tensor_cores and coop_decode_ok(H)
                and B >= (COOP_MIN_STREAMS_WIDE if wide else COOP_MIN_STREAMS)):
            return "coop"
        half_weights = precision == "fp16" and float16 and H >= FUSED16_MIN_HIDDEN
        if grid and B <= PERSISTENT_MAX_STREAMS:
            return "persistent16" if half_weights else "persistent"
        if half_weights and B <= FUSED16_MAX_STREAMS:
            return "fused16"
        return "batched" if B >= BATCHED_MIN_STREAMS and H >= BATCHED_MIN_HIDDEN else "fused"
    if raw not in DECODE_KINDS:
        raise UsageError(f"{DECODE_ENV}={raw!r} is not a decode step",
                         f"set {DECODE_ENV} to one of {', '.join(DECODE_KINDS)} or auto, or unset it")
    if raw == "coop" and not coop_decode_ok(H):
        raise UsageError(f"{DECODE_ENV}=coop needs a hidden size that is a multiple of 16, not {H}",
                         f"set {DECODE_ENV} to fused, batched or auto")
    return raw


def device_decode_kind(dev, B: int, H: int, V: int, precision: str) -> str:
    """`decode_kind` for a Generator of B streams at precision on dev (its tensor cores and float16 support
    asked about at fp16, the only precision that uses them; the persistent step's grid for vocabulary V)."""
    half = precision == "fp16"
    return decode_kind(B, H, precision=precision, tensor_cores=half and coopmat_runs(dev),
                       float16=half and dev.runs_float16, grid=PersistentPlan.of(dev, H, B, V).grid > 1)


def decode_step(kind: str):
    """Decoders made inside record `kind`'s step (CATCHAT_DECODE set, then restored)."""
    return env_override(DECODE_ENV, kind)


class OwnStateStep:
    """What the decode kernels' steps (fused, fused16, coop, persistent, persistent16) keep of their own:
    a ping-pong state [2, L, B, H] (step k reads half k % 2), each layer's x + h and the next token, the
    state taken from the Program's carry at a call's start (`start_ops`, then the kernels' own start,
    `self.layer.start_ops()`) and given back after each chunk (`end_ops`)."""

    def __init__(self, prog):
        dev, b, s, B = prog.dev, prog.buffers, prog.spec, prog.B
        n = s.layers * B * s.hidden
        self.state, self.ysum = dev.tensor(2 * n), dev.tensor(n)
        self.token, self.resets, self.upload, self.download = dev.tensor(B, np.uint32), None, [], []
        self.from_carry, self.to_carry = Axpby(dev, b.h0, self.state, n), Axpby(dev, self.state, b.h0, n)

    def start_ops(self) -> list:
        return [self.from_carry(1.0, 0.0)] + self.layer.start_ops()

    def end_ops(self) -> list:
        return [self.to_carry(1.0, 0.0)]


class FusedStep(OwnStateStep):
    """A dispatch per layer and one for the head (glsl/decode_layer.comp, decode_head.comp: the logits in
    k parts, which the choice adds up) on the step's own state (OwnStateStep). kind
    "fused16": the layers on float16 copies of the weights, which each call's start makes; "coop": the
    layers on tensor cores (glsl/decode_layer_coop.comp), whose float16 weights and state shadow each
    call's start makes after taking the carry."""

    def __init__(self, prog, ctl, kind: str = "fused"):
        super().__init__(prog)
        dev, b, B = prog.dev, prog.buffers, prog.B
        layer_args = (dev, prog.layout, b.params, b.table0, self.state, self.ysum, self.token, ctl)
        self.layer = (DecodeLayerCoop(*layer_args, B=B) if kind == "coop"
                      else DecodeLayer(*layer_args, B=B, half=kind == "fused16"))
        self.head_parts = DecodeHead(dev, prog.layout, b.params, self.ysum, B=B)  # the choice adds its parts

    def groups(self, k: int) -> list[tuple[str, list]]:
        """Step k's dispatches before the choice, by name."""
        layers = [(f"layer {l}", [self.layer.step(l, k % 2)]) for l in range(self.layer.L)]
        return layers + [("head", [self.head_parts.step()])]

    def check(self) -> None:
        """Nothing to check after a chunk: no persistent dispatches."""


class BatchedStep:
    """The batched forward at T = 1 (a forward-only Program of one timestep and the same streams and
    precision, whose tokens and resets the choice writes), then DecodeCarry. Its weights, table0
    and float16 W_hh follow the first Program's at every call's start (a device copy)."""

    def __init__(self, prog, logits, ctl):
        from catchat.vk.program.driver import Program  # the driver does not import the decoder

        dev, b, s, B = prog.dev, prog.buffers, prog.spec, prog.B
        self.one = one = Program(dev, prog.layout, 1, B, training=False, precision=prog.precision)
        b1 = one.buffers
        one._load_hyper({})  # eval: no dropout (uploaded with each call's start)
        self.token, self.resets = b1.tokens, b1.resets  # what the choice writes
        self.head_parts = None  # the choice reads whole logits (DecodeCarry's)
        host_view(b1.resets)[:] = 0
        host_view(b1.stats)[:] = 0  # the persistent sweeps' barrier timeouts: back after each chunk
        self.upload, self.download = [b1.hyper, b1.resets, b1.stats], [b1.stats]
        n = s.layers * B * s.hidden
        self.copy_params = Axpby(dev, b.params, b1.params, prog.layout.total)
        self.from_carry, self.to_carry = Axpby(dev, b.h0, b1.h0, n), Axpby(dev, b1.h0, b.h0, n)
        self.carry = DecodeCarry(dev, b1.hT, b1.h0, b1.logits, logits, ctl, L=s.layers, B=B, H=s.hidden,
                                 V=s.vocab_size)
        dev.recorded(self._weights(), self.upload, []).eval()  # ready before any call (profile may come first)

    def _weights(self) -> list:
        return [self.copy_params(1.0, 0.0)] + self.one.fwd.derived_ops()

    def start_ops(self) -> list:
        return self._weights() + [self.from_carry(1.0, 0.0)]

    def groups(self, k: int) -> list[tuple[str, list]]:
        """Step k's dispatches before the choice, by name: each layer (the embedding with layer 0), and
        the head with DecodeCarry."""
        f = self.one.fwd
        r = f.rows
        layers = [(f"layer {l}", ([r.embedding.op()] if l == 0 else []) + proj.ops() + gru.sweep_ops() + norm.ops())
                  for l, (proj, gru, norm) in enumerate(zip(r.proj, f.gru, r.norm))]
        return layers + [("head", r.head.ops() + [self.carry.step()])]

    def end_ops(self) -> list:
        return [self.to_carry(1.0, 0.0)]

    def check(self) -> None:
        """A persistent sweep whose grid barrier gave up made this chunk's tokens from garbage: say so."""
        self.one._check_sweeps(host_view(self.one.buffers.stats))


class PersistentStep(OwnStateStep):
    """A chunk of steps in one dispatch (DecodePersistent: the fused step's layers, head and choice with a
    grid barrier between stages), on its own state (OwnStateStep); kind "persistent16": on float16 copies
    of the weights as fused16. One chunk kernel per output it chooses into; `d` is the Decoder whose
    buffers the choice reads and writes (ctl, logits, cfg, forced, history, outs)."""

    def __init__(self, prog, d, kind: str = "persistent"):
        super().__init__(prog)
        dev, b, B = prog.dev, prog.buffers, prog.B
        args = (dev, prog.layout, b.params, b.table0, self.state, self.ysum, self.token, d.ctl, d.logits, d.cfg,
                d.forced, d.history)
        first = DecodePersistent(*args, d.outs[1], B=B, history_cap=d.cap, half=kind == "persistent16")
        self.chunks = [first, DecodePersistent(*args, d.outs[2], B=B, history_cap=d.cap, half=first.half,
                                               shared=first.own)]
        self.layer = first  # its layers' shape and grid (Generator.layer_shape), and its start
        self.head_parts, self.download = None, [first.stats]

    def chunk(self, out: int, K: int):
        """The dispatch of K steps choosing into outs[out] (1 or 2)."""
        return self.chunks[out - 1].chunk(K)

    def check(self) -> None:
        """A grid barrier that gave up made this chunk's tokens from garbage: say so."""
        self.chunks[0].check()


class Decoder:
    """The decode state and sequences for `prog`'s model and streams (prog: a forward-only Program)."""

    def __init__(self, prog, chunk: int = DEFAULT_CHUNK, history_cap: int = 1, forced_cap: int | None = None):
        if chunk < 2 or chunk % 2:
            raise ValueError(f"chunk must be an even number >= 2, got {chunk}")
        dev, spec = prog.dev, prog.spec
        self.prog, self.dev, self.spec, self.B, self.K = prog, dev, spec, prog.B, int(chunk)
        self.cap = max(1, int(history_cap))
        self.forced_cap = max(1, int(forced_cap or self.K))
        B, V = self.B, spec.vocab_size
        u32 = np.uint32
        self.kind = device_decode_kind(dev, B, spec.hidden, V, prog.precision)
        if self.kind in HALF_KINDS and not dev.runs_float16:
            raise UsageError(f"{DECODE_ENV}={self.kind} needs float16 arithmetic and 16-bit storage, which "
                             f"{dev.info.name} does not offer", f"set {DECODE_ENV} to fused, batched or auto")
        if self.kind in PERSISTENT_KINDS and dev.loop_limit:  # lavapipe's (the text does not depend on the chunk)
            per_step = PersistentPlan.of(dev, spec.hidden, B, V).loop_iterations(spec.layers, self.cap)
            self.K = steps_within_loop_limit(self.K, per_step, dev.loop_limit)
        self.logits = dev.tensor(B * V)
        self.ctl = dev.tensor(B * slots.DS_WORDS, u32)
        self.cfg = dev.tensor(slots.DC_WORDS, u32)
        self.forced = dev.tensor(self.forced_cap * B, u32)
        self.history = dev.tensor(self.cap * B, u32, kind="storage")
        self.outs = [dev.tensor(B, u32), dev.tensor(self.K * B, u32), dev.tensor(self.K * B, u32)]
        if self.kind == "batched":
            self.step = step = BatchedStep(prog, self.logits, self.ctl)
        elif self.kind in PERSISTENT_KINDS:
            self.step = step = PersistentStep(prog, self, self.kind)
        else:
            self.step = step = FusedStep(prog, self.ctl, kind=self.kind)
        self.token = step.token
        # a call's first choice reads the logits given; a step's adds the fused head's parts into them first
        # (the persistent steps choose inside their chunk's dispatch)
        outs = self.outs[:1] if isinstance(step, PersistentStep) else self.outs
        self.samplers = samplers = [
            DecodeSample(dev, prog.layout, self.logits, self.token, self.ctl, self.cfg, self.forced, self.history, out,
                         B=B, history_cap=self.cap, resets=step.resets, head=None if i == 0 else step.head_parts)
            for i, out in enumerate(outs)]
        inputs = [self.cfg, self.forced, self.logits, self.ctl, self.token] + step.upload
        self.seq_start = sq.record_decode_start(dev, inputs, step.start_ops(), samplers[0], [self.outs[0]])
        self.seq_chunks = [self._record_chunk(1, self.K), self._record_chunk(2, self.K)]
        self.seq_first = {self.K: self.seq_chunks[0]}  # a call's first chunk by its steps (`first_chunk`)

    def _record_chunk(self, i: int, K: int):
        """K steps choosing into rows 0 .. K-1 of outs[i] (with samplers[i], or the persistent step's chunk)."""
        if isinstance(self.step, PersistentStep):
            ops = [self.step.chunk(i, K)]
        else:
            ops = [op for k in range(K) for op in self._step_ops(self.samplers[i], k)]
        return sq.record_decode_chunk(self.dev, ops, K, self.step.end_ops(),
                                      [self.outs[i], self.logits] + self.step.download)

    def _chunk(self, c: int, k0: int):
        """Chunk c of a call whose first chunk is k0 steps: (its sequence, its steps, the output it writes)."""
        if c == 0:
            if k0 not in self.seq_first:
                self.seq_first[k0] = self._record_chunk(1, k0)
            return self.seq_first[k0], k0, self.outs[1]
        return self.seq_chunks[c % 2], self.K, self.outs[1 + c % 2]

    def _groups(self, sample, k: int) -> list[tuple[str, list]]:
        """Decode step k by name: the step's groups, then the choice into row k of sample's output."""
        return self.step.groups(k) + [("choice", [sample.choose(k)])]

    def _step_ops(self, sample, k: int) -> list:
        return [op for _, ops in self._groups(sample, k) for op in ops]

    def _submit(self, seq) -> None:
        self.dev.run(seq.eval_async if self.dev.evals_async else seq.eval, "generation")

    def _wait(self, seq) -> None:
        if self.dev.evals_async:
            self.dev.run(seq.eval_await, "generation")

    def run(self, settings: np.ndarray, forced: np.ndarray | None, logits: np.ndarray | None,
            steps: int) -> Iterator[np.ndarray]:
        """One call: `settings` (uint32 [DC_WORDS], slots.DC_*), `forced` known tokens [n, B] fed first
        (n <= forced_cap), `logits` [B, V] to choose the first token from when nothing is forced.
        Yields each submit's choices, [1, B], then [k0, B] (`first_chunk`: the forced tokens and a few
        choices), then [K, B] (NONE: no token), for up to `steps` choices; the caller stops iterating
        when every stream is done. Every submitted chunk has finished when the generator is closed, and
        the last logits are then in `last_logits()`."""
        B = self.B
        n = 0 if forced is None else len(forced)
        if n > self.forced_cap:
            raise ValueError(f"{n} forced tokens; this decoder takes up to {self.forced_cap} per call")
        if n == 0 and logits is None:
            raise ValueError("nothing to choose from: give logits or forced tokens")
        settings = np.asarray(settings, np.uint32).copy()
        settings[slots.DC_N_FORCED] = n
        host_view(self.cfg)[:] = settings
        if n:
            host_view(self.forced)[: n * B] = np.asarray(forced, np.uint32).reshape(-1)
        host_view(self.logits)[:] = 0.0 if logits is None else np.asarray(logits, np.float32).reshape(-1)
        host_view(self.ctl)[:] = 0
        host_view(self.token)[:] = 0
        self.dev.run(self.seq_start.eval, "the start of generation")
        yield host_view(self.outs[0]).reshape(1, B).copy()
        k0, left = first_chunk(self.K, n), int(steps) - 1
        chunks = 0 if left <= 0 else 1 + -(-max(0, left - k0) // self.K)
        inflight: list[int] = []
        submitted = 0
        try:
            while submitted < min(2, chunks):  # two in flight: one runs while the host reads the other
                self._submit(self._chunk(submitted, k0)[0])
                inflight.append(submitted)
                submitted += 1
            while inflight:
                c = inflight.pop(0)
                seq, k, out = self._chunk(c, k0)
                self._wait(seq)
                self.step.check()
                yield host_view(out)[: k * B].reshape(k, B).copy()
                if submitted < chunks:  # the caller wants more: queue the next behind the one running
                    self._submit(self._chunk(submitted, k0)[0])
                    inflight.append(submitted)
                    submitted += 1
        finally:
            for c in inflight:  # the caller stopped early: let the chunks in flight finish
                self._wait(self._chunk(c, k0)[0])

    def profile(self, steps: int = 8) -> dict[str, float]:
        """Device microseconds per decode step by group ('layer 0', 'layer 1', ..., 'head', 'choice';
        a group's dispatches added up), the median over `steps` steps sampled (temperature 1) from the
        current state, which they advance (GPU timestamps; each time includes the dispatch's wait for
        the one before it)."""
        n_steps = 2 * max(1, steps // 2)
        if isinstance(self.step, PersistentStep):  # the stages are inside one dispatch: the step as a whole
            self._profile_settings(3 * n_steps)
            us = self.dev.op_times_us([self.step.chunk(1, n_steps)] * 3, runs=2)
            return {"step": float(np.median(us)) / n_steps}
        named = [group for k in range(n_steps) for group in self._groups(self.samplers[1], k % self.K)]
        ops = [op for _, group in named for op in group]
        owner = np.array([name for name, group in named for _ in group])
        self._profile_settings(len(ops))
        us = self.dev.op_times_us(ops).reshape(n_steps, -1)
        names = list(dict.fromkeys(name for name, _ in named))
        per_step = owner.reshape(n_steps, -1)[0]
        return {n: float(np.median(us[:, per_step == n].sum(axis=1))) for n in names}

    def _profile_settings(self, length: int) -> None:
        """Every stream live and sampling (temperature 1) for `length` choices: what a call costs."""
        cfg = np.zeros(slots.DC_WORDS, np.uint32)
        cfg[slots.DC_LENGTH] = length
        cfg[slots.DC_INV_TEMP] = slots.f32_bits(1.0)
        cfg[slots.DC_TOP_P] = slots.f32_bits(1.0)
        host_view(self.cfg)[:] = cfg
        host_view(self.ctl)[:] = 0
        self.dev.upload([self.cfg, self.ctl])

    def last_logits(self) -> np.ndarray:
        """The logits [B, V] each stream's last choice was made from (downloaded by every chunk)."""
        return host_view(self.logits).reshape(self.B, self.spec.vocab_size).copy()
