"""safetensors files written and read by catchat itself: byte-identical output for identical state.

Why not `safetensors.numpy.save`: it writes the header's keys in hash-map order, so two equal
runs' checkpoints get different sha256 sums. Here the format is written canonically:

    8 bytes    N, the header length (unsigned little-endian)
    N bytes    a JSON object, UTF-8, compact separators, keys sorted (nested ones too), padded
               with spaces to a multiple of 8 bytes (as the reference implementation pads):
                 "__metadata__": {str: str}      (left out when there is no metadata)
                 name: {"data_offsets": [begin, end], "dtype": "F32", "shape": [d0, d1, ...]}
    the data   each tensor's bytes, little-endian, C order; tensors laid out in sorted-name order,
               covering the data section exactly (offsets relative to its start)

Files written here load with the `safetensors` package and files it writes load here. `read`
validates everything a corrupt or hostile file could get wrong before it allocates or trusts
anything, and raises one-line `UsageError`s (never json / numpy / OS exceptions).

    blob = dumps({"w": np.ones((2, 3), np.float32)}, {"step": "7"})
    write(path, tensors, metadata)              # dumps + fsync
    tensors, metadata = read(path)              # writable arrays the caller owns
    metadata = read_metadata(path)              # the header only: cheap
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from catchat.errors import UsageError

MAX_HEADER_BYTES = 100 * 2**20  # 100 MiB, about the reference's cap (100 MB): no real header is near it
MAX_DIMS = 32  # numpy's limit (np.empty refuses more), far above any real tensor
INT64_MAX = 2**63 - 1  # numpy's limit on an array's byte size, even counting only its non-zero dimensions
METADATA_KEY = "__metadata__"
CORRUPT_HINT = "the file is corrupt: resume from an earlier checkpoint"

# safetensors dtype code -> numpy dtype, little-endian (the format's byte order)
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"), "I16": np.dtype("<i2"), "F16": np.dtype("<f2"),
    "U32": np.dtype("<u4"), "I32": np.dtype("<i4"), "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"), "I64": np.dtype("<i8"), "F64": np.dtype("<f8"),
}
_CODES = {(dt.kind, dt.itemsize): code for code, dt in DTYPES.items()}


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

def dumps(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """The whole file as bytes (see the module doc). Raises ValueError for a dtype the format
    lacks (complex, object, strings, ...), a non-str name or metadata entry, or '__metadata__'
    used as a tensor name."""
    header, arrays = _prepare(tensors, metadata)
    return b"".join([header, *(a.tobytes() for a in arrays)])


def write(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> str:
    """Write `dumps(tensors, metadata)` to `path` and fsync it (the caller renames it into place).
    Streams tensor by tensor, so the file is never held in memory twice. Returns the sha256 (hex)
    of the bytes written, hashed on the way: a checkpoint records it without reading the file back."""
    header, arrays = _prepare(tensors, metadata)
    digest = hashlib.sha256(header)
    with open(path, "wb") as f:
        f.write(header)
        for a in arrays:
            data = a.reshape(-1).view(np.uint8)
            digest.update(data)
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


def _prepare(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None) -> tuple[bytes, list[np.ndarray]]:
    """(length prefix + padded header, the arrays in file order as little-endian C-contiguous)."""
    header: dict = {}
    if metadata:
        _check_str_map(metadata)
        header[METADATA_KEY] = dict(metadata)
    arrays, offset = [], 0
    for name in sorted(_check_names(tensors)):
        a = _little_endian(tensors[name], name)
        header[name] = {"data_offsets": [offset, offset + a.nbytes], "dtype": dtype_code(a.dtype, name),
                        "shape": list(a.shape)}
        offset += a.nbytes
        arrays.append(a)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writes it
    return struct.pack("<Q", len(text)) + text, arrays


def _check_names(tensors: dict) -> list[str]:
    names = list(tensors)
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be strings, got {type(name).__name__} {name!r}")
        if name == METADATA_KEY:
            raise ValueError(f"{METADATA_KEY!r} is reserved for the metadata and cannot name a tensor")
    return names


def _check_str_map(metadata: dict) -> None:
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"metadata must map str to str, got {k!r}: {type(v).__name__}")


def _little_endian(value, name: str) -> np.ndarray:
    """The array as little-endian and C-contiguous (a copy only where it is not already; 0-d
    arrays stay 0-d, which np.ascontiguousarray would not keep)."""
    a = np.asarray(value)
    dtype_code(a.dtype, name)  # refuse unsupported dtypes before converting anything
    return np.asarray(a, dtype=a.dtype.newbyteorder("<"), order="C")


def dtype_code(dtype: np.dtype, name: str = "") -> str:
    """The safetensors code of a numpy dtype ("F32", ...); ValueError for one the format lacks."""
    dtype = np.dtype(dtype)
    code = _CODES.get((dtype.kind, dtype.itemsize)) if dtype.fields is None else None
    if code is None:
        where = f" (tensor {name!r})" if name else ""
        raise ValueError(f"dtype {dtype} cannot be stored in safetensors{where}; supported: " + ", ".join(DTYPES))
    return code


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """One header entry, validated: where the tensor's bytes are in the data section."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


