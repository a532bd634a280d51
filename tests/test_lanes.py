"""Lanes: order-preserving stateful truncated BPTT (design.md "Data"; lessons 5 and 6), the cursor."""

import hashlib
import json

import numpy as np
import pytest

from catchat import config
from catchat.data import corpus, vocab
from catchat.data.lane_order import balanced_cuts
from catchat.data.lanes import DataCursor, Lanes, n_valid
from catchat.errors import UsageError

PAD, BOS, EOS = vocab.PAD, vocab.BOS, vocab.EOS


def make_conversations(n, seed=0, lo=3, hi=40):
    """n conversations <bos> x... <eos>; content token of conversation i is 6 + i % 95 (traceable)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        body = [6 + (i % 95)] * int(rng.integers(lo, hi))
        out.append([BOS] + body + [EOS])
    return out


def cycle_windows(lanes, cycle=0):
    return [lanes.window(cycle, p) for p in range(lanes.windows_in(cycle))]


def lane_streams(lanes, cycle=0):
    """tokens, targets, resets of each lane over a whole (unshuffled) cycle: [B] arrays of W*T."""
    ws = [lanes.window_at(i, cycle=cycle) for i in range(lanes.windows_in(cycle))]
    cat = {k: np.concatenate([getattr(w, k) for w in ws], axis=0) for k in ("tokens", "targets", "resets")}
    return [{k: v[:, b] for k, v in cat.items()} for b in range(lanes.B)]


@pytest.fixture
def convs():
    return make_conversations(57, seed=1)


@pytest.fixture
def lanes(convs):
    return Lanes.from_conversations(convs, batch_lanes=5, window=7)


def test_shapes_and_dtypes(lanes):
    w = lanes.window(0, 0)
    for a in (w.tokens, w.targets, w.resets):
        assert a.shape == (7, 5) and a.dtype == np.uint32 and a.flags.c_contiguous
    assert lanes.seqs_per_cycle == lanes.windows_per_cycle * 5
    assert lanes.windows_per_cycle == -(-int(lanes.lane_lengths.max()) // 7)


def test_no_conversation_split_across_lanes_and_order_kept(lanes, convs):
    got = []
    for b, s in enumerate(lane_streams(lanes)):
        toks = s["tokens"][: lanes.lane_lengths[b]]
        assert (s["tokens"][lanes.lane_lengths[b]:] == PAD).all()
        # the lane is whole conversations, back to back, and exactly its assigned run of them
        starts = np.flatnonzero(toks == BOS)
        pieces = np.split(toks, starts[1:])
        assert [list(p) for p in pieces] == [convs[i] for i in lanes.lane_conversations(b)]
        got += [list(p) for p in pieces]
    assert got == convs  # every conversation once, in corpus order (lane 0 first)


def test_resets_exactly_at_conversation_starts_mid_window_too(lanes):
    mid = 0
    for w in cycle_windows(lanes):
        assert np.array_equal(w.resets == 1, w.tokens == BOS)
        mid += int((w.resets[1:] == 1).sum())
    assert mid > 0  # the fixture does have conversations starting inside windows


def test_targets_continue_across_windows(lanes):
    ws = cycle_windows(lanes)
    edges = 0
    for w, nxt in zip(ws, ws[1:]):
        for b in range(lanes.B):
            tok_next = int(nxt.tokens[0, b])
            if w.tokens[-1, b] == EOS or w.tokens[-1, b] == PAD:
                assert w.targets[-1, b] == PAD
            else:  # the last token of a window predicts the first token of the lane's next window
                assert w.targets[-1, b] == tok_next != PAD
                edges += 1
    assert edges > 0


def test_targets_are_next_tokens_masked_at_eos_and_lane_end(lanes):
    for b, s in enumerate(lane_streams(lanes)):
        n = lanes.lane_lengths[b]
        toks, tg = s["tokens"], s["targets"]
        for p in range(len(toks)):
            if p >= n:
                assert tg[p] == PAD and s["resets"][p] == 0  # padding: masked, no reset
            elif toks[p] == EOS:
                assert tg[p] == PAD  # <eos> never predicts the next conversation's <bos>
            else:
                assert tg[p] == toks[p + 1] and tg[p] != BOS
        assert tg[n - 1] == PAD  # the lane's final token


def test_padding_only_at_cycle_end_and_masked(lanes):
    ws = cycle_windows(lanes)
    for b in range(lanes.B):
        col = np.concatenate([w.tokens[:, b] for w in ws])
        first_pad = np.flatnonzero(col == PAD)
        if first_pad.size:
            assert (col[first_pad[0]:] == PAD).all()  # once a lane runs out it stays padding
            assert first_pad[0] == lanes.lane_lengths[b]
    assert lanes.lane_lengths.max() > lanes.lane_lengths.min()
    full = [w for w in ws[:-1] if (w.tokens == PAD).any()]
    assert all(w.index >= (lanes.lane_lengths.min() // lanes.T) for w in full)
    assert sum(w.n_valid for w in ws) == sum(len(c) - 1 for c in make_conversations(57, seed=1))


def test_lesson5_no_state_from_one_conversation_reaches_another(lanes):
    """Simulate the carried state: it may only ever hold the conversation of the current token."""
    W = lanes.windows_per_cycle
    for b in range(lanes.B):
        conv_ids = np.cumsum(np.concatenate([lanes.window_at(i).tokens[:, b] for i in range(W)]) == BOS)
        carried = None  # which conversation the lane's hidden state has seen
        for i in range(W):
            w = lanes.window_at(i)
            for t in range(lanes.T):
                if w.resets[t, b]:
                    carried = None
                tok = w.tokens[t, b]
                cid = conv_ids[i * lanes.T + t]
                if tok == PAD:
                    continue
                assert carried in (None, cid), "state of conversation A fed into conversation B"
                carried = cid
                if w.targets[t, b] != PAD:  # a target is always a token of the same conversation
                    nxt = i * lanes.T + t + 1
                    assert conv_ids[nxt] == cid


def test_cycles_repeat_in_order(lanes):
    for p in range(lanes.windows_per_cycle):
        a, b = lanes.window(0, p), lanes.window(3, p)
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.targets, b.targets)
        assert b.cycle == 3 and b.position == p


def test_cycle_boundary_resets_every_lane(lanes):
    w = lanes.window(1, 0)
    assert (w.resets[0] == 1).all() and (w.tokens[0] == BOS).all()


def test_balanced_cuts_minimise_the_longest_lane():
    rng = np.random.default_rng(5)
    for _ in range(30):
        lengths = rng.integers(1, 50, size=int(rng.integers(6, 14)))
        B = int(rng.integers(2, 6))
        cuts = balanced_cuts(lengths, B)
        sums = [lengths[cuts[b]:cuts[b + 1]].sum() for b in range(B)]
        assert cuts[0] == 0 and cuts[-1] == len(lengths) and (np.diff(cuts) >= 1).all()
        assert max(sums) == brute_force_min_max(list(lengths), B)


def brute_force_min_max(lengths, B):
    from functools import lru_cache

    @lru_cache(None)
    def best(i, k):  # min over partitions of lengths[i:] into k non-empty runs of the max run
        if k == 1:
            return sum(lengths[i:])
        return min(max(sum(lengths[i:j]), best(j, k - 1)) for j in range(i + 1, len(lengths) - k + 2))

    return best(0, B)


def test_fewer_conversations_than_lanes():
    convs = make_conversations(3)
    with pytest.raises(UsageError, match="cannot fill data.batch_lanes = 8"):
        Lanes.from_conversations(convs, batch_lanes=8, window=4)
    lanes = Lanes.from_conversations(convs, batch_lanes=8, window=4, allow_empty_lanes=True)
    w = lanes.window(0, 0)
    assert (w.tokens[:, 3:] == PAD).all() and (w.targets[:, 3:] == PAD).all()


def test_n_valid_counts_non_pad_targets():
    assert n_valid(np.array([[0, 5], [7, 0]], np.uint32)) == 2
    assert n_valid(np.zeros((3, 2), np.uint32)) == 0


# --- stateless mode and block shuffle ------------------------------------------------------------

def test_stateful_shuffle_refused(convs):
    with pytest.raises(UsageError, match="contiguous windows.*lesson 5"):
        Lanes.from_conversations(convs, batch_lanes=4, window=5, carry_state=True, shuffle_block_windows=2)


def test_stateless_resets_every_window(convs):
    lanes = Lanes.from_conversations(convs, batch_lanes=4, window=5, carry_state=False)
    for w in cycle_windows(lanes):
        assert (w.resets[0] == 1).all()
        assert np.array_equal(w.resets[1:] == 1, w.tokens[1:] == BOS)


def test_block_shuffle_deterministic_per_seed(convs):
    kw = dict(batch_lanes=3, window=4, carry_state=False, shuffle_block_windows=3)
    a = Lanes.from_conversations(convs, seed=7, **kw)
    b = Lanes.from_conversations(convs, seed=7, **kw)
    c = Lanes.from_conversations(convs, seed=8, **kw)
    W = a.windows_per_cycle
    assert W > 30
    for cycle in (0, 1):
        oa = a.window_order(cycle)
        assert np.array_equal(oa, b.window_order(cycle))
        assert sorted(oa) == list(range(W))  # every window once per cycle
        k = 0
        while k < W:  # blocks of 3 consecutive windows (the last may be shorter), order kept inside
            start = int(oa[k])
            assert start % 3 == 0
            block = list(range(start, min(start + 3, W)))
            assert list(oa[k:k + len(block)]) == block
            k += len(block)
    assert not np.array_equal(a.window_order(0), c.window_order(0))
    assert not np.array_equal(a.window_order(0), a.window_order(1))  # reshuffled per cycle
    w = a.window(1, 5)
    assert w.index == a.window_order(1)[5] and np.array_equal(w.tokens, a.window_at(w.index).tokens)


# --- cursor ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(carry_state=True), dict(carry_state=False, shuffle_block_windows=2, seed=3),
                                dict(lane_order="longest_first"), dict(lane_order="shuffle", seed=3),
                                dict(lane_order="shuffle", seed=3, carry_state=False, shuffle_block_windows=2)])
def test_cursor_restore_gives_identical_next_windows(convs, kw):
    lanes = Lanes.from_conversations(convs, batch_lanes=4, window=6, **kw)
    W = lanes.windows_per_cycle
    cursor = lanes.start()
    stream = []
    for _ in range(2 * W + 5):  # across two cycle boundaries
        w, cursor = lanes.next(cursor)
        stream.append((w, cursor))
    for k in (0, 1, W - 1, W, W + 3):
        saved = json.loads(json.dumps(stream[k][1].to_dict()))  # through state.json
        fresh = Lanes.from_conversations(convs, batch_lanes=4, window=6, **kw)  # a new process
        c = fresh.restore(saved)
        for j in range(k + 1, min(k + 6, len(stream))):
            w, c = fresh.next(c)
            ref, ref_c = stream[j]
            assert (w.cycle, w.position, w.index) == (ref.cycle, ref.position, ref.index)
            for name in ("tokens", "targets", "resets"):
                assert np.array_equal(getattr(w, name), getattr(ref, name))
            assert c == ref_c


def test_cursor_counts_seqs_and_wraps(lanes):
    c = lanes.start()
    assert c.to_dict() == {"cycle": 0, "window": 0, "seqs": 0, "layout": lanes.layout}
    ws, c = lanes.take(c, 3)  # one step of micro_batches = 3
    assert [w.position for w in ws] == [0, 1, 2] and c.seqs == 3 * lanes.B
    c = DataCursor(0, lanes.windows_per_cycle - 1, 10, lanes.layout)
    w, c = lanes.next(c)
    assert (c.cycle, c.window, c.seqs) == (1, 0, 10 + lanes.B)


def test_cursor_for_other_data_refused(lanes, convs):
    other = Lanes.from_conversations(convs, batch_lanes=5, window=8)
    with pytest.raises(UsageError, match="another data layout"):
        other.restore(lanes.start().to_dict())
    with pytest.raises(UsageError, match="another data layout"):
        other.next(lanes.start())
    with pytest.raises(UsageError, match="not a data cursor"):
        lanes.restore({"cycle": 0, "window": 0})
    with pytest.raises(UsageError, match="non-negative integer"):
        lanes.restore({"cycle": -1, "window": 0, "seqs": 0, "layout": lanes.layout})
    with pytest.raises(UsageError, match="past this cycle"):
        lanes.restore({"cycle": 0, "window": 10**6, "seqs": 0, "layout": lanes.layout})
    for kw in (dict(lane_order="longest_first"), dict(lane_order="shuffle"), dict(lane_order="shuffle", seed=1)):
        laid = Lanes.from_conversations(convs, batch_lanes=5, window=7, **kw)  # the same data, laid out otherwise
        with pytest.raises(UsageError, match="another data layout.*data.lane_order"):
            laid.restore(lanes.start().to_dict())


# --- from a built corpus ---------------------------------------------------------------------------

@pytest.fixture
def built(tmp_path):
    src = tmp_path / "chats.jsonl"
    rng = np.random.default_rng(2)
    with open(src, "w") as f:
        for i in range(80):
            turns = [{"speaker": "AB"[k % 2], "text": f"conversation {i} turn {k} " + "x" * int(rng.integers(0, 30))}
                     for k in range(int(rng.integers(1, 4)))]
            f.write(json.dumps({"turns": turns}) + "\n")
    corpus.build([src], tmp_path / "c", eval_fraction=0.2)
    return corpus.Corpus.open(tmp_path / "c")


def test_lanes_from_corpus_use_one_side_of_the_split(built):
    sp = built.split(0.2)
    train = Lanes.from_corpus(built, batch_lanes=4, window=16, split="train", eval_fraction=0.2)
    ev = Lanes.from_corpus(built, batch_lanes=4, window=16, split="eval", eval_fraction=0.2)
    assert train.conversations == len(sp.train) and ev.conversations == len(sp.eval)
    assert train.layout != ev.layout

    def texts(lanes):
        out = []
        for s in lane_streams(lanes):
            toks = s["tokens"][s["tokens"] != PAD]
            out += [vocab.decode(p) for p in np.split(toks, np.flatnonzero(toks == BOS)[1:])]
        return out

    assert texts(train) == [built.text(i, show_specials=False) for i in sp.train]
    assert texts(ev) == [built.text(i, show_specials=False) for i in sp.eval]


def test_max_conversations_caps_and_says_so(built):
    lanes = Lanes.from_corpus(built, batch_lanes=2, window=16, max_conversations=20, eval_fraction=0.2)
    assert lanes.conversations == len(built.split(0.2, 20).train) < 20
    assert any("first 20 of 80 conversations" in n for n in lanes.describe())


def test_from_config(built):
    cfg = config.loads(f'[data]\ncorpus = "{built.path}"\nbatch_lanes = 3\nwindow = 9\ncarry_state = false\n'
                       "shuffle_block_windows = 2\neval_fraction = 0.2\n[train]\nseed = 11\ntotal_steps = 5\n")
    lanes = Lanes.from_config(built, cfg)
    assert (lanes.B, lanes.T, lanes.carry_state, lanes.shuffle_block_windows, lanes.seed) == (3, 9, False, 2, 11)
    ev = Lanes.from_config(built, cfg, split="eval")
    assert ev.shuffle_block_windows == 0  # eval never shuffles
    laid = Lanes.from_config(built, config.with_changes(cfg, data={"lane_order": "shuffle"}))
    assert laid.lane_order == "shuffle" and laid.layout != lanes.layout
    ev_laid = Lanes.from_config(built, config.with_changes(cfg, data={"lane_order": "shuffle"}), split="eval")
    assert ev_laid.lane_order == "corpus" and ev_laid.layout == ev.layout  # eval keeps corpus order
    steps = config.planned_total_steps(config.with_changes(cfg, train={"total_steps": 0, "cycles": 2}),
                                       lanes.seqs_per_cycle)
    assert steps == 2 * lanes.windows_per_cycle


def test_empty_eval_split_is_a_usage_error(built):
    with pytest.raises(UsageError, match="eval split .* is empty"):
        Lanes.from_corpus(built, batch_lanes=2, window=8, split="eval", eval_fraction=0.0)


# --- lane orders (data.lane_order) ----------------------------------------------------------------

# The corpus layout's windows (cycles 0 and 1) and ids as they were before data.lane_order existed:
# checkpoints of older runs resume onto the same data only while these hold.
# (Lanes arguments, make_conversations(n, seed), layout id, windows per cycle, digest of the windows)
CORPUS_GOLDEN = [(dict(batch_lanes=5, window=7), (57, 1), "4df1c67135eae53a", 40, "78345ce1196a83bd"),
                 (dict(batch_lanes=4, window=6, carry_state=False, shuffle_block_windows=2, seed=3), (57, 1),
                  "128569c521fb3f2d", 57, "79e5b58445543d4a"),
                 (dict(batch_lanes=8, window=4, allow_empty_lanes=True), (3, 0), "26b792164ebcf307", 9,
                  "83e57fa9cfd070f3")]


def windows_digest(lanes, cycles=(0, 1)) -> str:
    h = hashlib.sha256()
    for c in cycles:
        for w in cycle_windows(lanes, c):
            for a in (w.tokens, w.targets, w.resets):
                h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("kw,made,layout,windows,digest", CORPUS_GOLDEN)
def test_corpus_lane_order_is_the_layout_of_before(kw, made, layout, windows, digest):
    convs = make_conversations(made[0], seed=made[1])
    for lanes in (Lanes.from_conversations(convs, **kw), Lanes.from_conversations(convs, lane_order="corpus", **kw)):
        assert (lanes.layout, lanes.windows_per_cycle, windows_digest(lanes)) == (layout, windows, digest)


def test_corpus_lane_order_keeps_a_built_corpus_layout_id(built):
    """from_corpus's id (the one runs' cursors hold) of the corpus layout, as before data.lane_order."""
    assert Lanes.from_corpus(built, batch_lanes=4, window=16, eval_fraction=0.2).layout == "42de4e83cd10d950"


@pytest.mark.parametrize("order", ["corpus", "longest_first", "shuffle"])
def test_every_lane_order_reads_each_conversation_once_whole_in_order(convs, order):
    """Per cycle: every token of every conversation once, in order, on one lane; resets exactly at
    conversation starts; targets never cross a conversation; padding only at a lane's end."""
    lanes = Lanes.from_conversations(convs, batch_lanes=5, window=7, lane_order=order, seed=4)
    seen_orders = []
    for cycle in (0, 1, 2):
        assert lanes.windows_in(cycle) == -(-int(lanes.layout_of(cycle).lane_lengths.max()) // 7)
        read = []
        for b, s in enumerate(lane_streams(lanes, cycle)):
            n = int(lanes.layout_of(cycle).lane_lengths[b])
            toks = s["tokens"][:n]
            assert (s["tokens"][n:] == PAD).all() and (s["targets"][n:] == PAD).all() and (s["resets"][n:] == 0).all()
            assert np.array_equal(s["resets"][:n] == 1, toks == BOS)  # a reset exactly where a conversation starts
            assert (s["targets"][:n][toks == EOS] == PAD).all() and s["targets"][n - 1] == PAD
            pieces = np.split(toks, np.flatnonzero(toks == BOS)[1:])
            ids = list(lanes.lane_conversations(b, cycle))
            assert [list(p) for p in pieces] == [convs[i] for i in ids]  # whole, in order, on this lane
            read += ids
        assert sorted(read) == list(range(len(convs)))  # each conversation exactly once per cycle
        seen_orders.append(read)
    if order == "shuffle":  # a new layout every cycle
        assert seen_orders[0] != seen_orders[1] != seen_orders[2]
    else:  # the same layout every cycle
        assert seen_orders[0] == seen_orders[1] == seen_orders[2]
    if order == "corpus":
        assert seen_orders[0] == list(range(len(convs)))


def test_longest_first_gives_each_to_the_least_loaded_lane():
    lengths = [3, 9, 5, 9, 2, 7]  # longest first: 1 (9), 3 (9), 5 (7), 2 (5), 0 (3), 4 (2)
    convs = [[BOS] + [6 + i] * (n - 2) + [EOS] for i, n in enumerate(lengths)]
    lanes = Lanes.from_conversations(convs, batch_lanes=2, window=4, lane_order="longest_first")
    # 1 -> lane 0 (the tie: lowest lane); 3 -> 1; 5 -> 0 (tie at 9); 2 -> 1 (14 < 16); 0 -> 1 (14); 4 -> 0 (16 < 17)
    assert [list(lanes.lane_conversations(b)) for b in range(2)] == [[1, 5, 4], [3, 2, 0]]
    assert list(lanes.lane_lengths) == [18, 17] and lanes.windows_per_cycle == 5


def test_shuffle_is_a_function_of_seed_and_cycle(convs):
    kw = dict(batch_lanes=4, window=6, lane_order="shuffle")
    a, b, c = (Lanes.from_conversations(convs, seed=s, **kw) for s in (7, 7, 8))
    assert a.layout == b.layout != c.layout  # the cursor's layout names the seed
    for cycle in (0, 1, 5):
        assert np.array_equal(a.layout_of(cycle).order, b.layout_of(cycle).order)
        assert np.array_equal(a.layout_of(cycle).cuts, b.layout_of(cycle).cuts)
        assert windows_digest(a, [cycle]) == windows_digest(b, [cycle])
    assert not np.array_equal(a.layout_of(0).order, c.layout_of(0).order)
    assert b.window(5, 2).tokens.tobytes() == a.window(5, 2).tokens.tobytes()  # asked in any order: the same
    # each cycle has its own length; the cursor wraps at each cycle's own end
    cursor, counted = a.start(), {}
    while cursor.cycle < 6:
        w, after = a.next(cursor)
        counted[w.cycle] = counted.get(w.cycle, 0) + 1
        cursor = after
    assert counted == {k: a.windows_in(k) for k in range(6)} and len(set(counted.values())) > 1
    assert cursor.seqs == sum(counted.values()) * a.B
