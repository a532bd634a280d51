"""Order-preserving stateful truncated BPTT: lanes, windows, reset masks and the data cursor.

docs/data.md describes the contract; in short:
- B lanes. Every lane is a contiguous stream of whole conversations, each read in order, and no
  conversation is split across lanes. Which conversations a lane reads, and in which order, is
  data.lane_order (catchat/data/lane_order.py): by default ("corpus") the conversations of a split,
  in corpus order, are cut into B contiguous runs (lane b holds conversations [cut_b, cut_{b+1}))
  so that the longest lane is as short as possible (`balanced_cuts`); "longest_first" gives each
  conversation, longest first, to the least-loaded lane; "shuffle" cuts a permutation drawn per
  cycle from (seed, cycle).
- A cycle is one pass over the split. Window w of a cycle holds tokens [w*T, (w+1)*T) of every
  lane; a cycle takes ceil(longest lane / T) windows (`windows_in(cycle)`; `windows_per_cycle` is
  cycle 0's, every cycle's but with "shuffle"). Lanes that run out early are padded, only at the end
  of the cycle, with <pad> inputs and masked targets. Every cycle uses the same lanes in the same
  order (no rotation), except that "shuffle" lays them out anew each cycle.
- Arrays are time-major [T, B] uint32: tokens (inputs), targets (next token in the lane; <pad> =
  masked), resets (1 where a conversation starts at that token, its <bos>: the hidden state
  entering that step is zero). The target of a window's last token is the first token of the
  lane's next window; the target of every <eos> (a conversation's last token, so also a lane's
  final token) is masked: nothing of conversation A predicts or feeds conversation B (lesson 5).
- Stateless mode (carry_state = False): resets[0, :] = 1 in every window, and windows may be
  served in shuffled blocks (shuffle_block_windows > 0: blocks of that many consecutive windows,
  permuted per cycle by a generator seeded with (seed, cycle); order kept inside a block).
  Shuffling while carrying state is refused.
- A seq is one window of one lane; a window serves B seqs; a step takes micro_batches windows.
- DataCursor (cycle, window position within the cycle, seqs consumed, layout) is a small JSON
  dict; `Lanes.next(cursor)` from a restored cursor returns exactly the window that came next. The
  layout id covers data.lane_order (and the seed with "shuffle"), so a cursor is never applied to
  lanes laid out another way.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from catchat.data import vocab
from catchat.data.lane_order import CORPUS, LANE_ORDERS, SHUFFLE, LaneLayout, lay_out, longest_lane
from catchat.errors import UsageError

STATEFUL_SHUFFLE_REASON = (
    "stateful truncated BPTT needs contiguous windows: shuffling while carrying the hidden state "
    "would feed one conversation's state into another (docs/lessons.md, lesson 5)")


@dataclass
class Window:
    """One window of all lanes. Arrays are time-major [T, B] uint32."""

    tokens: np.ndarray  # [T, B] input token ids (<pad> = 0 in padding)
    targets: np.ndarray  # [T, B] next token; <pad> (0) where masked
    resets: np.ndarray  # [T, B] 1 where the hidden state entering step t is zero
    cycle: int  # which pass over the split
    position: int  # served order within the cycle (what the cursor counts)
    index: int  # window index within the cycle (lane offset = index * T)

    @property
    def n_valid(self) -> int:
        return n_valid(self.targets)


def n_valid(targets: np.ndarray) -> int:
    """Number of targets that count in the loss (not <pad>), counted on the host (lesson 10)."""
    return int(np.count_nonzero(np.asarray(targets) != vocab.PAD))


@dataclass(frozen=True)
class DataCursor:
    """Where the data stream stands: the next window served is position `window` of `cycle`.

    `seqs` counts seqs (lane-windows) consumed since the start of the run; `layout` identifies
    the lanes it belongs to (corpus tokens, split, B, T, mode, lane order), so a cursor is not applied to
    different data by mistake."""

    cycle: int = 0
    window: int = 0
    seqs: int = 0
    layout: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DataCursor:
        if not isinstance(d, dict) or set(d) != {"cycle", "window", "seqs", "layout"}:
            raise UsageError(f"not a data cursor: {d!r}", "expected {cycle, window, seqs, layout} (from state.json)")
        for k in ("cycle", "window", "seqs"):
            if not isinstance(d[k], int) or isinstance(d[k], bool) or d[k] < 0:
                raise UsageError(f"data cursor field {k} must be a non-negative integer, got {d[k]!r}",
                                 "the checkpoint's state.json is damaged: resume from another checkpoint")
        if not isinstance(d["layout"], str):
            raise UsageError("data cursor field layout must be a string", "the checkpoint's state.json is damaged")
        return cls(cycle=d["cycle"], window=d["window"], seqs=d["seqs"], layout=d["layout"])


def packed_layout(lengths: Sequence[int], max_lanes: int, window: int, *,
                  carry_state: bool = True) -> tuple[int, int]:
    """(B, T) for a forward-only pass over conversations of these lengths (evaluation), at most
    `max_lanes` lanes and windows of at most `window` tokens.

    Carrying state, the loss does not depend on the layout (each conversation starts from zero
    state, its state carried across windows), so the layout is chosen for cost: the fewest lanes
    whose longest lane is as short as `max_lanes` lanes can make it (the number of sequential
    steps), then the shortest T that needs no more windows than T = `window` would. Stateless
    (state reset at every window start) the window is part of what is measured: T = `window`, and
    B = min(max_lanes, N) cuts the lanes as the training-time eval's B = max_lanes lanes do."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0 or max_lanes < 1 or window < 1:
        raise ValueError(f"packed_layout needs conversations, max_lanes >= 1 and window >= 1 "
                         f"(got {len(lengths)}, {max_lanes}, {window})")
    top = min(int(max_lanes), len(lengths))
    if not carry_state:
        return top, int(window)
    best = longest_lane(lengths, top)
    lo, hi = 1, top
    while lo < hi:  # the longest lane never grows with more lanes: bisect for the fewest reaching `best`
        mid = (lo + hi) // 2
        if longest_lane(lengths, mid) <= best:
            hi = mid
        else:
            lo = mid + 1
    n_windows = math.ceil(best / window)
    return lo, math.ceil(best / n_windows)


