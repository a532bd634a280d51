"""Sampling from a trained model on the GPU, one timestep at a time for a batch of streams.

The forward pass runs on the device in forward-only Programs: one with T = 1 and B = streams for
the token-by-token loop, and (built on first use) one with T = `prefill` for feeding long runs of
known tokens (a prompt, the other speaker's turn, a re-primed context) a window at a time; the
hidden state moves between them through the host. Each step reads back the logits [B, V] and the
next token is chosen on the host by `choose` (temperature, top-k, top-p, greedy, n-gram blocking)
with a seeded numpy RNG, so the same seed gives the same text. docs/generation.md has the rules.

    gen = Generator.from_checkpoint(dev, ck.load_checkpoint("runs/tiny"), streams=4)
    outs = gen.generate(prompt_ids("ROMEO: "), 300, Sampling(temperature=0.7), seed=1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from catchat import vocab
from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout
from catchat.vk.program import Program

DIALOGUE_NGRAM_BLOCK = 5  # `talk` and `chat` block repeated 5-grams by default; `sample` does not
PREFILL_WINDOW = 64  # tokens per dispatch window when feeding known text


# ---------------------------------------------------------------------------------------------
# Choosing the next token (the one implementation: sample, talk and chat all come through here)
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

    def replace(self, **changes) -> Sampling:
        """A copy with some settings changed (validated)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, greedy=self.greedy,
                    ngram_block=self.ngram_block)


class NgramBlock:
    """Per-stream memory of the n-grams a stream has generated, for `choose`.

    After the last n-1 tokens of stream b, every token that once followed those n-1 tokens in
    stream b is banned, so no n-gram occurs twice. Tokens in `exempt` (those that end generation,
    <eos> always) are never banned: a stream can always stop, so some token is always allowed."""

    def __init__(self, n: int, streams: int, exempt: Sequence[int] = (vocab.EOS,)):
        if n < 2:
            raise ValueError(f"n-gram blocking needs n >= 2, got {n}")
        self.n, self.streams = int(n), int(streams)
        self.exempt = sorted(set(exempt) | {vocab.EOS})
        self._seen: list[dict[tuple[int, ...], set[int]]] = [{} for _ in range(self.streams)]
        self._tail: list[tuple[int, ...]] = [() for _ in range(self.streams)]

    def banned(self, vocab_size: int) -> np.ndarray:
        """bool [streams, V]: True where the token would repeat an n-gram of that stream."""
        mask = np.zeros((self.streams, vocab_size), bool)
        for b in range(self.streams):
            nxt = self._seen[b].get(self._tail[b])
            if nxt:
                mask[b, list(nxt)] = True
        mask[:, self.exempt] = False
        return mask

    def push(self, tokens: np.ndarray, active: np.ndarray | None = None) -> None:
        """Record one generated token per stream (streams where `active` is False are skipped)."""
        k = self.n - 1
        for b, t in enumerate(np.asarray(tokens).tolist()):
            if active is not None and not active[b]:
                continue
            tail = self._tail[b]
            if len(tail) == k:
                self._seen[b].setdefault(tail, set()).add(t)
            self._tail[b] = (tail + (t,))[-k:]


def choose(logits: np.ndarray, s: Sampling, rng: np.random.Generator, block: NgramBlock | None = None,
           active: np.ndarray | None = None) -> np.ndarray:
    """The next token per row of logits [B, V] (int64 [B]).

    Order: <pad> and <bos> are never chosen; tokens `block` bans are removed; greedy (or
    temperature 0) takes the first largest logit; otherwise logits / temperature, keep the top_k
    largest (ties to the lower index), softmax, keep the smallest prefix of the sorted
    probabilities whose mass reaches top_p, renormalise and draw one uniform per row from `rng`.
    The chosen tokens are recorded in `block` (rows where `active` is False are not)."""
    z = np.asarray(logits, np.float64).copy()  # [B, V]
    B, V = z.shape
    z[:, [vocab.PAD, vocab.BOS]] = -np.inf
    if block is not None:
        z[block.banned(V)] = -np.inf
    if s.is_greedy:
        nxt = z.argmax(axis=1)
    else:
        z /= s.temperature
        if 0 < s.top_k < V:
            drop = np.argsort(-z, axis=1, kind="stable")[:, s.top_k:]  # [B, V - k]
            np.put_along_axis(z, drop, -np.inf, axis=1)
        p = np.exp(z - z.max(axis=1, keepdims=True))  # [B, V]
        if s.top_p < 1.0:
            p /= p.sum(axis=1, keepdims=True)
            order = np.argsort(-p, axis=1, kind="stable")
            sorted_p = np.take_along_axis(p, order, axis=1)
            sorted_p[np.cumsum(sorted_p, axis=1) - sorted_p >= s.top_p] = 0.0  # mass before it already reaches top_p
            p = np.zeros_like(p)
            np.put_along_axis(p, order, sorted_p, axis=1)
        c = np.cumsum(p, axis=1)
        c /= c[:, -1:]  # the last entry is exactly 1, so the pick always has p > 0
        u = rng.random((B, 1))
        nxt = (c <= u).sum(axis=1)
    if block is not None:
        block.push(nxt, active)
    return nxt


