"""The fixed evaluation slice (held-out split or a text) and the evaluators: flat float64 parameters ->
plain cross-entropy over the slice (nats/char), on the GPU or with the numpy reference."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from catchat.data import vocab
from catchat.data.lanes import n_valid as count_valid
from catchat.errors import UsageError
from catchat.model import ModelSpec, ParamLayout
from catchat.model import reference as ref

DEFAULT_TOKENS = 1024


@dataclass
class EvalSlice:
    """Windows [(tokens, targets, resets) time-major [T, B] uint32], evaluated in order from zero state
    (the state carries from one window to the next, as in training)."""

    windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    T: int
    B: int
    source: str  # in words, for the summary and the npz

    @property
    def positions(self) -> int:
        return len(self.windows) * self.T * self.B

    @property
    def n_valid(self) -> int:
        return sum(count_valid(tg) for _, tg, _ in self.windows)

    def describe(self) -> str:
        return (f"{self.source}: {len(self.windows)} window(s) of T={self.T} x B={self.B}, "
                f"{self.n_valid:,} scored characters")

    def short(self) -> str:
        """For plot titles: what and how much, without paths."""
        what = "held-out split" if self.source.startswith("held-out") else Path(self.source).name
        return f"{what}, {self.n_valid:,} chars"


def heldout_slice(corpus, cfg, tokens: int = DEFAULT_TOKENS) -> EvalSlice:
    """The held-out split in the run's own lanes (B) and window (T), as `catchat eval` and the
    trainer's evals lay it out: the first ceil(tokens / (B*T)) windows, or, when tokens is less
    than one window, the first ceil(tokens / T) lanes of the first window. Padding is not scored."""
    from catchat.data.lanes import Lanes

    lanes = Lanes.from_config(corpus, cfg, "eval")
    T, B, tokens = lanes.T, lanes.B, int(tokens)
    n = min(lanes.windows_per_cycle, max(1, math.ceil(tokens / (B * T))))
    b = min(B, max(1, math.ceil(tokens / T)))
    wins = [lanes.window(0, i) for i in range(n)]
    return EvalSlice([(w.tokens[:, :b].copy(), w.targets[:, :b].copy(), w.resets[:, :b].copy()) for w in wins],
                     T, b, f"held-out split of {getattr(corpus, 'path', corpus)}")


def text_slice(text: str, T: int, B: int, tokens: int = DEFAULT_TOKENS, source: str = "text") -> EvalSlice:
    """`text` encoded as one conversation (<bos> text <eos>), its first `tokens` next-character
    predictions cut into up to B contiguous lanes (each lane from zero state) and windows of T."""
    ids = np.concatenate([[vocab.BOS], vocab.encode_ids(text), [vocab.EOS]]).astype(np.uint32)
    P = min(len(ids) - 1, int(tokens))  # predictions: ids[i] -> ids[i + 1]
    if P < 1 or len(ids) <= 2:
        raise UsageError(f"{source} has no text to evaluate on", hint="give a file with some text in it")
    B_eff = max(1, min(int(B), math.ceil(P / T)))
    S = math.ceil(P / B_eff)  # predictions per lane
    W = math.ceil(S / T)
    windows = []
    for w in range(W):
        tok = np.zeros((T, B_eff), np.uint32)
        tgt = np.zeros((T, B_eff), np.uint32)
        rst = np.zeros((T, B_eff), np.uint32)
        if w == 0:
            rst[0, :] = 1  # every lane starts from zero state
        for b in range(B_eff):
            lo = b * S + w * T  # first prediction of this window in lane b
            hi = min(b * S + S, P, lo + T)
            if hi <= lo:
                continue
            tok[: hi - lo, b] = ids[lo:hi]
            tgt[: hi - lo, b] = ids[lo + 1:hi + 1]
        windows.append((tok, tgt, rst))
    return EvalSlice(windows, int(T), B_eff, source)


class GpuEvaluator:
    """One forward-only Program at the slice's (T, B); each call uploads the parameters and replays
    the recorded eval sequence over the slice's windows (float32 on the device)."""

    name = "gpu"

    def __init__(self, dev, layout: ParamLayout, data: EvalSlice):
        from catchat.vk.program import Program

        self.spec, self.data = layout.spec, data
        self.prog = Program(dev, layout, data.T, data.B, training=False)

    def __call__(self, flat: np.ndarray) -> float:
        self.prog.set_params(np.asarray(flat, np.float32))
        return self.prog.evaluate_windows(self.data.windows)["loss"]


class ReferenceEvaluator:
    """The numpy reference model (float64 by default) over the same windows, from zero state."""

    name = "numpy"

    def __init__(self, spec: ModelSpec, data: EvalSlice, dtype=np.float64):
        self.spec, self.data, self.dtype = spec, data, dtype
        self.layout = ParamLayout(spec)

    def __call__(self, flat: np.ndarray) -> float:
        params = self.layout.unflatten(np.asarray(flat, self.dtype))
        h = np.zeros((self.spec.layers, self.data.B, self.spec.hidden), self.dtype)  # [L,B,H]
        loss_sum, n = 0.0, 0
        for tok, tgt, rst in self.data.windows:
            nv = count_valid(tgt)
            res = ref.model_forward_backward(params, self.spec, tok, tgt, rst, h, nv, need_grads=False)
            loss_sum += res.loss * nv
            n += nv
            h = res.hT
        return loss_sum / n if n else float("nan")


def choose_slice(cfg, tokens: int = DEFAULT_TOKENS, text_file: str | Path | None = None,
                 corpus_path: str | None = None, fmt: str = "auto") -> EvalSlice:
    """The slice of `catchat landscape`: `text_file` (one conversation), else the held-out split of
    `corpus_path` (default: the run's corpus), in the run's window and lanes. With fmt "auto" a text
    file that is JSON or CSV is refused as `corpus build` refuses it (fmt "text": read it anyway)."""
    if text_file:
        if fmt == "auto":
            from catchat.data.corpus.detect import check_format

            check_format(Path(text_file), "text")
        try:
            text = Path(text_file).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{text_file} is not valid UTF-8 (byte {e.start})", hint="convert it to UTF-8") from None
        return text_slice(text, cfg.data.window, cfg.data.batch_lanes, tokens, source=str(text_file))
    from catchat.data.corpus import open_corpus

    return heldout_slice(open_corpus(corpus_path or cfg.data.corpus), cfg, tokens)


def choose_evaluator(data: EvalSlice, reference: bool, device=None
                     ) -> tuple[Callable[[ParamLayout], Callable[[np.ndarray], float]], str]:
    """(a factory of evaluators per parameter layout, the evaluator in words): the numpy reference with
    `reference`, else a forward-only program on `device` (opened here)."""
    if reference:
        return (lambda layout: ReferenceEvaluator(layout.spec, data)), "numpy reference (float64)"
    from catchat.vk.device import open_device

    dev = open_device(device)
    return ((lambda layout: GpuEvaluator(dev, layout, data)),
            f"{dev.info.name} (forward-only program, replayed per point)")
