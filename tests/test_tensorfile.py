"""catchat.run.tensorfile: canonical safetensors bytes, interoperability with the `safetensors`
package both ways, and a reader that refuses every corrupt file with one clear UsageError."""

import hashlib
import json
import struct
import time
import tracemalloc

import numpy as np
import pytest
import safetensors.numpy as st_np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catchat.errors import UsageError
from catchat.run import tensorfile as tf

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True, database=None)  # the same examples every run; a few seconds each
FUZZ_SECONDS = 20


def sample_tensors() -> dict[str, np.ndarray]:
    """Every supported dtype, odd shapes (0-d, empty, non-contiguous, big-endian input)."""
    rng = np.random.default_rng(7)
    return {
        "embedding.weight": rng.standard_normal((5, 3)).astype(np.float32),
        "f64": rng.standard_normal(4),
        "f16": rng.standard_normal((2, 2)).astype(np.float16),
        "i32": np.arange(-3, 3, dtype=np.int32),
        "i64": np.array(2**40 + 1, dtype=np.int64),  # 0-d
        "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
        "u8": np.arange(12, dtype=np.uint8)[::3],  # non-contiguous
        "bool": np.array([[True, False, True]]),
        "empty": np.zeros((0, 4), np.float32),
        "big_endian": np.arange(6, dtype=">f4").reshape(3, 2),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
    }


def assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.shape == y.shape and x.dtype.kind == y.dtype.kind and x.dtype.itemsize == y.dtype.itemsize, k
        assert np.array_equal(x, y), k


def refused(path, **kw) -> UsageError:
    with pytest.raises(UsageError) as info:
        tf.read(path, **kw)
    e = info.value
    assert e.exit_code == 2 and str(path) in e.message and "\n" not in e.message
    assert e.hint == tf.CORRUPT_HINT
    return e


def header_of(blob: bytes) -> dict:
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n])


def with_header(header: dict | str | bytes, data: bytes = b"", pad: bool = True) -> bytes:
    """A file from a header (dict, JSON text or raw bytes) and a data section, unchecked."""
    raw = header if isinstance(header, bytes) else (header if isinstance(header, str) else json.dumps(header)).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


# ------------------------------------------------------------------------------ (a) round trip

def test_round_trip_file(tmp_path):
    x, meta = sample_tensors(), {"format": "catchat-checkpoint", "global_step": "12", "ünï": "cödé"}
    path = tmp_path / "x.safetensors"
    digest = tf.write(path, x, meta)
    assert path.read_bytes() == tf.dumps(x, meta)  # write streams the same bytes dumps builds
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()  # hashed on the way, as written
    got, got_meta = tf.read(path)
    assert_same(x, got)
    assert got_meta == meta
    for a in got.values():  # fresh arrays the caller owns
        assert a.flags.writeable and a.flags.c_contiguous and a.dtype.isnative
    assert tf.read_metadata(path) == meta


def test_layout_is_the_documented_one():
    blob = tf.dumps({"b": np.ones(2, np.float32), "a": np.array([1], np.uint8)}, {"k": "v"})
    (n,) = struct.unpack("<Q", blob[:8])
    raw = blob[8:8 + n]
    assert n % 8 == 0 and raw == raw.rstrip() + b" " * (len(raw) - len(raw.rstrip()))
    assert raw.rstrip() == (b'{"__metadata__":{"k":"v"},"a":{"data_offsets":[0,1],"dtype":"U8","shape":[1]},'
                            b'"b":{"data_offsets":[1,9],"dtype":"F32","shape":[2]}}')
    assert blob[8 + n:] == b"\x01" + np.ones(2, "<f4").tobytes()  # sorted-name order, little-endian


def test_no_metadata_and_no_tensors(tmp_path):
    assert tf.dumps({}) == struct.pack("<Q", 8) + b"{}      " == tf.dumps({}, {})
    path = tmp_path / "e.safetensors"
    tf.write(path, {})
    assert tf.read(path) == ({}, {})


