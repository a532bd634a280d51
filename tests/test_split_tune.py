"""`catchat bench --tune` and the float32 GEMM from float16 splits (glsl/gemm_coopmat.comp's SPLIT): an fp32
program's split GEMMs ask `gemm.pick_split_tiles` (kind "split"), not glsl/gemm.comp's picker, so the
tuner times `gemm.split_candidates` at their shapes and caches the fastest, which the picker then takes.
The device is lavapipe described as having tensor cores (conftest.py's `coop_dev`), with
CATCHAT_GEMM32_SPLIT=1 so the small test shapes split; the timings are a fake `measure`, except the
last test's, which runs two split tiles for real on emulated fragments."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from test_coop_tune import _cfg, _gemms, _key, _program

from catchat.analysis import tuner
from catchat.vk import tune as tunecache
from catchat.vk.kernels import gemm

HEAD = dict(M=18, N=101, K=12, split_k=1, trans_a=False, trans_b=True)  # tiny's head: 6 x 3 rows, V = 101


@pytest.fixture
def split_all(monkeypatch):
    monkeypatch.setenv(gemm.ENV_GEMM32_SPLIT, "1")


def test_a_fp32_program_asks_for_split_tiles_where_its_gemms_split(coop_dev, cache, monkeypatch, split_all):
    """With every float32 GEMM split, the program's GEMM shapes are all "split" and none "gemm" (the
    tuner no longer tunes gemm.comp tiles the program does not run): the same keys gemm.comp's picker
    was asked for without the split."""
    shapes = tuner.tune_shapes(_cfg("fp32"), coop_dev)
    split = {key for kind, key in shapes if kind == "split"}
    assert {kind for kind, _ in shapes} == {"split", "gru"}
    kernels = _gemms(_program(coop_dev, _cfg("fp32")))
    assert all(k.split and isinstance(k.tiles, gemm.CoopTiles) for k in kernels.values())
    assert {_key(k) for k in kernels.values()} <= split
    assert shapes[("split", tunecache.gemm_key(18, 101, 12, 1, False, True))] == HEAD
    monkeypatch.setenv(gemm.ENV_GEMM32_SPLIT, "0")
    plain = tuner.tune_shapes(_cfg("fp32"), coop_dev)
    assert {kind for kind, _ in plain} == {"gemm", "gru"} and {k for c, k in plain if c == "gemm"} == split


def test_the_fastest_split_tile_is_cached_and_then_picked(coop_dev, cache, split_all):
    head = tunecache.gemm_key(18, 101, 12, 1, False, True)
    default = gemm.split_tiles(coop_dev, 18, 101, 1, (False, True))
    grid = gemm.split_candidates(coop_dev, (False, True))
    fast = next(t for t in grid if t != default)
    seen = []

    def measure(kind, shape, tiles):
        seen.append(kind)
        return (1.0 if tiles == fast else 2.0) if kind == "split" else 1.0

    rows, path = tuner.tune(_cfg("fp32"), coop_dev, measure=measure)
    row = next(r for r in rows if r.kind == "split" and r.key == head)
    assert row.table == default and row.candidates[0] == default and set(row.candidates) == set(grid)
    assert row.winner == fast and row.micros(fast) == 1e6 and row.micros(default) == 2e6
    assert row.fields(fast) == list(dataclasses.astuple(fast))
    data = json.loads(path.read_text())
    assert data["split"][head] == list(dataclasses.astuple(fast)) and data["coop"] == {} and data["gemm"] == {}
    assert data["measured"][f"split/{head}"][0] == [list(dataclasses.astuple(default)), 2e6]
    assert set(seen) == {"split", "gru"}
    # read back: the picker with K, and every split GEMM of a program built afterwards
    assert gemm.pick_split_tiles(coop_dev, 18, 101, 1, (False, True), K=12) == fast
    assert gemm.pick_split_tiles(coop_dev, 18, 101, 1, (False, True)) == default  # no K: not asked
    for name, k in _gemms(_program(coop_dev, _cfg("fp32"))).items():
        assert k.tiles == gemm.CoopTiles(*data["split"][_key(k)]), name
    # the float16 GEMM's cache kind is another: a "coop" entry for the same key is not a split tile
    tunecache.store(coop_dev.info, {"split": {head: list(dataclasses.astuple(default))}})
    tunecache.store(coop_dev.info, {"coop": {head: list(dataclasses.astuple(fast))}})
    assert gemm.pick_split_tiles(coop_dev, 18, 101, 1, (False, True), K=12) == default


def test_a_cached_split_tile_that_is_not_a_candidate_is_ignored_with_a_note(coop_dev, cache, capsys, split_all):
    key = tunecache.gemm_key(18, 101, 12, 1, False, True)
    default = gemm.split_tiles(coop_dev, 18, 101, 1, (False, True))
    not_in_grid = gemm.COOP_TILE  # the float16 GEMM's 16 fragments a subgroup: not a split tile
    for bad in (list(dataclasses.astuple(not_in_grid)), [1, 2], "junk"):
        tunecache.store(coop_dev.info, {"split": {key: bad}})
        tunecache._said.clear()
        assert gemm.pick_split_tiles(coop_dev, 18, 101, 1, (False, True), K=12) == default
        assert "ignoring the tuned split GEMM tiles" in capsys.readouterr().err, bad


def test_the_measurer_times_split_tiles_on_float32_operands(dev, monkeypatch, split_all):
    """The tuner's timer builds a "split" candidate as the split GEMM (precision fp32, split=True, the tile
    given) and checks it against the first candidate; two of lavapipe's split tiles, run for real on
    emulated fragments, both match it."""
    m = tuner.Measurer(dev, reps=1, gemm_repeat=1, precision="fp32")
    table = gemm.split_tiles(dev, HEAD["M"], HEAD["N"], 1, (False, True))
    other = next(t for t in gemm.split_candidates(dev, (False, True)) if t != table)
    assert m("split", HEAD, table) > 0 and m("split", HEAD, other) > 0
    built = []
    real = gemm.Gemm

    def spy(*args, **kw):
        built.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(gemm, "Gemm", spy)
    assert np.isfinite(m("split", HEAD, other))
    assert [(k["precision"], k["split"], k["tiles"]) for k in built] == [("fp32", True, other)]
