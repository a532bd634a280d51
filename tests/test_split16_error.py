"""tools/split16_error.py: float32 products from float16 splits against float32 (docs/benchmarks.md
"v5 at fp32"). Its claims at a small shape: the rounding helper truncates, and the orderings the docs
state hold (two accumulators at round-to-nearest as close as float32; truncating sums worse; one
accumulator worse than two; every split far closer than one float16 product)."""

import json

import numpy as np

from support import load_tool


def tool():
    return load_tool("split16_error")


def test_toward_zero_truncates_both_signs():
    mod = tool()
    x = np.array([1.0 + 2.0 ** -30, -(1.0 + 2.0 ** -30), 1.0 - 2.0 ** -30, 3.0])
    f = mod.toward_zero(x)
    assert f.dtype == np.float32
    assert list(f) == [np.float32(1.0), np.float32(-1.0), np.nextafter(np.float32(1.0), np.float32(0)), np.float32(3.0)]
    assert np.all(np.abs(f.astype(np.float64)) <= np.abs(x))


def test_error_orderings_at_a_small_shape(tmp_path):
    mod = tool()
    out = tmp_path / "r.json"
    assert mod.main(["--rows", "24", "--hidden", "512", "--lanes", "8", "--k-group", "64", "--json", str(out)]) == 0
    rows = {(r["way"], r["sums"]): r["max_error"] for r in json.loads(out.read_text())["rows"]}
    fp32, fp16 = rows[("fp32", "rn")], rows[("fp16", "rn")]
    assert 0 < fp32 < 1e-6 and fp16 > 1e-4
    assert rows[("split2", "rn")] < 2 * fp32                # as close as float32
    assert rows[("split2", "rz")] > rows[("split2", "rn")]  # truncation costs
    assert rows[("split1", "rz")] > rows[("split2", "rz")]  # one accumulator costs more
    assert all(e < fp16 / 10 for (way, _), e in rows.items() if way.startswith("split"))


def test_recurrence_drift_orderings():
    """--recurrence: a GRU layer's state, its product's error fed back step after step, stays as close
    to float64 with two accumulators at round-to-nearest as float32 does, and far closer than fp16."""
    rows = {(r["way"], r["sums"]): r["max_error"] for r in tool().recurrence(96, 4, 48, 32)}
    fp32, fp16 = rows[("fp32", "rn")], rows[("fp16", "rn")]
    assert 0 < fp32 < 1e-6 and fp16 > 1e-5
    assert rows[("split2", "rn")] < 2 * fp32 and rows[("split2", "rz")] < fp16 / 10