class _Corrupt(Exception):
    """Internal: why the file is invalid (turned into a UsageError naming the file)."""


def read(path: str | Path, *, max_header_bytes: int = MAX_HEADER_BYTES) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of a safetensors file, fully validated.

    The arrays are fresh, writable, C-contiguous copies the caller owns (read straight from the
    file into their own memory: no mmap or shared buffer stays behind, so the file may be deleted
    or rewritten afterwards). Any invalid file raises UsageError (see the module doc)."""
    with _open(path) as f:
        infos, metadata, data_start = _read_header(f, path, max_header_bytes)
        try:
            tensors = {i.name: _read_tensor(f, data_start, i) for i in infos}
        except _Corrupt as exc:
            raise _usage(path, str(exc)) from None
        except OSError as exc:
            raise UsageError(f"{_shown_path(path)}: cannot read it: {exc.strerror or exc}", hint=CORRUPT_HINT) from None
    return tensors, metadata


def read_metadata(path: str | Path, *, max_header_bytes: int = MAX_HEADER_BYTES) -> dict[str, str]:
    """The metadata of a safetensors file, reading only its header (which is fully validated,
    offsets against the file's size included; the tensor data is not read)."""
    with _open(path) as f:
        return _read_header(f, path, max_header_bytes)[1]


def _open(path) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise UsageError(f"{_shown_path(path)}: cannot open it: {exc.strerror or exc}",
                         hint="check that the file exists and is readable, "
                              "or resume from an earlier checkpoint") from None


def _read_header(f: BinaryIO, path, max_header_bytes: int) -> tuple[list[TensorInfo], dict[str, str], int]:
    """Validate and parse the header: (tensor infos in file order, metadata, data section start)."""
    try:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise _Corrupt(f"it is {size} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", _read_exactly(f, 8))
        if n > max_header_bytes:  # checked before anything of that size is allocated
            raise _Corrupt(f"its header length {n} exceeds the {max_header_bytes}-byte cap")
        if n > size - 8:
            raise _Corrupt(f"its header length {n} runs past the end of the {size}-byte file")
        header = _parse_json(_read_exactly(f, n))
        if not isinstance(header, dict):
            raise _Corrupt("its header is not a JSON object")
        infos, metadata = _validate(header, data_len=size - 8 - n)
    except _Corrupt as exc:
        raise _usage(path, str(exc)) from None
    except OSError as exc:
        raise UsageError(f"{_shown_path(path)}: cannot read it: {exc.strerror or exc}", hint=CORRUPT_HINT) from None
    return infos, metadata, 8 + n


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:  # the file shrank while we read it
        raise _Corrupt(f"it ended early ({len(data)} of {n} bytes)")
    return data


def _parse_json(raw: bytes) -> dict:
    """The header as a dict; _Corrupt for anything but one UTF-8 JSON object without duplicate
    keys (deep nesting, 5000-digit integers and the like included)."""
    if not raw.startswith(b"{"):
        raise _Corrupt("its header does not start with '{'")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise _Corrupt("its header is not UTF-8") from None
    except _Corrupt:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, int digit limit, nesting depth
        raise _Corrupt(f"its header is not valid JSON ({_one_line(str(exc))})") from None


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):  # the reference keeps one silently: which one is ambiguous
        raise _Corrupt("its header repeats a key")
    return out


