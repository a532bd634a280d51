"""How the conversations of a split are laid into B lanes (data.lane_order; docs/data.md "Lane order").

Every layout puts each conversation whole on one lane, read in order; a lane reads its conversations
back to back. A layout is the order the lanes read the conversations in (lane 0's first) and the cuts
of that order into lanes: lane b reads order[cuts[b]:cuts[b + 1]]. Three layouts:
- "corpus": corpus order cut into B contiguous runs so that the longest lane is as short as possible
  (`balanced_cuts`); the same every cycle. The default, and the only one before data.lane_order.
- "longest_first": longest conversation first (ties: corpus order), each onto the lane then holding
  the fewest tokens (ties: the lowest lane); a lane reads its conversations in the order it was given
  them. The same every cycle.
- "shuffle": per cycle, a permutation of the conversations drawn from (train.seed, cycle), cut by
  `balanced_cuts` like corpus order. Cuts rather than a least-loaded assignment of the permuted order:
  a permutation puts long conversations last as often as first, and the least-loaded lane then gets
  them late. On Shakespeare's train split without the three held-out plays (727 scenes, B = 64,
  T = 1024), 10 seeds took 76-78 windows a cycle cut, 85-109 assigned least-loaded, against 76 for
  corpus order and 72 for longest_first. The cycle's length therefore varies a little from cycle to
  cycle (`LaneLayout.windows`).

Each is a pure function of the conversations' lengths, B, and for "shuffle" the seed and cycle, so a
resumed run lays the lanes out exactly as a straight one did.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

LANE_ORDERS = ("corpus", "longest_first", "shuffle")
CORPUS, LONGEST_FIRST, SHUFFLE = LANE_ORDERS
LANE_SHUFFLE_STREAM = 0x4C414E45  # "LANE": keeps the lanes' permutation apart from the block shuffle's (seed, cycle)


def balanced_cuts(lengths: np.ndarray, lanes: int) -> np.ndarray:
    """Cut points [lanes + 1]: lane b holds conversations [cuts[b], cuts[b + 1]) (in order).

    The longest lane sets the cycle length (windows_per_cycle), so the cuts minimise it: C is
    the smallest capacity for which filling lanes in order (a lane takes conversations while it
    stays <= C tokens) fits every conversation into `lanes` lanes; the lanes are then filled that
    way, keeping one conversation for each lane still to fill. With fewer conversations than
    lanes, lane b holds conversation b and the rest are empty."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n <= lanes:
        return np.minimum(np.arange(lanes + 1, dtype=np.int64), n)
    cum = np.concatenate([[0], np.cumsum(lengths)])

    def fill(cap: int, reserve: bool) -> list[int] | None:
        cuts, start = [0], 0
        for b in range(lanes):
            if start == n:
                return None if reserve else cuts + [n] * (lanes - b)
            end = int(np.searchsorted(cum, cum[start] + cap, side="right")) - 1  # fits in cap
            if reserve:
                end = min(end, n - (lanes - b - 1))
            end = max(end, start + 1)
            cuts.append(end)
            start = end
        return cuts if start == n else None

    lo, hi = int(lengths.max()), int(cum[-1])
    while lo < hi:
        mid = (lo + hi) // 2
        if fill(mid, reserve=False) is not None:
            hi = mid
        else:
            lo = mid + 1
    cuts = fill(lo, reserve=True)
    assert cuts is not None
    return np.asarray(cuts, dtype=np.int64)


def longest_lane(lengths: np.ndarray, lanes: int) -> int:
    """Tokens in the longest of `lanes` lanes cut by `balanced_cuts`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    cuts = balanced_cuts(lengths, lanes)
    return int((cum[cuts[1:]] - cum[cuts[:-1]]).max())


def least_loaded(order: np.ndarray, lengths: np.ndarray, lanes: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, cuts) of giving the conversations `order` (positions into `lengths`), one after the
    other, each to the lane then holding the fewest tokens (ties: the lowest lane): each lane's
    conversations in the order it was given them, lane 0's first."""
    heap = [(0, b) for b in range(lanes)]  # (tokens held, lane): the heap's smallest is the least-loaded, lowest lane
    given: list[list[int]] = [[] for _ in range(lanes)]
    for i in order:
        load, b = heapq.heappop(heap)
        given[b].append(int(i))
        heapq.heappush(heap, (load + int(lengths[i]), b))
    counts = np.array([len(g) for g in given], dtype=np.int64)
    flat = np.array([i for g in given for i in g], dtype=np.int64)
    return flat, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


class LaneLayout:
    """One layout of the conversations (lengths [N], tokens) into lanes, and its windows of T tokens.

    The virtual stream is the conversations in `order`, back to back: lane b is its tokens
    [lane_base[b], lane_base[b] + lane_lengths[b]); `starts[k]` is where the k-th conversation of the
    stream starts in it."""

    def __init__(self, order: np.ndarray, cuts: np.ndarray, lengths: np.ndarray, window: int):
        self.order = np.asarray(order, dtype=np.int64)  # [N] positions in the selected list, in stream order
        self.cuts = np.asarray(cuts, dtype=np.int64)  # [B + 1] lane b reads order[cuts[b]:cuts[b + 1]]
        self.cum = np.concatenate([[0], np.cumsum(np.asarray(lengths, np.int64)[self.order])]).astype(np.int64)
        self.lane_base = self.cum[self.cuts[:-1]]  # [B] tokens: where each lane starts in the stream
        self.lane_lengths = self.cum[self.cuts[1:]] - self.lane_base  # [B] tokens
        self.windows = int(math.ceil(int(self.lane_lengths.max()) / window))  # windows this layout's cycle takes

    def lane_conversations(self, b: int) -> np.ndarray:
        """Positions (in the selected list) of lane b's conversations, in the order the lane reads them."""
        return self.order[self.cuts[b]:self.cuts[b + 1]]


def lay_out(lane_order: str, lengths: np.ndarray, lanes: int, window: int, *, seed: int = 0,
            cycle: int = 0) -> LaneLayout:
    """The layout `lane_order` gives conversations of these lengths in `lanes` lanes (at cycle `cycle`
    of a run seeded `seed`: only "shuffle" depends on them)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if lane_order == CORPUS:
        order = np.arange(n, dtype=np.int64)
        return LaneLayout(order, balanced_cuts(lengths, lanes), lengths, window)
    if lane_order == LONGEST_FIRST:
        return LaneLayout(*least_loaded(np.argsort(-lengths, kind="stable"), lengths, lanes), lengths, window)
    if lane_order == SHUFFLE:
        rng = np.random.Generator(np.random.PCG64([seed, cycle, LANE_SHUFFLE_STREAM]))
        order = rng.permutation(n).astype(np.int64)
        return LaneLayout(order, balanced_cuts(lengths[order], lanes), lengths, window)
    raise ValueError(f"lane_order must be one of {', '.join(LANE_ORDERS)}, got {lane_order!r}")
