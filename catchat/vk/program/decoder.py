"""Generation on the device: K tokens per submit, sampled and fed back without the host.

A `Decoder` sits beside a forward-only `Program` (whose parameters, layer-0 table and carried
state it shares) and owns the decode state: a ping-pong hidden state, each layer's x + h, the next
input token, the last logits and a few words per stream (done, tokens generated, forced tokens
taken), the call's settings and the n-gram history. A call is one start sequence (upload the
settings, take the carry, make the first choice) and then chunks of K steps, two recorded chunk
sequences used in turn so one runs while the host reads the other's tokens. The host never sees
logits inside a call; it reads back only the chosen tokens (NONE where a stream emitted nothing:
it was being fed known tokens, or had stopped).

    dec = Decoder(prog, chunk=64, history_cap=1024)
    for rows in dec.run(settings, forced, logits, steps):  # rows [k, B] uint32, k = 1 then K
        ...
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from catchat.vk import slots
from catchat.vk.device import host_view
from catchat.vk.kernels import Axpby
from catchat.vk.kernels.decode import DecodeHead, DecodeLayer, DecodeSample
from catchat.vk.program import sequences as sq

NONE = 0xFFFFFFFF  # an output slot where the stream emitted no token
DEFAULT_CHUNK = 64  # tokens per submit on a GPU: the submit's cost (~0.5 ms on an H200) spread over 64 steps
CPU_CHUNK = 16  # on a CPU device a step costs ~0.5 ms: a shorter chunk keeps the first character quick


def default_chunk(dev) -> int:
    """Tokens per submit when the caller does not choose."""
    return CPU_CHUNK if dev.info.type == "CPU" else DEFAULT_CHUNK


class Decoder:
    """The decode state and sequences for `prog`'s model and streams (prog: a forward-only Program)."""

    def __init__(self, prog, chunk: int = DEFAULT_CHUNK, history_cap: int = 1, forced_cap: int | None = None):
        if chunk < 2 or chunk % 2:
            raise ValueError(f"chunk must be an even number >= 2, got {chunk}")
        dev, b, spec = prog.dev, prog.buffers, prog.spec
        self.prog, self.dev, self.spec, self.B, self.K = prog, dev, spec, prog.B, int(chunk)
        self.cap = max(1, int(history_cap))
        self.forced_cap = max(1, int(forced_cap or self.K))
        L, B, H, V = spec.layers, self.B, spec.hidden, spec.vocab_size
        u32 = np.uint32
        self.state = dev.tensor(2 * L * B * H)
        self.ysum = dev.tensor(L * B * H)
        self.logits = dev.tensor(B * V)
        self.token = dev.tensor(B, u32)
        self.ctl = dev.tensor(B * slots.DS_WORDS, u32)
        self.cfg = dev.tensor(slots.DC_WORDS, u32)
        self.forced = dev.tensor(self.forced_cap * B, u32)
        self.history = dev.tensor(self.cap * B, u32, kind="storage")
        self.outs = [dev.tensor(B, u32), dev.tensor(self.K * B, u32), dev.tensor(self.K * B, u32)]
        common = (prog.layout, b.params, b.table0, self.state, self.ysum, self.token, self.ctl)
        self.layer = DecodeLayer(dev, *common, B=B)
        self.head = DecodeHead(dev, prog.layout, b.params, self.ysum, self.logits, self.ctl, B=B)
        self.samplers = samplers = [
            DecodeSample(dev, prog.layout, self.logits, self.token, self.ctl, self.cfg, self.forced, self.history, out,
                         B=B, history_cap=self.cap) for out in self.outs]
        n = L * B * H  # the carry [L,B,H] is state half 0
        from_carry, to_carry = Axpby(dev, b.h0, self.state, n), Axpby(dev, self.state, b.h0, n)
        inputs = [self.cfg, self.forced, self.logits, self.ctl, self.token]
        self.seq_start = sq.record_decode_start(dev, inputs, from_carry, samplers[0], [self.outs[0]])
        self.seq_chunks = [sq.record_decode_chunk(dev, self.layer, self.head, s, to_carry, self.K,
                                                  [out, self.logits]) for s, out in zip(samplers[1:], self.outs[1:])]

    def _submit(self, seq) -> None:
        self.dev.run(seq.eval_async if self.dev.evals_async else seq.eval, "generation")

    def _wait(self, seq) -> None:
        if self.dev.evals_async:
            self.dev.run(seq.eval_await, "generation")

    def run(self, settings: np.ndarray, forced: np.ndarray | None, logits: np.ndarray | None,
            steps: int) -> Iterator[np.ndarray]:
        """One call: `settings` (uint32 [DC_WORDS], slots.DC_*), `forced` known tokens [n, B] fed first
        (n <= forced_cap), `logits` [B, V] to choose the first token from when nothing is forced.
        Yields each submit's choices, [1, B] then [K, B] (NONE: no token), for up to `steps` choices;
        the caller stops iterating when every stream is done. Every submitted chunk has finished when
        the generator is closed, and the last logits are then in `last_logits()`."""
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
        chunks = -(-(int(steps) - 1) // self.K)
        inflight: list[int] = []
        submitted = 0
        try:
            while submitted < min(2, chunks):  # two in flight: one runs while the host reads the other
                self._submit(self.seq_chunks[submitted % 2])
                inflight.append(submitted)
                submitted += 1
            while inflight:
                c = inflight.pop(0)
                self._wait(self.seq_chunks[c % 2])
                yield host_view(self.outs[1 + c % 2]).reshape(self.K, B).copy()
                if submitted < chunks:  # the caller wants more: queue the next behind the one running
                    self._submit(self.seq_chunks[submitted % 2])
                    inflight.append(submitted)
                    submitted += 1
        finally:
            for c in inflight:  # the caller stopped early: let the chunks in flight finish
                self._wait(self.seq_chunks[c % 2])

    def profile(self, steps: int = 8) -> dict[str, float]:
        """Device microseconds per decode step by kernel ('layer 0', 'layer 1', ..., 'head', 'choice'),
        the median over `steps` steps sampled (temperature 1) from the current state, which they
        advance (GPU timestamps; each time includes the dispatch's wait for the one before it)."""
        names = [f"layer {l}" for l in range(self.spec.layers)] + ["head", "choice"]
        ops = [op for k in range(2 * max(1, steps // 2))
               for op in sq.decode_step_ops(self.layer, self.head, self.samplers[1], k % self.K)]
        cfg = np.zeros(slots.DC_WORDS, np.uint32)  # every stream live and sampling: what a call costs
        cfg[slots.DC_LENGTH] = len(ops)
        cfg[slots.DC_INV_TEMP] = slots.f32_bits(1.0)
        cfg[slots.DC_TOP_P] = slots.f32_bits(1.0)
        host_view(self.cfg)[:] = cfg
        host_view(self.ctl)[:] = 0
        self.dev.upload([self.cfg, self.ctl])
        seq = self.dev.sequence(timestamps=len(ops) + 1)
        for op in ops:
            seq.record(op)
        seq.eval()
        ticks = np.diff(np.asarray(seq.get_timestamps(), np.float64))[: len(ops)].reshape(-1, len(names))
        period_us = self.dev.info.timestamp_period_ns / 1e3
        return {n: float(np.median(ticks[:, i])) * period_us for i, n in enumerate(names)}

    def last_logits(self) -> np.ndarray:
        """The logits [B, V] each stream's last choice was made from (downloaded by every chunk)."""
        return host_view(self.logits).reshape(self.B, self.spec.vocab_size).copy()