# ---------------------------------------------------------------------------------------------
# The model on the device
# ---------------------------------------------------------------------------------------------

class Generator:
    """A model resident on the device, generating `streams` texts in parallel.

    `feed` runs known tokens through the model (a window of `prefill` tokens per dispatch chain
    where it can, one token at a time for the rest) and keeps the last logits; `generate` samples
    from them. A `<bos>` token always starts from a zero state (as in training: reset = 1 there)."""

    def __init__(self, dev, layout: ParamLayout, flat_params: np.ndarray, streams: int = 1,
                 prefill: int = PREFILL_WINDOW):
        self.dev, self.layout, self.spec, self.streams = dev, layout, layout.spec, int(streams)
        self.prefill = int(prefill)
        self._flat = np.asarray(flat_params, np.float32)
        self.prog = Program(dev, self.layout, 1, self.streams, training=False)
        self.prog.set_params(self._flat)
        self._prefill_prog: Program | None = None
        self.logits: np.ndarray | None = None  # [streams, V] after the last fed token
        self.reset()

    @classmethod
    def from_checkpoint(cls, dev, ckpt, streams: int = 1, prefill: int = PREFILL_WINDOW) -> Generator:
        spec = checkpoint_spec(ckpt)
        from catchat import checkpoint as ck
        from catchat.model import param_specs

        ck.check_shapes(ckpt.params, {p.name: p.shape for p in param_specs(spec)}, str(ckpt.path))
        layout = ParamLayout(spec)
        return cls(dev, layout, layout.flatten(ckpt.params, np.float32), streams, prefill)

    def set_params(self, flat_params: np.ndarray) -> None:
        """Swap in other weights of the same spec (e.g. the trainer's samples at each eval)."""
        self._flat = np.asarray(flat_params, np.float32)
        self.prog.set_params(self._flat)
        if self._prefill_prog is not None:
            self._prefill_prog.set_params(self._flat)
        self.reset()

    def reset(self) -> None:
        """Forget the context: zero state, nothing fed."""
        self.prog.set_carry(None)
        self.logits = None

    def _prefill_program(self) -> Program:
        if self._prefill_prog is None:
            self._prefill_prog = Program(self.dev, self.layout, self.prefill, self.streams, training=False)
            self._prefill_prog.set_params(self._flat)
        return self._prefill_prog

    def feed(self, ids) -> np.ndarray:
        """Feed tokens [n, streams] (or [n]: the same for every stream) in order; return the last
        logits [streams, V] (also kept in `self.logits`)."""
        ids = np.asarray(ids, dtype=np.uint32)
        if ids.ndim == 1:
            ids = np.repeat(ids[:, None], self.streams, axis=1)
        n = ids.shape[0]
        if n == 0:
            raise ValueError("feed() needs at least one token")
        if ids.shape[1] != self.streams:
            raise ValueError(f"feed() got {ids.shape[1]} streams, this generator has {self.streams}")
        resets = (ids == vocab.BOS).astype(np.uint32)  # a conversation starts: zero state (docs/model.md)
        pos = 0
        W = self.prefill
        if W > 1 and n >= W:
            pre = self._prefill_program()
            pre.set_carry(self.prog.get_carry())
            while n - pos >= W:
                self.logits = pre.forward_logits(ids[pos:pos + W], resets[pos:pos + W])[-1]
                pos += W
            self.prog.set_carry(pre.get_carry())
        while pos < n:
            self.logits = self.prog.forward_logits(ids[pos:pos + 1], resets[pos:pos + 1])[0]
            pos += 1
        return self.logits

    def generate(self, prompt, length: int, sampling: Sampling, seed: int = 0, *,
                 rng: np.random.Generator | None = None, stop_at: Sequence[int] = (vocab.EOS,),
                 on_tokens: Callable[[np.ndarray], None] | None = None) -> list[list[int]]:
        """Feed `prompt` (None: continue after what was fed last), then sample up to `length`
        tokens per stream. A stream stops at a token in `stop_at` (<eos> always), which is kept as
        the last token of its output. `on_tokens` sees each step's tokens [streams] as they come
        (<pad> for streams that have stopped). The last token of each output is not fed: the state
        ends just before it. N-gram blocking (sampling.ngram_block) covers each stream's output."""
        if length < 1:
            raise ValueError("length must be >= 1")
        stop_at = tuple(sorted(set(stop_at) | {vocab.EOS}))
        rng = np.random.default_rng(seed) if rng is None else rng
        if prompt is not None and len(prompt):
            self.feed(prompt)
        if self.logits is None:
            raise ValueError("nothing fed yet: give a prompt (at least <bos>)")
        block = NgramBlock(sampling.ngram_block, self.streams, stop_at) if sampling.ngram_block else None
        out: list[list[int]] = [[] for _ in range(self.streams)]
        done = np.zeros(self.streams, bool)
        for step in range(length):
            nxt = choose(self.logits, sampling, rng, block, ~done)
            nxt[done] = vocab.PAD
            for b in np.flatnonzero(~done):
                out[b].append(int(nxt[b]))
            if on_tokens:
                on_tokens(nxt)
            done |= np.isin(nxt, stop_at)
            if done.all() or step == length - 1:
                break
            self.feed(nxt[None, :])
        return out


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
