"""On/off environment switches of the Vulkan layer (CATCHAT_STREAM_FLAGS, CATCHAT_SWEEP_STREAM32,
CATCHAT_OVERLAP_DW, CATCHAT_WAVEFRONT_FORWARD / _BACKWARD): "1" on, "0" off, unset the program's
choice; anything else is the user's mistake, said in one line with how to fix it. `env_choice`: a
number from a short list (CATCHAT_DECODE_TILE, CATCHAT_DECODE_COOP_STREAMS). `env_count`: a whole
number with a floor (CATCHAT_TOKEN_SUM_PARTS, CATCHAT_STREAM32_DEPTH, CATCHAT_WAVEFRONT).
`env_override`: a variable set for the length of a `with` (what the tools and parity use to run one
variant)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from catchat.errors import UsageError


def env_switch(name: str, hint: str, default: bool | None = None) -> bool | None:
    """The switch `name`: True for 1, False for 0, `default` where unset (or blank); a UsageError naming
    it and `hint` for any other value."""
    raw = os.environ.get(name, "").strip()
    if raw in ("0", "1"):
        return raw == "1"
    if not raw:
        return default
    raise UsageError(f"{name}={raw!r} is not 0 or 1", hint=hint)


def env_choice(name: str, choices: tuple[int, ...], default: int) -> int:
    """The whole number `name` names, one of `choices`; `default` where unset (or blank); a UsageError
    naming it and the choices for any other value."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw in {str(c) for c in choices}:
        return int(raw)
    listed = ", ".join(str(c) for c in choices)
    raise UsageError(f"{name}={raw!r} is not one of {listed}", hint=f"set one of {listed}, or unset it")


def env_count(name: str, hint: str, least: int = 1) -> int | None:
    """The whole number `name` names, at least `least`; None where unset (or blank); a UsageError naming
    it and `hint` for any other value."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if raw.isdigit() and int(raw) >= least:
        return int(raw)
    raise UsageError(f"{name}={raw!r} is not a whole number of at least {least}", hint=hint)


@contextmanager
def env_override(name: str, value: str) -> Iterator[None]:
    """The environment variable `name` set to `value` inside the `with`, then as it was (unset again
    if it was unset)."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