@pytest.mark.parametrize("tensors,metadata", [
    ({"x": np.zeros(2, np.complex64)}, None),
    ({"x": np.array(["a"])}, None),
    ({"x": np.array([object()])}, None),
    ({"x": np.zeros(2, np.longdouble)} if np.dtype(np.longdouble).itemsize > 8 else {"x": np.zeros(1, "M8[s]")}, None),
    ({1: np.zeros(2)}, None),
    ({"__metadata__": np.zeros(2)}, None),
    ({"x": np.zeros(2)}, {"k": 1}),
    ({"x": np.zeros(2)}, {2: "v"}),
])
def test_dumps_refuses_what_the_format_cannot_hold(tensors, metadata):
    with pytest.raises(ValueError):
        tf.dumps(tensors, metadata)


# ----------------------------------------------------------------- (b) interoperable both ways

def test_safetensors_loads_our_bytes():
    x = sample_tensors()
    assert_same(x, st_np.load(tf.dumps(x, {"a": "b"})))


def test_we_read_safetensors_files(tmp_path):
    # safetensors writes a non-contiguous array's underlying buffer: hand it contiguous ones
    x = {k: np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<")) for k, v in sample_tensors().items()}
    path = tmp_path / "theirs.safetensors"
    st_np.save_file(x, str(path), metadata={"b": "2", "a": "1"})
    got, meta = tf.read(path)
    assert_same(x, got)
    assert meta == {"a": "1", "b": "2"} and tf.read_metadata(path) == meta
    ours = tf.dumps(got, meta)  # what they wrote, re-written canonically, loads back the same
    assert_same(x, st_np.load(ours))
    assert tf.dumps(st_np.load(path.read_bytes()), meta) == ours


# ------------------------------------------------------------------------ (c) byte-identical

def test_equal_state_gives_identical_bytes(tmp_path):
    x = sample_tensors()
    shuffled = {k: np.array(x[k], copy=True) for k in reversed(list(x))}
    meta1 = {"format": "catchat", "global_step": "5", "model": '{"hidden": 64}'}
    meta2 = dict(reversed(list(meta1.items())))
    assert tf.dumps(x, meta1) == tf.dumps(shuffled, meta2)
    tf.write(tmp_path / "1", x, meta1)
    tf.write(tmp_path / "2", shuffled, meta2)
    digest = [hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in "12"]
    assert digest[0] == digest[1]


def test_byte_order_and_memory_order_do_not_change_the_bytes():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert tf.dumps({"a": a}) == tf.dumps({"a": a.astype(">f4")}) == tf.dumps({"a": np.asfortranarray(a)})


# ------------------------------------------------------------------ every corruption, named

GOOD = tf.dumps({"a": np.arange(3, dtype=np.float32), "b": np.array([1, 2], np.int64)}, {"m": "v"})
GOOD_HEADER = header_of(GOOD)
GOOD_DATA = GOOD[8 + struct.unpack("<Q", GOOD[:8])[0]:]


def edited(**changes) -> bytes:
    """GOOD with some header entries replaced (None removes one)."""
    h = json.loads(json.dumps(GOOD_HEADER))
    for key, value in changes.items():
        key = {"meta": "__metadata__"}.get(key, key)
        if value is None:
            h.pop(key)
        else:
            h[key] = value
    return with_header(h, GOOD_DATA)


def entry(dtype="F32", shape=(3,), offsets=(0, 12)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


CORRUPT = {
    "empty file": (b"", "shorter than the 8-byte"),
    "seven bytes": (b"\x08" + b"\x00" * 6, "shorter than the 8-byte"),
    "length past the end": (struct.pack("<Q", 100) + b"{}", "runs past the end"),
    "length over the cap": (struct.pack("<Q", 2**60) + b"{}      ", "exceeds the"),
    "not UTF-8": (with_header(b"{\"\xff\": 1}"), "not UTF-8"),
    "not JSON": (with_header(b"{nope}"), "not valid JSON"),
    "not an object": (with_header(b"[1, 2]  "), "does not start with"),
    "trailing garbage": (with_header(b'{} {}'), "not valid JSON"),
    "deep nesting": (with_header('{"a":' + "[" * 200_000 + "]" * 200_000 + "}"), "not valid JSON"),
    "huge integer": (with_header('{"a":{"dtype":"F32","shape":[' + "9" * 5000 + '],"data_offsets":[0,0]}}'),
                     "not valid JSON"),
    "duplicate key": (with_header('{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
                                  '"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}'), "repeats a key"),
    "metadata not a map": (edited(meta=["x"]), "__metadata__ is not a map"),
    "metadata value not str": (edited(meta={"m": 1}), "__metadata__ is not a map"),
    "entry not an object": (edited(a=[1]), "entry is not"),
    "entry with an extra key": (edited(a={**entry(), "x": 1}), "entry is not"),
    "entry missing shape": (edited(a={"dtype": "F32", "data_offsets": [0, 12]}), "entry is not"),
    "unknown dtype": (edited(a=entry(dtype="F8")), "unsupported dtype"),
    "dtype not a string": (edited(a=entry(dtype=["F32"])), "unsupported dtype"),
    "negative dimension": (edited(a=entry(shape=(-3,))), "shape is not"),
    "float dimension": (edited(a=entry(shape=(3.0,))), "shape is not"),
    "boolean dimension": (edited(a=entry(shape=(True, 3))), "shape is not"),
    "shape not a list": (edited(a={**entry(), "shape": 3}), "shape is not"),
    "three offsets": (edited(a=entry(offsets=(0, 6, 12))), "data_offsets are not"),
    "offsets reversed": (edited(a=entry(offsets=(12, 0))), "data_offsets are not"),
    "offset past the data": (edited(a=entry(offsets=(0, 10**6))), "data_offsets are not"),
    "negative offset": (edited(a=entry(offsets=(-4, 8))), "data_offsets are not"),
    "size mismatch": (edited(a=entry(shape=(2,))), "does not fill"),
    "huge shape": (edited(a=entry(shape=(2**20, 2**20, 2**20))), "does not fill"),
    "huge empty shape": (edited(a=entry(shape=(2**62, 2**62, 0), offsets=(0, 0)), b=entry("I64", (2,), (0, 28))),
                         "beyond what numpy can hold"),
    "33 dimensions": (edited(a=entry(shape=(1,) * 30 + (3, 1, 1))), "beyond what numpy can hold"),
    "32 dimensions pass that check": (edited(a=entry(shape=(1,) * 30 + (3, 2))), "does not fill"),
    "overlap": (edited(b=entry(dtype="I64", shape=(2,), offsets=(4, 20))), "overlaps the one before it"),
    "overlap inside": (edited(a=entry(dtype="F32", shape=(4,), offsets=(0, 16))), "overlaps"),
    "gap": (with_header({"a": entry(shape=(1,), offsets=(4, 8))}, b"\x00" * 8), "leaves a gap"),
    "bytes after the last tensor": (GOOD + b"\x00" * 8, "cover 28 of the 36"),
    "truncated data": (GOOD[:-1], "data_offsets are not"),
    "bool byte 2": (with_header({"a": entry(dtype="BOOL", shape=(2,), offsets=(0, 2))}, b"\x01\x02"), "BOOL"),
    "metadata as a tensor name only": (with_header({"__metadata__": {"x": "y"}}, b"\x00"), "cover 0 of the 1"),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupt_file_is_refused_with_the_reason(tmp_path, name):
    blob, reason = CORRUPT[name]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    assert reason in refused(path).message


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="cannot open it") as info:
        tf.read(tmp_path / "nope.safetensors")
    assert info.value.exit_code == 2 and info.value.hint


def test_read_metadata_reads_only_the_header(tmp_path):
    path = tmp_path / "b.safetensors"  # valid header, invalid data: only `read` looks at the data
    path.write_bytes(with_header({"__metadata__": {"k": "v"}, "a": entry(dtype="BOOL", shape=(1,), offsets=(0, 1))},
                                 b"\x07"))
    assert tf.read_metadata(path) == {"k": "v"}
    assert "BOOL" in refused(path).message
    path.write_bytes(CORRUPT["gap"][0])  # but its header is validated in full
    with pytest.raises(UsageError, match="leaves a gap"):
        tf.read_metadata(path)


# -------------------------------------------------------------------- (e) huge length prefix

def test_huge_header_length_is_refused_without_allocating(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", 2**60) + b"{}" + b" " * 6)
    for cap in (tf.MAX_HEADER_BYTES, 2**62):  # over the cap, or (cap lifted) past the file's end
        tracemalloc.start()
        try:
            message = refused(path, max_header_bytes=cap).message
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2**20, peak
        assert str(2**60) in message


def test_header_cap_is_enforced(tmp_path):
    path = tmp_path / "x.safetensors"
    tf.write(path, {"a": np.zeros(3, np.float32)})
    assert "exceeds the 16-byte cap" in refused(path, max_header_bytes=16).message


# --------------------------------------------------------------------------------- (d) fuzz

@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "f.safetensors"


def read_or_refuse(path, blob: bytes):
    path.write_bytes(blob)
    try:
        tensors, metadata = tf.read(path)
    except UsageError as e:
        assert e.exit_code == 2 and "\n" not in e.message and e.hint == tf.CORRUPT_HINT
        return None
    assert isinstance(metadata, dict) and all(isinstance(v, np.ndarray) for v in tensors.values())
    assert tf.read_metadata(path) == metadata
    return tensors, metadata


@pytest.fixture(scope="module")
def timers():
    """name -> when that fuzz test's first example ran (each test must stay under FUZZ_SECONDS)."""
    return {}


def timed(timers, name):
    assert time.monotonic() - timers.setdefault(name, time.monotonic()) < FUZZ_SECONDS


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes(fuzz_path, timers, blob):
    timed(timers, "bytes")
    read_or_refuse(fuzz_path, blob)


@FUZZ
@given(st.binary(max_size=120))
def test_fuzz_arbitrary_header_bytes(fuzz_path, timers, header):
    """A plausible length prefix, then anything: exercises the JSON and field checks."""
    timed(timers, "header")
    read_or_refuse(fuzz_path, struct.pack("<Q", len(header)) + header + GOOD_DATA)


MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(GOOD) - 1), st.integers(1, 255)),
    st.tuples(st.just("set"), st.integers(0, len(GOOD) - 1), st.integers(0, 255)),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1), st.just(0)),
    st.tuples(st.just("length_delta"), st.integers(-16, 16), st.just(0)),
    st.tuples(st.just("truncate"), st.integers(0, len(GOOD)), st.just(0)),
    st.tuples(st.just("append"), st.integers(1, 16), st.integers(0, 255)),
)


