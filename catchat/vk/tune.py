"""The tuning cache: tile choices `catchat bench --tune` measured on this device, per shape.

One JSON file per device and driver under `$CATCHAT_CACHE/tune/` (default `~/.cache/catchat/tune/`,
beside the SPIR-V cache), written atomically:

    {"version": 1, "device": NAME, "driver": DRIVER, "limits": {...},
     "gemm": {"MxNxK/sS/AB": [BM, BN, BK, TM, TN]},
     "gru": {"fwd/B64/H512/wg132": ["ResidentTiles" | "tuple", [...]]},
     "coop": {"MxNxK/sS/AB": [WM, WN, FM, FN, BK, STAGES, API]},
     "split": {"MxNxK/sS/AB": [WM, WN, FM, FN, BK, STAGES, API]},
     "measured": {"KIND/KEY": [[candidate, microseconds], ...]}}

"gemm" holds glsl/gemm.comp's tiles (GemmTiles), "coop" the tensor-core GEMM's (glsl/gemm_coopmat.comp,
CoopTiles as `dataclasses.astuple` gives them: what train.precision "fp16" runs on a GPU with
cooperative matrices), "split" the float32 GEMM's from float16 splits (the same kernel's SPLIT mode,
CoopTiles too: what train.precision "fp32" runs there for its large GEMMs), "gru" the recurrent sweeps'.
Version 1 files written before "coop" or "split" existed load as they are (a kind a file lacks is
empty). The pickers (`gemm.gemm_tiles`, `gemm.pick_coop_tiles`, `gemm.pick_split_tiles`,
`gru.default_tiles`) ask `lookup` first and fall back to the tables of catchat/vk/tiles.py,
`gemm.coop_tiles` and `gemm.split_tiles`. A file that cannot be read, is not this format, or was written
under other limits (a driver update that changed them) is ignored with a warning; a cached choice
that is no longer one of the candidates for its shape is ignored with a note (`note`). Neither is
ever an error: the tables still give a choice. `CATCHAT_TUNE=0` ignores the cache altogether.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

from catchat.environment import cache_root
from catchat.fsutil import atomic_write_bytes, atomic_write_text
from catchat.vk.switches import env_override

VERSION = 1
ENV_TUNE = "CATCHAT_TUNE"
KINDS = ("gemm", "gru", "coop", "split")  # a file without one of them has none of that kind

_said: set[str] = set()
_loaded: dict = {}
_asked: dict | None = None  # while `recording`: (kind, key) -> the shape the picker was asked for


@contextmanager
def recording():
    """Collect every (kind, key) -> shape the pickers are asked for inside the `with` (what
    `catchat bench --tune` measures: the shapes a program of the config really uses)."""
    global _asked
    prev, _asked = _asked, {}
    try:
        yield _asked
    finally:
        _asked = prev


def note(message: str) -> None:
    """Print a tuning-cache warning on stderr, once per process (it may be asked for per kernel)."""
    if message not in _said:
        _said.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def disabled():
    """The pickers ignore the cache inside the `with` (CATCHAT_TUNE=0): the tables' choices."""
    return env_override(ENV_TUNE, "0")


def snapshot(info) -> bytes | None:
    """This device's cache file as it is now (None: there is none), for `restore`."""
    try:
        return cache_path(info).read_bytes()
    except FileNotFoundError:
        return None


def restore(info, saved: bytes | None) -> None:
    """Put back the cache file a `snapshot` saw (remove it where there was none)."""
    path = cache_path(info)
    if saved is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write_bytes(path, saved)
    _loaded.clear()


def tune_dir() -> Path:
    """Where tuned choices live: the user cache's tune/ (beside the SPIR-V cache)."""
    return cache_root() / "tune"


def limits(info) -> dict:
    """The device limits a tile choice depends on: a cache written under others is ignored."""
    return {"max_shared_memory_bytes": int(info.max_shared_memory_bytes),
            "max_workgroup_invocations": int(info.max_workgroup_invocations),
            "subgroup_size": int(info.subgroup_size), "compute_units": int(info.compute_units)}


def cache_path(info) -> Path:
    """The file of this device name and driver version."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", info.name).strip("-")[:48] or "device"
    digest = hashlib.sha256(f"{info.name}\0{info.driver}".encode()).hexdigest()[:12]
    return tune_dir() / f"{slug}-{digest}.json"


def gemm_key(M: int, N: int, K: int, split_k: int, trans_a: bool, trans_b: bool) -> str:
    return f"{M}x{N}x{K}/s{split_k}/{'T' if trans_a else 'N'}{'T' if trans_b else 'N'}"


def gru_key(B: int, H: int, backward: bool, resident: int) -> str:
    return f"{'bwd' if backward else 'fwd'}/B{B}/H{H}/wg{resident}"


def _read(path: Path, info) -> dict | None:
    """The file's contents if it is a valid cache of this device, else None (with a warning)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        note(f"ignoring the tuning cache {path}: unreadable ({e.__class__.__name__}: {e}); "
             "`catchat bench CONFIG --tune` rewrites it")
        return None
    if (not isinstance(data, dict) or data.get("version") != VERSION
            or not all(isinstance(data.get(k, {}), dict) for k in KINDS)):
        note(f"ignoring the tuning cache {path}: not a version-{VERSION} catchat tuning file; "
             "`catchat bench CONFIG --tune` rewrites it")
        return None
    if data.get("device") != info.name or data.get("driver") != info.driver or data.get("limits") != limits(info):
        note(f"ignoring the tuning cache {path}: written for {data.get('device')!r} ({data.get('driver')!r}) "
             f"with limits {data.get('limits')}; this device reports {limits(info)}")
        return None
    return data


def load(info) -> dict | None:
    """This device's cache (re-read when the file changes), None where there is none or it is ignored."""
    if os.environ.get(ENV_TUNE, "").strip() == "0":
        return None
    path = cache_path(info)
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path), st.st_mtime_ns, st.st_size, info.name, info.driver, tuple(limits(info).items()))
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = _read(path, info)
    return _loaded[key]


def lookup(info, kind: str, key: str, shape: dict | None = None):
    """The cached choice for `key` of `kind` (one of KINDS) on this device, or None. `shape`
    (the key's numbers) is what `recording` collects."""
    if _asked is not None and shape is not None:
        _asked.setdefault((kind, key), shape)
    data = load(info)
    return None if data is None else data.get(kind, {}).get(key)


def store(info, choices: dict, measured: dict | None = None) -> Path:
    """Merge `choices` ({kind: {key: value}}) and their measurements into this device's file
    (a valid existing file keeps its other keys), written atomically. Returns the path."""
    path = cache_path(info)
    old = _read(path, info) if path.exists() else None
    data = old or {"version": VERSION, "device": info.name, "driver": info.driver, "limits": limits(info)}
    for kind in KINDS:
        data.setdefault(kind, {}).update(choices.get(kind, {}))
    data.setdefault("measured", {}).update(measured or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _loaded.clear()
    return path
