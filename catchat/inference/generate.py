"""Sampling from a trained model on the GPU: the tokens chosen and fed back on the device.

A `Generator` keeps the model resident for a batch of streams. Known text (a prompt, the other
speaker's turn) goes through the batched forward a window of `prefill` tokens at a time; the rest,
and everything generated, goes through the decode step (catchat/vk/program/decoder.py): every
layer, the head and the choice of the next token (temperature, top-k, top-p, greedy, n-gram
blocking, stop tokens) on the device, `chunk` tokens per submit, the host reading back only the
chosen tokens. The draws come from the counter RNG keyed by (seed, stream, token number), so the
same seed gives the same text whatever the chunk size; `choose` is the choice's host twin
(catchat.model.reference.sample_choice). docs/generation.md has the rules.

    gen = Generator.from_checkpoint(dev, ck.load_checkpoint("runs/tiny"), streams=4)
    outs = gen.generate(prompt_ids("ROMEO: "), 300, Sampling(temperature=0.7), seed=1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from catchat.data import vocab
from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout
from catchat.model import reference as ref
from catchat.vk import slots
from catchat.vk.program import Program
from catchat.vk.program.decoder import NONE, Decoder, default_chunk

DIALOGUE_NGRAM_BLOCK = 5  # `talk` and `chat` block repeated 5-grams by default; `sample` does not
PREFILL_WINDOW = 64  # tokens per dispatch window when feeding known text


# ---------------------------------------------------------------------------------------------
# Choosing the next token: the settings, their decode words, and the host twin of the device's choice
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. greedy or temperature 0 = argmax; top_k 0 and top_p 1 = off;
    ngram_block N >= 2: no N-gram of generated tokens repeats (0 = off)."""

    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    ngram_block: int = 0

    def __post_init__(self):
        checks = [  # (ok, flag, value, rule)
            (self.temperature >= 0 and np.isfinite(self.temperature), "temperature", self.temperature,
             "a number >= 0 (0 = greedy)"),
            (int(self.top_k) == self.top_k and self.top_k >= 0, "top-k", self.top_k, "an integer >= 0 (0 = off)"),
            (0 < self.top_p <= 1, "top-p", self.top_p, "in (0, 1] (1 = off)"),
            (int(self.ngram_block) == self.ngram_block and (self.ngram_block == 0 or self.ngram_block >= 2),
             "ngram-block", self.ngram_block, "0 (off) or an integer >= 2"),
        ]
        for ok, flag, value, rule in checks:
            if not ok:
                raise UsageError(f"{flag} {value!r} is out of range", f"--{flag} must be {rule}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature <= 0

    @property
    def inv_temperature(self) -> float:
        """1 / temperature as float32 (the device multiplies by it; 0 when greedy)."""
        return 0.0 if self.is_greedy else float(np.float32(1.0 / self.temperature))

    def replace(self, **changes) -> Sampling:
        """A copy with some settings changed (validated)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, greedy=self.greedy,
                    ngram_block=self.ngram_block)


def choose(logits: np.ndarray, s: Sampling, uniforms: np.ndarray, banned: np.ndarray | None = None) -> np.ndarray:
    """The next token per row of logits [B, V] (int64 [B]): the host twin of the device's choice
    (catchat.model.reference.sample_choice; docs/generation.md has the rules).

    <pad> and <bos> are never chosen, nor tokens `banned` [B, V] marks (reference.ngram_banned);
    uniforms [B] are the draws (rng.decode_uniforms for the device's)."""
    return choose_with_margin(logits, s, uniforms, banned)[0]


def choose_with_margin(logits: np.ndarray, s: Sampling, uniforms: np.ndarray,
                       banned: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`choose` and each draw's distance to the nearest boundary (reference.sample_choice's margin:
    parity compares choices exactly only where it is decisive)."""
    z = np.asarray(logits, np.float32)
    allowed = np.ones(z.shape, bool)
    allowed[:, [vocab.PAD, vocab.BOS]] = False
    if banned is not None:
        allowed &= ~np.asarray(banned, bool)
    return ref.sample_choice(z, uniforms, allowed, inv_temp=s.inv_temperature, top_k=s.top_k, top_p=s.top_p,
                             greedy=s.is_greedy)


def stop_tokens(stop_at: Sequence[int] | None) -> list[int]:
    """The tokens that end a stream: `stop_at` and <eos> always; None: none at all (benchmarks)."""
    return [] if stop_at is None else sorted(set(stop_at) | {vocab.EOS})


def decode_settings(s: Sampling, seed: int, length: int, stop_at: Sequence[int] | None) -> np.ndarray:
    """The decode config words (slots.DC_*) of one generation call."""
    w = np.zeros(slots.DC_WORDS, np.uint32)
    w[slots.DC_SEED] = int(seed) & 0xFFFFFFFF
    w[slots.DC_LENGTH] = int(length)
    w[slots.DC_INV_TEMP] = slots.f32_bits(s.inv_temperature)
    w[slots.DC_TOP_K] = int(s.top_k)
    w[slots.DC_TOP_P] = slots.f32_bits(s.top_p)
    w[slots.DC_GREEDY] = int(s.is_greedy)
    w[slots.DC_NGRAM] = int(s.ngram_block)
    for t in stop_tokens(stop_at):
        w[slots.DC_STOP + t // 32] |= np.uint32(1 << (t % 32))
    return w


# ---------------------------------------------------------------------------------------------
# The model on the device
# ---------------------------------------------------------------------------------------------

class Generator:
    """A model resident on the device, generating `streams` texts in parallel, the tokens chosen
    and fed back on the device `chunk` steps per submit (catchat/vk/program/decoder.py).

    `feed` runs known tokens through the model: whole windows of `prefill` tokens through the
    batched forward, the rest through the decode step; `generate` feeds a prompt the same way and
    samples after it. A `<bos>` token always starts from a zero state (as in training: reset = 1)."""

    def __init__(self, dev, layout: ParamLayout, flat_params: np.ndarray, streams: int = 1,
                 prefill: int = PREFILL_WINDOW, chunk: int | None = None, precision: str = "fp32"):
        self.dev, self.layout, self.spec, self.streams = dev, layout, layout.spec, int(streams)
        self.prefill = max(1, int(prefill))
        self.chunk = int(chunk or default_chunk(dev))
        if self.chunk < 2 or self.chunk % 2:
            raise UsageError(f"chunk {self.chunk} is out of range", "give an even number of tokens per submit, >= 2")
        self.prog = Program(dev, layout, self.prefill, self.streams, training=False, precision=precision)
        self._decoder: Decoder | None = None
        self.logits: np.ndarray | None = None  # [streams, V] after the last fed token
        self.set_params(flat_params)

    @classmethod
    def from_checkpoint(cls, dev, ckpt, streams: int = 1, prefill: int = PREFILL_WINDOW,
                        chunk: int | None = None, precision: str = "fp32") -> Generator:
        spec = checkpoint_spec(ckpt)
        from catchat.model import param_specs
        from catchat.run import checkpoint as ck

        ck.check_shapes(ckpt.params, {p.name: p.shape for p in param_specs(spec)}, str(ckpt.path))
        layout = ParamLayout(spec)
        return cls(dev, layout, layout.flatten(ckpt.params, np.float32), streams, prefill, chunk, precision)

    def set_params(self, flat_params: np.ndarray) -> None:
        """Swap in other weights of the same spec (e.g. the trainer's samples at each eval)."""
        self.prog.set_params(np.asarray(flat_params, np.float32))
        self.reset()

    def reset(self) -> None:
        """Forget the context: zero state, nothing fed."""
        self.prog.set_carry(None)
        self.logits = None

    def _decoder_for(self, history: int) -> Decoder:
        """The decoder, rebuilt only when a call needs a longer n-gram history than it holds."""
        if self._decoder is None or history > self._decoder.cap:
            cap = 1 if history <= 1 else max(256, 1 << (history - 1).bit_length())
            self._decoder = Decoder(self.prog, self.chunk, history_cap=cap,
                                    forced_cap=max(self.chunk, self.prefill))
        return self._decoder

    def _stream_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.uint32)
        if ids.ndim == 1:
            ids = np.repeat(ids[:, None], self.streams, axis=1)
        if ids.ndim != 2 or ids.shape[1] != self.streams:
            raise ValueError(f"tokens of shape {ids.shape}: this generator has {self.streams} streams")
        return ids

    def _prefill(self, ids: np.ndarray) -> np.ndarray:
        """Feed whole windows of `ids` [n, streams] through the batched forward; return the rest,
        which the decode step takes (as forced tokens of the next call)."""
        W, pos = self.prefill, 0
        if W > 1:
            resets = (ids == vocab.BOS).astype(np.uint32)  # a conversation starts: zero state (docs/model.md)
            while len(ids) - pos >= W:
                self.logits = self.prog.forward_logits(ids[pos:pos + W], resets[pos:pos + W])[-1]
                pos += W
        dec = self._decoder_for(1)
        while len(ids) - pos > dec.forced_cap:  # more than one call's worth (only when prefill is off)
            self._decode(ids[pos:pos + dec.forced_cap], 0, Sampling(), 0, ())
            pos += dec.forced_cap
        return ids[pos:]

    def _decode(self, forced: np.ndarray, length: int, sampling: Sampling, seed: int, stop_at,
                on_tokens: Callable[[np.ndarray], None] | None = None) -> list[list[int]]:
        """One decoder call: feed `forced` [n, streams], then sample up to `length` tokens per stream."""
        dec = self._decoder_for(length if sampling.ngram_block else 1)
        n = len(forced)
        out: list[list[int]] = [[] for _ in range(self.streams)]
        done = np.zeros(self.streams, bool)
        stops = np.array(stop_tokens(stop_at), np.int64)
        choice = 0  # index of the next row over the whole call
        rows_iter = dec.run(decode_settings(sampling, seed, length, stop_at), forced if n else None,
                            None if n else self.logits, n + max(length, 1))
        try:
            for rows in rows_iter:
                gen = rows[max(0, n - choice):]  # rows after the forced tokens
                choice += len(rows)
                if not len(gen) or length == 0:
                    continue
                made = gen != NONE
                for b in np.flatnonzero(made.any(axis=0)):
                    out[b] += gen[made[:, b], b].tolist()
                if on_tokens is not None:
                    on_tokens(np.where(made, gen, vocab.PAD).astype(np.int64))
                done |= np.isin(gen, stops).any(axis=0) | (np.array([len(o) for o in out]) >= length)
                if done.all():
                    break
        finally:
            rows_iter.close()
        self.logits = dec.last_logits()
        return out

    def profile(self, steps: int = 8) -> dict[str, float]:
        """Device microseconds of one decode step by kernel (GPU timestamps, median of `steps` steps
        run from the current state, which they advance: call reset() before generating again)."""
        return self._decoder_for(1).profile(steps)

    def layer_shape(self) -> dict | None:
        """How the decode step's layer kernel covers the streams (`DecodeShape`'s fields and workgroup
        count; the persistent steps' grid), or None for the batched step: what a benchmark row measured."""
        layer = getattr(self._decoder_for(1).step, "layer", None)  # FusedStep's; BatchedStep has none
        if layer is None:
            return None
        grid = getattr(layer, "grid", None)  # the persistent steps' dispatch: its workgroups run every stage
        return {**dataclasses.asdict(layer.shape), "workgroups": layer.shape.workgroups(self.streams),
                **({"grid": grid} if grid is not None else {})}

    def feed(self, ids) -> np.ndarray:
        """Feed tokens [n, streams] (or [n]: the same for every stream) in order; return the last
        logits [streams, V] (also kept in `self.logits`)."""
        ids = self._stream_ids(ids)
        if len(ids) == 0:
            raise ValueError("feed() needs at least one token")
        rest = self._prefill(ids)
        if len(rest):
            self._decode(rest, 0, Sampling(), 0, ())
        return self.logits

    def generate(self, prompt, length: int, sampling: Sampling, seed: int = 0, *,
                 stop_at: Sequence[int] | None = (vocab.EOS,),
                 on_tokens: Callable[[np.ndarray], None] | None = None) -> list[list[int]]:
        """Feed `prompt` (None: continue after what was fed last), then sample up to `length`
        tokens per stream, chosen on the device. A stream stops at a token in `stop_at` (<eos>
        always; None: no stop token at all, for benchmarks), kept as the last token of its output.
        `on_tokens` sees the tokens as they come, a chunk [k, streams] at a time (<pad> for streams
        that have stopped). The last token of each output is not fed: the state ends just before
        it. N-gram blocking covers each stream's output of this call. The draws are keyed by (seed,
        stream, token number), so the text does not depend on the chunk size."""
        if length < 1:
            raise ValueError("length must be >= 1")
        forced = np.zeros((0, self.streams), np.uint32)
        if prompt is not None and len(prompt):
            forced = self._prefill(self._stream_ids(prompt))
        if self.logits is None and not len(forced):
            raise ValueError("nothing fed yet: give a prompt (at least <bos>)")
        return self._decode(forced, length, sampling, seed, stop_at, on_tokens)


def checkpoint_spec(ckpt) -> ModelSpec:
    """The ModelSpec a checkpoint was trained with (from its stored config)."""
    from catchat import config as cfgmod

    return cfgmod.model_spec(checkpoint_config(ckpt), vocab.VOCAB_SIZE)


def checkpoint_config(ckpt):
    """The resolved training config stored in a checkpoint's state.json."""
    from catchat import config as cfgmod

    return cfgmod.from_dict(ckpt.state["config"], source=str(ckpt.path / "state.json"))


def prompt_ids(text: str, *, start: bool = True) -> np.ndarray:
    """Token ids of a prompt: <bos> (when it starts a conversation) then the normalised text."""
    body = vocab.encode(text).ids.astype(np.uint32)
    return np.concatenate([[vocab.BOS], body]).astype(np.uint32) if start else body


def check_speaker(name: str, what: str = "--speaker") -> str:
    """A speaker name as conversations spell it (one line, single spaces: docs/data.md), or a
    UsageError: empty, a colon (it would end the name early), or characters outside cc101."""
    clean = " ".join(vocab.normalise(name).split())
    if not clean:
        raise UsageError(f"{what} is empty", f"give a name, e.g. {what} ROMEO")
    if ":" in clean:
        raise UsageError(f"{what} {name!r} contains ':'", "a turn is 'SPEAKER: text': pick a name without a colon")
    if vocab.encode(clean).unk_count:
        raise UsageError(f"{what} {name!r} has characters outside the {vocab.NAME} vocabulary",
                         "use printable ASCII letters, digits and punctuation")
    if len(clean) > 60:
        raise UsageError(f"{what} is {len(clean)} characters long", "keep speaker names under 60 characters")
    return clean