def mutate(blob: bytes, op: str, a: int, b: int) -> bytes:
    data = bytearray(blob)
    if op in ("flip", "set", "length", "length_delta") and len(data) < 8:
        return blob  # an earlier truncation left nothing of that to change
    if op == "flip":
        data[a % len(data)] ^= b
    elif op == "set":
        data[a % len(data)] = b
    elif op == "length":
        data[:8] = struct.pack("<Q", a)
    elif op == "length_delta":
        data[:8] = struct.pack("<Q", min(2**64 - 1, max(0, struct.unpack("<Q", blob[:8])[0] + a)))  # stays a u64
    elif op == "truncate":
        del data[a:]
    else:
        data += bytes([b]) * a
    return bytes(data)


@FUZZ
@given(st.lists(MUTATION, min_size=1, max_size=4))
def test_fuzz_mutated_valid_file(fuzz_path, timers, mutations):
    timed(timers, "mutated")
    blob = GOOD
    for m in mutations:
        blob = mutate(blob, *m)
    result = read_or_refuse(fuzz_path, blob)
    if result is not None:  # a mutation that kept the file valid: it re-writes and loads the same
        assert_same(result[0], st_np.load(tf.dumps(*result)))


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                      st.sampled_from(["F32", "I64", "U8", "BOOL", "F16", "x", ""]))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.sampled_from(["dtype", "shape", "data_offsets", "k", ""]), inner,
                                            max_size=4),
                          max_leaves=12)
ENTRY = st.fixed_dictionaries({"dtype": st.sampled_from(["F32", "I64", "U8", "BOOL", "F16", "Q"]),
                               "shape": st.lists(st.integers(-1, 5) | st.integers(2**30, 2**66), max_size=3)
                               | st.lists(st.sampled_from([0, 1]), min_size=30, max_size=34),
                               "data_offsets": st.lists(st.integers(-1, 40), min_size=2, max_size=2)})
HEADER = st.dictionaries(st.sampled_from(["a", "b", "c", "__metadata__"]), ENTRY | JSON_VALUE, max_size=4)


@FUZZ
@given(HEADER, st.binary(max_size=40))
def test_fuzz_structured_headers(fuzz_path, timers, header, data):
    """Headers shaped like real ones (near-valid entries, odd values): valid ones must load."""
    timed(timers, "structured")
    result = read_or_refuse(fuzz_path, with_header(json.dumps(header), data))
    if result is not None:  # what was accepted re-writes to a file that loads back the same
        assert_same(result[0], st_np.load(tf.dumps(*result)))