def _validate(header: dict, data_len: int) -> tuple[list[TensorInfo], dict[str, str]]:
    """Check every entry, and that the tensors tile the data section exactly (the reference's
    rule: no overlap, no gap, nothing after the last tensor)."""
    metadata = header.get(METADATA_KEY)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise _Corrupt(f"its {METADATA_KEY} is not a map of strings to strings")
    infos = sorted((_tensor_info(name, entry, data_len) for name, entry in header.items() if name != METADATA_KEY),
                   key=lambda i: (i.begin, i.end))
    at = 0
    for i in infos:
        if i.begin != at:
            kind = "overlaps the one before it" if i.begin < at else f"leaves a gap at byte {at} of the data"
            raise _Corrupt(f"tensor {_shown(i.name)} [{i.begin}, {i.end}) {kind}")
        at = i.end
    if at != data_len:
        raise _Corrupt(f"the tensors cover {at} of the {data_len} data bytes")
    return infos, metadata


def _tensor_info(name: str, entry, data_len: int) -> TensorInfo:
    """One tensor's header entry, checked against the data section's length."""
    what = f"tensor {_shown(name)}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise _Corrupt(f"{what}: its entry is not {{dtype, shape, data_offsets}}")
    dtype = DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise _Corrupt(f"{what}: unsupported dtype {_shown(entry['dtype'])}")
    shape, offsets = entry["shape"], entry["data_offsets"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _Corrupt(f"{what}: its shape is not a list of non-negative integers")
    if len(shape) > MAX_DIMS or _nbytes([d for d in shape if d], dtype.itemsize, limit=INT64_MAX) > INT64_MAX:
        # numpy cannot even describe such an array, not even an empty one (shape [2**62, 2**62, 0])
        raise _Corrupt(f"{what}: shape {_shown(shape)} is beyond what numpy can hold")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_len):
        raise _Corrupt(f"{what}: its data_offsets are not [begin, end] within the {data_len}-byte data section")
    begin, end = offsets
    if _nbytes(shape, dtype.itemsize, limit=end - begin) != end - begin:
        raise _Corrupt(f"{what}: shape {_shown(shape)} of {entry['dtype']} does not fill its {end - begin} bytes")
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _is_int(x) -> bool:
    return type(x) is int  # not bool (true / false), not float (1.0)


def _nbytes(shape: list[int], itemsize: int, limit: int) -> int:
    """shape's byte size, or limit + 1 as soon as it exceeds limit (a hostile shape of many huge
    dimensions is never multiplied out in full)."""
    if 0 in shape:
        return 0
    n = itemsize
    for d in shape:
        n *= d
        if n > limit:
            return limit + 1
    return n


def _read_tensor(f: BinaryIO, data_start: int, info: TensorInfo) -> np.ndarray:
    """Read one tensor's bytes straight into a new array (no intermediate bytes object)."""
    out = np.empty(info.shape, dtype=info.dtype)
    buf = out.reshape(-1).view(np.uint8)
    f.seek(data_start + info.begin)
    got = 0
    while got < buf.size:
        n = f.readinto(buf[got:])
        if not n:
            raise _Corrupt(f"it ended inside tensor {_shown(info.name)}")
        got += n
    if info.dtype.kind == "b" and buf.size and buf.max() > 1:  # numpy would hold bools that are neither
        raise _Corrupt(f"tensor {_shown(info.name)}: BOOL bytes other than 0 and 1")
    return out


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------

def _usage(path, why: str) -> UsageError:
    return UsageError(f"{_shown_path(path)} is not a valid safetensors file: {why}", hint=CORRUPT_HINT)


def _shown(value, limit: int = 60) -> str:
    """A header value for a one-line message: repr (escapes newlines), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _shown_path(path) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]
