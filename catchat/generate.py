"""Sampling from a trained model on the GPU, one timestep at a time for a batch of streams.

The forward pass runs in a forward-only Program with T = 1 and B = number of streams: each call
feeds one token per stream, carries the hidden state and returns the logits. The choice of the
next token (temperature, top-k, top-p, greedy) is made on the host with a seeded numpy RNG, so the
same seed gives the same text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from catchat import vocab
from catchat.model import ModelSpec, ParamLayout
from catchat.vk.program import Program


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. greedy or temperature 0 = argmax."""

    temperature: float = 0.8
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    greedy: bool = False

    def describe(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, greedy=self.greedy)


def choose(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> np.ndarray:
    """Next token per row of logits [B, V]; <pad> and <bos> are never chosen."""
    z = logits.astype(np.float64).copy()
    z[:, [vocab.PAD, vocab.BOS]] = -np.inf
    if s.greedy or s.temperature <= 0:
        return z.argmax(axis=1)
    z /= s.temperature
    if 0 < s.top_k < z.shape[1]:
        kth = np.sort(z, axis=1)[:, -s.top_k][:, None]
        z[z < kth] = -np.inf
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    if s.top_p < 1.0:
        order = np.argsort(-p, axis=1)
        sorted_p = np.take_along_axis(p, order, axis=1)
        cut = np.cumsum(sorted_p, axis=1) - sorted_p >= s.top_p  # keep the smallest prefix reaching top_p
        sorted_p[cut] = 0.0
        p = np.zeros_like(p)
        np.put_along_axis(p, order, sorted_p, axis=1)
        p /= p.sum(axis=1, keepdims=True)
    u = rng.random((p.shape[0], 1))
    return np.minimum((np.cumsum(p, axis=1) < u).sum(axis=1), p.shape[1] - 1)


class Generator:
    """A model resident on the device, generating `streams` texts in parallel."""

    def __init__(self, dev, spec: ModelSpec, flat_params: np.ndarray, streams: int = 1):
        self.spec, self.streams = spec, int(streams)
        self.prog = Program(dev, spec, 1, self.streams, training=False)
        self.prog.set_params(flat_params)
        self.reset()

    @classmethod
    def from_checkpoint(cls, dev, ckpt, streams: int = 1) -> "Generator":
        from catchat import config as cfgmod

        cfg = cfgmod.from_dict(ckpt.state["config"], source=str(ckpt.path / "state.json"))
        spec = cfgmod.model_spec(cfg, vocab.VOCAB_SIZE)
        return cls(dev, spec, ParamLayout(spec).flatten(ckpt.params, np.float32), streams)

    def reset(self) -> None:
        """Forget the context: zero state, the next token starts a conversation."""
        self.prog.set_carry(None)
        self._start = True

    def feed(self, ids: np.ndarray) -> np.ndarray:
        """Feed tokens [n, streams] (or [n] for every stream) in order; return the last logits [streams, V]."""
        ids = np.asarray(ids, dtype=np.uint32)
        if ids.ndim == 1:
            ids = np.repeat(ids[:, None], self.streams, axis=1)
        logits = None
        for row in ids:
            resets = np.full((1, self.streams), 1 if self._start else 0, np.uint32)
            logits = self.prog.forward_logits(row[None, :], resets)[0]
            self._start = False
        if logits is None:
            raise ValueError("feed() needs at least one token")
        return logits

    def generate(self, prompt_ids: np.ndarray, length: int, sampling: Sampling, seed: int = 0,
                 stop_at: tuple[int, ...] = (vocab.EOS,),
                 on_tokens: Callable[[np.ndarray], None] | None = None) -> list[list[int]]:
        """Continue `prompt_ids` for up to `length` tokens per stream; a stream stops at a token in
        `stop_at` (kept in its output). `on_tokens` sees each step's tokens [streams] as they come."""
        rng = np.random.default_rng(seed)
        logits = self.feed(prompt_ids)
        out: list[list[int]] = [[] for _ in range(self.streams)]
        done = np.zeros(self.streams, bool)
        for _ in range(length):
            nxt = choose(logits, sampling, rng)
            nxt[done] = vocab.PAD
            for b in np.flatnonzero(~done):
                out[b].append(int(nxt[b]))
            if on_tokens:
                on_tokens(nxt)
            done |= np.isin(nxt, stop_at)
            if done.all():
                break
            logits = self.feed(nxt[None, :])
        return out


def prompt_ids(text: str, *, start: bool = True) -> np.ndarray:
    """Token ids of a prompt: <bos> (when it starts a conversation) then the normalised text."""
    body = vocab.encode(text).ids.astype(np.uint32)
    return np.concatenate([[vocab.BOS], body]).astype(np.uint32) if start else body
