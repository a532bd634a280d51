"""On/off environment switches of the Vulkan layer (CATCHAT_STREAM_FLAGS, CATCHAT_SWEEP_STREAM32,
CATCHAT_OVERLAP_DW, CATCHAT_WAVEFRONT_FORWARD / _BACKWARD): "1" on, "0" off, unset the program's
choice; anything else is the user's mistake, said in one line with how to fix it."""

from __future__ import annotations

import os

from catchat.errors import UsageError


def env_switch(name: str, hint: str) -> bool | None:
    """The switch `name`: True for 1, False for 0, None where unset (or blank); a UsageError naming it
    and `hint` for any other value."""
    raw = os.environ.get(name, "").strip()
    if raw in ("0", "1"):
        return raw == "1"
    if not raw:
        return None
    raise UsageError(f"{name}={raw!r} is not 0 or 1", hint=hint)