# the way on when a split of a corpus with too few conversations is empty (a fraction > 0 of one
# conversation holds none out: the split keeps one on each side only from two up)
TOO_FEW_CONVERSATIONS = "use a corpus with at least 2 conversations (data.max_conversations = 0 reads all)"


class Lanes:
    """B lanes over a list of conversations, cut into windows of T tokens (see module doc).

    tokens: the corpus token file (uint8, a memmap is fine); starts, lengths: the selected
    conversations in order (offsets into tokens); lane_order: how they are laid into the lanes
    (catchat/data/lane_order.py). Use `from_corpus` for a built corpus."""

    def __init__(self, tokens: np.ndarray, starts: Sequence[int], lengths: Sequence[int], *,
                 batch_lanes: int, window: int, carry_state: bool = True, shuffle_block_windows: int = 0,
                 seed: int = 0, allow_empty_lanes: bool = False, layout_id: str = "", notes: Sequence[str] = (),
                 lane_order: str = CORPUS):
        if batch_lanes < 1 or window < 1:
            raise UsageError(f"lanes need batch_lanes >= 1 and window >= 1, got {batch_lanes} and {window}",
                             "set data.batch_lanes and data.window to positive integers")
        if lane_order not in LANE_ORDERS:
            raise UsageError(f"data.lane_order must be one of {', '.join(map(repr, LANE_ORDERS))}, got {lane_order!r}",
                             f'e.g. data.lane_order = "{CORPUS}" (docs/data.md, lane order)')
        if shuffle_block_windows < 0:
            raise UsageError(f"data.shuffle_block_windows must be >= 0, got {shuffle_block_windows}", "0 turns it off")
        if carry_state and shuffle_block_windows > 0:
            raise UsageError(f"data.shuffle_block_windows = {shuffle_block_windows} with data.carry_state = true: "
                             + STATEFUL_SHUFFLE_REASON,
                             "set data.shuffle_block_windows = 0, or data.carry_state = false to train stateless")
        self.tokens = tokens
        self.starts = np.asarray(starts, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        n = len(self.starts)
        if n == 0:
            raise UsageError("no conversations to make lanes from",
                             "check the corpus, data.eval_fraction and data.max_conversations")
        if n < batch_lanes and not allow_empty_lanes:
            raise UsageError(f"{n} conversations cannot fill data.batch_lanes = {batch_lanes} lanes "
                             "(each lane needs at least one whole conversation)",
                             f"lower data.batch_lanes to at most {n}, or use more data "
                             "(data.max_conversations, a larger corpus)")
        if (self.lengths < 1).any():
            raise ValueError("every conversation needs at least one token")
        self.B, self.T = int(batch_lanes), int(window)
        self.carry_state = bool(carry_state)
        self.shuffle_block_windows = int(shuffle_block_windows)
        self.seed = int(seed)
        self.notes = list(notes)
        self.lane_order = lane_order
        self._layouts: dict[int, LaneLayout] = {}  # "shuffle": a few recent cycles' layouts
        first = self.layout_of(0)  # every cycle's but with "shuffle"
        self.cuts, self.lane_base, self.lane_lengths = first.cuts, first.lane_base, first.lane_lengths
        self.windows_per_cycle = first.windows  # cycle 0's: what planning by cycles counts a cycle as
        self.layout = layout_id or self._layout_hash()
        self._orders: dict[int, np.ndarray] = {}

    # -- construction from a corpus ------------------------------------------------------------

    @classmethod
    def from_corpus(cls, corpus, *, batch_lanes: int, window: int, split: str = "train",
                    eval_fraction: float = 0.05, max_conversations: int = 0, carry_state: bool = True,
                    shuffle_block_windows: int = 0, seed: int = 0, lane_order: str = CORPUS) -> Lanes:
        """Lanes over one side of a corpus's split (`corpus`: catchat.data.corpus.Corpus).
        The eval side never shuffles, keeps corpus order (so evals of runs laid out differently score
        the same windows) and may leave lanes empty (all padding, masked)."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        sp = corpus.split(eval_fraction, max_conversations)
        ids = sp.train if split == "train" else sp.eval
        if len(ids) == 0:
            if split == "eval" and eval_fraction <= 0:
                raise UsageError(f"the eval split of {corpus.path} is empty (data.eval_fraction = {eval_fraction:g})",
                                 "set data.eval_fraction > 0, or turn evaluation off (eval.eval_every_seqs = 0)")
            # a fraction > 0 of too few conversations: the split keeps one on each side only from two up
            n = f"{sp.considered} conversation{'s' if sp.considered != 1 else ''}"
            raise UsageError(f"the {split} split of {corpus.path} is empty: data.eval_fraction = {eval_fraction:g} "
                             f"of its {n} leaves none for {split}",
                             TOO_FEW_CONVERSATIONS
                             + (", or turn evaluation off (eval.eval_every_seqs = 0)" if split == "eval" else ""))
        if split == "eval":
            shuffle_block_windows, lane_order = 0, CORPUS
        ident = hashlib.sha256(
            f"{corpus.split_id}|{split}|{eval_fraction!r}|{sp.considered}|{batch_lanes}|{window}|"
            f"{carry_state}|{shuffle_block_windows}|{seed if shuffle_block_windows else 0}"
            f"{_lane_order_id(lane_order, seed)}".encode()).hexdigest()[:16]
        notes = [sp.note] if sp.note else []
        return cls(corpus.tokens, corpus.starts[ids], corpus.lengths[ids], batch_lanes=batch_lanes, window=window,
                   carry_state=carry_state, shuffle_block_windows=shuffle_block_windows, seed=seed,
                   allow_empty_lanes=(split == "eval"), layout_id=ident, notes=notes, lane_order=lane_order)

    @classmethod
    def from_config(cls, corpus, cfg, split: str = "train") -> Lanes:
        """Lanes for a catchat.config.Config: data.* and train.seed."""
        d = cfg.data
        return cls.from_corpus(corpus, batch_lanes=d.batch_lanes, window=d.window, split=split,
                               eval_fraction=d.eval_fraction, max_conversations=d.max_conversations,
                               carry_state=d.carry_state, shuffle_block_windows=d.shuffle_block_windows,
                               seed=cfg.train.seed, lane_order=d.lane_order)

    @classmethod
    def from_conversations(cls, conversations: Sequence[Sequence[int]], **kwargs) -> Lanes:
        """Lanes over in-memory token lists (tests, tools)."""
        arrays = [np.asarray(c, dtype=np.uint8) for c in conversations]
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, np.uint8)
        return cls(tokens, starts, lengths, **kwargs)

    def _layout_hash(self) -> str:
        h = hashlib.sha256()
        for a in (self.starts, self.lengths):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(f"|{self.B}|{self.T}|{self.carry_state}|{self.shuffle_block_windows}|"
                 f"{self.seed if self.shuffle_block_windows else 0}"
                 f"{_lane_order_id(self.lane_order, self.seed)}".encode())
        return h.hexdigest()[:16]

    # -- sizes ---------------------------------------------------------------------------------

    @property
    def conversations(self) -> int:
        return len(self.starts)

    @property
    def seqs_per_cycle(self) -> int:
        """Seqs (lane-windows) in one cycle: windows_per_cycle * B (cycle 0's; with "shuffle" each
        cycle's own is `windows_in(cycle) * B`)."""
        return self.windows_per_cycle * self.B

    @property
    def tokens_per_cycle(self) -> int:
        """Real (non-padding) input tokens in one cycle."""
        return int(self.lengths.sum())

    @property
    def padding_fraction(self) -> float:
        """Share of the cycle's B * T * windows_per_cycle input slots that are padding (cycle 0's)."""
        return 1.0 - self.tokens_per_cycle / (self.seqs_per_cycle * self.T)

    def layout_of(self, cycle: int) -> LaneLayout:
        """The lanes of cycle `cycle` (the same object every cycle but with "shuffle")."""
        key = cycle if self.lane_order == SHUFFLE else 0
        layout = self._layouts.get(key)
        if layout is None:
            layout = lay_out(self.lane_order, self.lengths, self.B, self.T, seed=self.seed, cycle=key)
            if len(self._layouts) > 8:
                self._layouts.clear()
            self._layouts[key] = layout
        return layout

    def windows_in(self, cycle: int) -> int:
        """Windows cycle `cycle` takes: windows_per_cycle, but each cycle's own with "shuffle"."""
        return self.layout_of(cycle).windows

    def lane_conversations(self, b: int, cycle: int = 0) -> np.ndarray:
        """Positions (in the selected list) of lane b's conversations in cycle `cycle`, in reading order."""
        return self.layout_of(cycle).lane_conversations(b)

    def describe(self) -> list[str]:
        """Lines for the trainer's start-up summary."""
        order = {CORPUS: "", SHUFFLE: f", reshuffled each cycle (seed {self.seed})"}.get(
            self.lane_order, f", laid out {self.lane_order}")
        lines = [f"{self.conversations:,} conversations in {self.B} lanes of {int(self.lane_lengths.min()):,}.."
                 f"{int(self.lane_lengths.max()):,} tokens{order}; {self.windows_per_cycle:,} windows of {self.T} "
                 f"per cycle ({self.seqs_per_cycle:,} seqs, {self.padding_fraction:.1%} padding); "
                 + ("stateful (state carried across windows)" if self.carry_state else
                    "stateless" + (f", shuffled in blocks of {self.shuffle_block_windows} windows"
                                   if self.shuffle_block_windows else ""))]
        return lines + self.notes

    # -- order ---------------------------------------------------------------------------------

    def window_order(self, cycle: int) -> np.ndarray:
        """Window indices in the order cycle `cycle` serves them (identity unless block-shuffled)."""
        if cycle < 0:
            raise ValueError(f"cycle must be >= 0, got {cycle}")
        W = self.windows_in(cycle)
        if not self.shuffle_block_windows:
            return np.arange(W, dtype=np.int64)
        order = self._orders.get(cycle)
        if order is None:
            k = self.shuffle_block_windows
            blocks = [np.arange(a, min(a + k, W), dtype=np.int64) for a in range(0, W, k)]
            rng = np.random.Generator(np.random.PCG64([self.seed, cycle]))
            order = np.concatenate([blocks[i] for i in rng.permutation(len(blocks))])
            if len(self._orders) > 8:
                self._orders.clear()
            self._orders[cycle] = order
        return order

    # -- windows -------------------------------------------------------------------------------

    def _read(self, layout: LaneLayout, v0: int, v1: int) -> np.ndarray:
        """Tokens of the layout's virtual stream [v0, v1) (v1 <= end of the stream)."""
        out = np.empty(max(v1 - v0, 0), dtype=np.uint8)
        if v1 <= v0:
            return out
        cum = layout.cum
        i = int(np.searchsorted(cum, v0, side="right")) - 1
        pos = v0
        while pos < v1:
            seg_end = int(cum[i + 1])
            take = min(seg_end, v1) - pos
            src = int(self.starts[layout.order[i]]) + (pos - int(cum[i]))
            out[pos - v0:pos - v0 + take] = self.tokens[src:src + take]
            pos += take
            i += 1
        return out

    def window_at(self, index: int, *, cycle: int = 0, position: int | None = None) -> Window:
        """Window `index` of the cycle (lane offset index * T), whatever order it is served in."""
        layout = self.layout_of(cycle)
        if not 0 <= index < layout.windows:
            raise IndexError(f"window {index} outside 0..{layout.windows - 1}")
        T, B = self.T, self.B
        tokens = np.zeros((T, B), dtype=np.uint32)
        targets = np.zeros((T, B), dtype=np.uint32)
        resets = np.zeros((T, B), dtype=np.uint32)
        conv_starts = layout.cum[:-1]
        for b in range(B):
            a = int(layout.lane_base[b]) + index * T  # virtual offset of this window's first token
            end = int(layout.lane_base[b] + layout.lane_lengths[b])
            n_in = max(0, min(T, end - a))
            if n_in == 0:
                continue  # this lane ran out: all padding, masked
            seq = self._read(layout, a, min(a + T + 1, end))  # inputs plus the next window's first token
            tokens[:n_in, b] = seq[:n_in]
            targets[:len(seq) - 1, b] = seq[1:]
            # conversation starts inside the window: reset there, and mask the target before it
            lo = int(np.searchsorted(conv_starts, a, side="left"))
            hi = int(np.searchsorted(conv_starts, a + n_in, side="right"))  # includes a start at a + n_in
            for s in conv_starts[lo:hi]:
                p = int(s) - a
                if p < n_in:
                    resets[p, b] = 1
                if p >= 1:
                    targets[p - 1, b] = vocab.PAD  # the last token (<eos>) of the previous conversation
            if a + n_in == end:
                targets[n_in - 1, b] = vocab.PAD  # the lane's final token
        if not self.carry_state:
            resets[0, :] = 1
        return Window(tokens=tokens, targets=targets, resets=resets, cycle=cycle,
                      position=index if position is None else position, index=index)

    def window(self, cycle: int, position: int) -> Window:
        """The window served at `position` of cycle `cycle`."""
        return self.window_at(int(self.window_order(cycle)[position]), cycle=cycle, position=position)

    # -- the cursor ----------------------------------------------------------------------------

    def start(self) -> DataCursor:
        """The cursor of a fresh run: cycle 0, window 0, nothing consumed."""
        return DataCursor(0, 0, 0, self.layout)

    def restore(self, cursor: DataCursor | dict) -> DataCursor:
        """Check a saved cursor (or its dict) against these lanes and return it."""
        c = DataCursor.from_dict(cursor) if isinstance(cursor, dict) else cursor
        if c.layout != self.layout:
            raise UsageError(
                f"the saved data cursor belongs to another data layout ({c.layout or 'none'}, these lanes are "
                f"{self.layout}): the corpus, split, data.batch_lanes, data.window, data.lane_order or "
                "shuffling changed",
                "resume with the run's own config.toml and corpus, or start a new run")
        if c.window >= self.windows_in(c.cycle):
            raise UsageError(f"the saved data cursor points at window {c.window}, past this cycle's "
                             f"{self.windows_in(c.cycle)} windows",
                             "the checkpoint's state.json does not match this corpus")
        return c

    def next(self, cursor: DataCursor) -> tuple[Window, DataCursor]:
        """The window at `cursor` and the cursor after it (wrapping into the next cycle)."""
        if cursor.layout and cursor.layout != self.layout:
            self.restore(cursor)  # raises with the reason
        w = self.window(cursor.cycle, cursor.window)
        pos, cycle = cursor.window + 1, cursor.cycle
        if pos == self.windows_in(cycle):
            pos, cycle = 0, cycle + 1
        return w, DataCursor(cycle, pos, cursor.seqs + self.B, self.layout)

    def take(self, cursor: DataCursor, n: int) -> tuple[list[Window], DataCursor]:
        """`n` consecutive windows (one optimizer step = data.micro_batches windows)."""
        out = []
        for _ in range(n):
            w, cursor = self.next(cursor)
            out.append(w)
        return out, cursor

    def iter(self, cursor: DataCursor | None = None) -> Iterator[tuple[Window, DataCursor]]:
        """Endless (window, cursor after it) pairs from `cursor` (default: the start)."""
        cursor = cursor or self.start()
        while True:
            w, cursor = self.next(cursor)
            yield w, cursor


def _lane_order_id(lane_order: str, seed: int) -> str:
    """The lane order's part of a layout id: nothing for "corpus" (ids, and so the cursors of runs
    from before data.lane_order, stay as they were), the seed too for "shuffle"."""
    if lane_order == CORPUS:
        return ""
    return f"|lane_order={lane_order}" + (f"|{seed}" if lane_order == SHUFFLE else "")


STREAM_PREFIX_HIT, STREAM_PREFIX_LEN = 48, 49


def prefix_dropout(targets: np.ndarray, resets: np.ndarray, p: float, max_fraction: float, seed: int):
    """Mask a prefix of some lanes' windows from the loss and reset the state at its end.

    Lane b is hit when rng_uniform(seed, 48, b) < p; its prefix is 1 + floor(u * floor(max_fraction
    * T)) tokens (u = rng_uniform(seed, 49, b)): those targets become <pad> and the state entering
    the first token after the prefix is zero, so the model learns to predict from a short context.
    Returns new (targets, resets) [T,B]; deterministic in seed (the step's dropout seed).
    """
    from catchat.rng import rng_uniform

    targets, resets = targets.copy(), resets.copy()
    if p <= 0:
        return targets, resets
    T, B = targets.shape
    lanes = np.arange(B)
    longest = max(1, int(max_fraction * T))
    hit = rng_uniform(seed, STREAM_PREFIX_HIT, lanes) < np.float32(p)
    lengths = 1 + (rng_uniform(seed, STREAM_PREFIX_LEN, lanes) * longest).astype(np.int64)
    for b in np.flatnonzero(hit):
        n = min(int(lengths[b]), T)
        targets[:n, b] = vocab.PAD
        if n < T:
            resets[n, b] = 1
    return targets, resets
