"""state.json under the same integrity check as the tensors (issue 39 item 3).

Range checks alone cannot tell `applied_steps` 100 from 99, or `cursor.window` 100 from 50: both
are valid values, and a resume that trusted them would continue with other weights and exit 0. So
a checkpoint keeps a copy of its state in a place an edit cannot silently match:

    model.safetensors  header metadata "state": every field of state.json except `sha256`, as
                       canonical JSON (sorted keys, no spaces, ASCII)
    state.json         `sha256`: the hash of model.safetensors (that header included)

An edited state.json no longer equals the copy, and the loader names the fields that differ. An
edited copy changes model.safetensors, whose recorded sha256 then differs. `sha256` itself stays out
of the copy: it is the hash of the file that holds the copy (it could not be inside it), and an
edit of it is caught by the hash check. Making both agree again takes rewriting the tensor file
and its hash on purpose: sha256 is a checksum, not a signature, so a deliberate forgery is out of
scope (docs/reliability.md).

A checkpoint written before this (no "state" in its metadata) loads as it did: its fields are
checked for type and range only.
"""

from __future__ import annotations

import json

METADATA_KEY = "state"
_NOT_COPIED = ("sha256",)  # the hash of the file that holds the copy
_MAX_SHOWN = 4  # differences named in the one-line message; the rest are counted


def canonical(state: dict) -> str:
    """The copy of `state` kept in the model file's metadata. Computed from state as read back
    from JSON (`saved_copy`), so that the loader's canonical form of an unedited state.json is the
    same string: JSON turns tuples into lists and integer keys into strings."""
    return json.dumps({k: v for k, v in state.items() if k not in _NOT_COPIED},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def saved_copy(state: dict) -> str:
    """canonical(state) as it will read back from state.json."""
    return canonical(json.loads(json.dumps(state, sort_keys=True)))


def differences(state: dict, copy: str) -> list[str]:
    """The fields where `state` (state.json as loaded) differs from the saved copy, one phrase
    each ("applied_steps is 99, saved 100"), at most _MAX_SHOWN and a count of the rest; empty when
    they agree. A copy that is not a JSON object (only a forged file holds one) is one phrase."""
    if canonical(state) == copy:
        return []
    try:
        saved = json.loads(copy)
    except (ValueError, RecursionError):
        saved = None
    if not isinstance(saved, dict):
        return [f"the copy in the tensor file's metadata {METADATA_KEY!r} is unreadable"]
    now = _leaves({k: v for k, v in state.items() if k not in _NOT_COPIED})
    was = _leaves(saved)
    found = []
    for path in sorted(set(now) | set(was)):
        if path not in was:
            found.append(f"{path} is new ({_shown(now[path])}; not saved)")
        elif path not in now:
            found.append(f"{path} is missing (saved {_shown(was[path])})")
        elif _differ(now[path], was[path]):
            found.append(f"{path} is {_shown(now[path])}, saved {_shown(was[path])}")
    if not found:  # equal leaves, other text: cannot happen for JSON, but never report "no difference"
        found = ["its canonical form"]
    if len(found) > _MAX_SHOWN:
        found = found[:_MAX_SHOWN] + [f"and {len(found) - _MAX_SHOWN} more"]
    return found


def _leaves(value, prefix: str = "") -> dict[str, object]:
    """Dotted path -> value of every leaf (an empty table or list counts as a leaf)."""
    if isinstance(value, dict) and value:
        out = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{_key(k)}" if prefix else _key(k)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, v in enumerate(value):
            out.update(_leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix or "(the whole state)": value}


def _differ(a, b) -> bool:
    """Unequal as JSON: 1 and 1.0 and true differ (a type edit is an edit)."""
    return json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True)


def _key(k: str) -> str:
    """A key for a one-line message: as is when plain, else quoted (newlines escaped)."""
    return k if k.isprintable() and k and "." not in k and " " not in k else json.dumps(k)


def _shown(value, limit: int = 40) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."
