"""`catchat bench --tune` and the tensor-core GEMM (glsl/gemm_coopmat.comp): an fp16 program on a GPU with
cooperative matrices asks `gemm.pick_coop_tiles` for every GEMM (the head and the layer-0 table's
included), the tuner times `gemm.coop_candidates` at those shapes and caches the fastest (kind "coop"),
and the picker takes it from then on. lavapipe has no tensor cores: the device here is lavapipe
described as having them (subgroups of 32, VK_NV_cooperative_matrix's 16x16x16 fragments), the program
is built without recording its sequences (nothing of it runs) and the timings are a fake `measure`."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from catchat import config as cfgmod
from catchat.analysis import bench_command, tuner
from catchat.model import ParamLayout
from catchat.vk import tune as tunecache
from catchat.vk.kernels import gemm, gru
from catchat.vk.program import Program

ROOT = Path(__file__).resolve().parents[1]


def _cfg(precision: str = "fp16"):
    return cfgmod.load(ROOT / "configs" / "tiny.toml",
                       ["model.hidden=12", "data.window=6", "data.batch_lanes=3", f"train.precision={precision}"])


def _program(dev, cfg):
    return Program(dev, ParamLayout(cfgmod.model_spec(cfg)), cfg.data.window, cfg.data.batch_lanes,
                   precision=cfg.train.precision)


def _gemms(prog) -> dict:
    """Every GEMM kernel of the program by name."""
    f, b = prog.fwd, prog.bwd
    out = {"head": f.rows.head, "table0": f.table0, "head dx": b.head_dx, "head dw": b.head_dw,
           "table0 dw": b.table0.dw_ih, "table0 demb": b.table0.demb}
    for i, k in enumerate(f.rows.proj[1:], 1):
        out[f"proj {i}"] = k
    for i, layer in enumerate(b.layers):
        for name in ("dw_ih", "dw_hh", "dx"):
            if getattr(layer, name, None) is not None:
                out[f"{name} {i}"] = getattr(layer, name)
    return out


def _key(k) -> str:
    return tunecache.gemm_key(k.M, k.N, k.K, k.split_k, k.trans_a, bool(k.defines.get("TRANS_B")))


def test_an_fp16_program_asks_for_every_gemms_tensor_core_tiles(coop_dev, cache):
    """Every GEMM of the fp16 program, the head and the layer-0 table's among them, and the per-timestep
    rows, is a "coop" shape; at fp32 the same program's are "gemm" shapes (glsl/gemm.comp)."""
    cfg = _cfg()
    shapes = tuner.tune_shapes(cfg, coop_dev)
    coop = {key for kind, key in shapes if kind == "coop"}
    assert {kind for kind, _ in shapes} == {"coop", "gru"}
    prog = _program(coop_dev, cfg)
    kernels = _gemms(prog)
    assert all(k.coopmat and isinstance(k.tiles, gemm.CoopTiles) for k in kernels.values())
    assert {_key(k) for k in kernels.values()} <= coop
    V, H, B = prog.geometry.V, cfg.model.hidden, cfg.data.batch_lanes
    R = cfg.data.window * B
    for key in (tunecache.gemm_key(R, V, H, 1, False, True),  # the head
                tunecache.gemm_key(V, 3 * H, H, 1, False, True),  # the layer-0 table
                tunecache.gemm_key(V, H, 3 * H, 1, False, False),  # its input gradient
                tunecache.gemm_key(3 * H, H, V, 1, True, False),  # its weight gradient
                tunecache.gemm_key(B, V, H, 1, False, True)):  # the per-timestep head
        assert key in coop, key
    assert shapes[("coop", tunecache.gemm_key(R, V, H, 1, False, True))] == dict(
        M=R, N=V, K=H, split_k=1, trans_a=False, trans_b=True)
    fp32 = tuner.tune_shapes(_cfg("fp32"), coop_dev)
    assert {kind for kind, _ in fp32} == {"gemm", "gru"} and {k for _, k in fp32 if _ == "gemm"} == coop


def test_the_fastest_coop_tile_is_cached_and_then_picked(coop_dev, cache):
    cfg = _cfg()
    head = tunecache.gemm_key(18, 101, 12, 1, False, True)
    default = gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True), K=12)
    grid = gemm.coop_candidates(coop_dev, (False, True))
    fast = next(t for t in grid if t not in (default, gemm.COOP_TILE, gemm.COOP_NARROW_TILE, gemm.COOP_SMALL_TILE))
    seen = []

    def measure(kind, shape, tiles):
        seen.append(kind)
        if kind == "coop":
            return 1.0 if tiles == fast else 2.0
        return 1.0  # the sweeps: every candidate alike, the tables' choice kept

    rows, path = tuner.tune(cfg, coop_dev, measure=measure)
    coop_rows = [r for r in rows if r.kind == "coop"]
    head_row = next(r for r in coop_rows if r.key == head)
    assert head_row.table == default and head_row.candidates[0] == default and len(head_row.candidates) > 20
    assert head_row.winner == fast and head_row.micros(fast) == 1e6 and head_row.micros(default) == 2e6
    data = json.loads(path.read_text())
    assert data["version"] == tunecache.VERSION and data["coop"][head] == list(dataclasses.astuple(fast))
    assert data["measured"][f"coop/{head}"][0] == [list(dataclasses.astuple(default)), 2e6]
    assert set(seen) == {"coop", "gru"} and all(data["gru"].values())
    # read back: the picker, and every GEMM of a program built afterwards whose shape fast runs at
    assert gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True), K=12) == fast
    assert gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True)) == default  # no K: not asked
    prog = _program(coop_dev, cfg)
    for name, k in _gemms(prog).items():
        assert k.tiles == gemm.CoopTiles(*data["coop"][_key(k)]), name
    assert prog.fwd.rows.head.tiles == fast and prog.fwd.table0.tiles == fast
    # not on the workgroup-scope path
    assert gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True), coopmat2=True, K=12) is None


def test_a_cached_tile_that_is_not_a_candidate_is_ignored_with_a_note(coop_dev, cache, capsys, monkeypatch):
    key = tunecache.gemm_key(18, 101, 12, 1, False, True)
    default = gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True), K=12)
    small = gemm.COOP_SMALL_TILE
    assert default != small
    tunecache.store(coop_dev.info, {"coop": {key: list(dataclasses.astuple(small))}})
    assert gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True), K=12) == small
    monkeypatch.setenv(tunecache.ENV_TUNE, "0")  # the cache ignored altogether
    assert gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True), K=12) == default
    monkeypatch.delenv(tunecache.ENV_TUNE)
    too_big = gemm.CoopTiles(2, 4, 4, 4, 32, 2)  # 54 KiB of shared memory: not in the grid
    for bad in (list(dataclasses.astuple(too_big)), list(dataclasses.astuple(dataclasses.replace(small, api="khr"))),
                [1, 2], "junk", 7):
        tunecache.store(coop_dev.info, {"coop": {key: bad}})
        tunecache._said.clear()
        assert gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True), K=12) == default
        assert "ignoring the tuned cooperative-matrix tiles" in capsys.readouterr().err, bad


def test_a_cache_written_before_coop_existed_still_loads(coop_dev, cache):
    """A version-1 file with only "gemm" and "gru" is read as it is; storing "coop" keeps its choices."""
    info = coop_dev.info
    gkey = tunecache.gemm_key(300, 200, 64, 1, False, True)
    path = tunecache.cache_path(info)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "device": info.name, "driver": info.driver,
                                "limits": tunecache.limits(info), "gemm": {gkey: [64, 64, 8, 4, 4]},
                                "gru": {}, "measured": {}}))
    assert tunecache.lookup(info, "gemm", gkey) == [64, 64, 8, 4, 4]
    assert tunecache.lookup(info, "coop", gkey) is None
    key = tunecache.gemm_key(18, 101, 12, 1, False, True)
    tunecache.store(info, {"coop": {key: list(dataclasses.astuple(gemm.COOP_SMALL_TILE))}})
    data = json.loads(path.read_text())
    assert data["gemm"] == {gkey: [64, 64, 8, 4, 4]} and data["coop"] == {key: [2, 2, 2, 2, 16, 2, "nv"]}


def test_bench_tune_prints_the_coop_rows(coop_dev, cache, monkeypatch):
    """`catchat bench --tune`'s table and JSON carry the "coop" rows, CoopTiles as their fields."""
    fast = gemm.coop_candidates(coop_dev, (False, True))[-1]
    measure = lambda kind, shape, tiles: 1.0 if tiles == fast else 2.0  # noqa: E731
    monkeypatch.setattr(bench_command, "tune", lambda cfg, dev, progress: tuner.tune(cfg, dev, measure, progress))
    out = io.StringIO()
    console = Console(file=out, width=250)
    res = bench_command._run_tune(_cfg(), coop_dev, tuner.NoProgress(), console, console.print)
    text = out.getvalue()
    assert "coop" in text and str(tuple(dataclasses.astuple(fast))) in text
    fields = list(dataclasses.astuple(fast))
    rows = [r for r in res["rows"] if r["kind"] == "coop" and fields in r["candidates"]]
    assert rows and all(r["winner"] == fields for r in rows)
    json.dumps(res)  # what --json writes


def test_fp16_on_a_device_without_tensor_cores_tunes_glsl_gemm(dev, cache):
    """lavapipe itself: an fp16 program's GEMMs run gemm.comp (rounded loads), so the tuner measures
    "gemm" and "gru" shapes as at fp32, and nothing of kind "coop"."""
    shapes = tuner.tune_shapes(_cfg(), dev)
    assert {kind for kind, _ in shapes} == {"gemm", "gru"}
    assert set(shapes) == set(tuner.tune_shapes(_cfg("fp32"), dev))
    sweeps = {key for kind, key in shapes if kind == "gru"}
    assert sweeps == {"fwd/B3/H12/wg0", "bwd/B3/H12/wg0"}
    assert gru.default_tiles(dev, 3, 12, False, 0) == gru.table_tiles(dev, 3, 12, False, 0)


def test_catchat_bench_tune_with_precision_fp16(cli, cache, monkeypatch):
    """`catchat bench CONFIG --tune --precision fp16` tunes the fp16 program (on lavapipe: glsl/gemm.comp's
    tiles and the sweeps') and then benches it."""
    from test_bench import SMALL

    # whatever the two steps' times on a loaded machine, the tuned tiles stay (the check has its own test)
    monkeypatch.setattr(bench_command, "STEP_MARGIN", float("inf"))

    code, text, err = cli("bench", *SMALL, "--tune", "--precision", "fp16")
    assert code == 0, err
    assert "precision=fp16" in text and "tuned on" in text and "cached" in text
    data = json.loads(next(cache.glob("*.json")).read_text())
    assert data["gemm"] and data["gru"] and data["coop"] == {}


def test_the_measurer_builds_the_tensor_core_gemm_for_coop_and_the_programs_loads_for_gemm(dev, monkeypatch):
    """The tuner's own timer: a "coop" candidate is the subgroup-fragment GEMM on float16 operands, a
    "gemm" one glsl/gemm.comp at the program's precision; a candidate that cannot be built is None."""
    built = []

    def fake_gemm(*args, **kw):
        built.append(kw)
        raise ValueError("not here")

    monkeypatch.setattr(gemm, "Gemm", fake_gemm)
    shape = dict(M=18, N=101, K=12, split_k=1, trans_a=False, trans_b=True)
    m = tuner.Measurer(dev, precision="fp16")
    assert m("coop", shape, gemm.COOP_SMALL_TILE) is None and m("gemm", shape, gemm.CPU_TILE) is None
    assert [(k["precision"], k["coopmat"], k.get("coopmat2"), k["tiles"]) for k in built] == [
        ("fp16", True, False, gemm.COOP_SMALL_TILE), ("fp16", False, None, gemm.CPU_TILE)]


def test_the_first_candidate_is_timed_again_after_the_others(coop_dev, cache):
    """The tables' choice runs first, on a GPU whose clocks are still ramping after the host's set-up of
    the shape (measured on the H200: up to 4.7x slower than the same tile later); it keeps the faster
    of its two times, so a ramp does not hand its place to a slower tile."""
    cfg = _cfg()
    head = tunecache.gemm_key(18, 101, 12, 1, False, True)
    default = gemm.pick_coop_tiles(coop_dev, 18, 101, 1, (False, True), K=12)
    calls = {}

    def measure(kind, shape, tiles):
        n = calls[(kind, str(shape), tiles)] = calls.get((kind, str(shape), tiles), 0) + 1
        if kind != "coop":
            return 1.0
        if tiles == default:
            return 5.0 if n == 1 else 1.0  # slow only while the clocks ramp
        return 1.5

    rows, path = tuner.tune(cfg, coop_dev, measure=measure)
    row = next(r for r in rows if r.kind == "coop" and r.key == head)
    assert row.winner == default and row.micros(default) == 1e6
    assert json.loads(path.read_text())["coop"][head] == list(dataclasses.astuple(default))


@pytest.mark.parametrize("tuned_ms, kept", [(63.2, False), (46.0, True)])
def test_tuned_tiles_stay_only_if_the_whole_step_is_not_slower(cli, cache, monkeypatch, tuned_ms, kept):
    """Each tuned tile was the fastest alone; `--tune` then times the training step with the tables'
    choices and with the tuned ones, and puts the cache back as it was when the tuned step is slower
    (v3 fp16 on the H200: 47.4 ms with the tables', 63.2 with the first tuned set)."""
    import os

    from test_bench import SMALL

    real = bench_command.bench_catchat

    def bench(cfg, dev, *args, **kw):  # the real bench, with the step's time the test chooses
        c = real(cfg, dev, *args, **kw)
        c["step_ms"] = 47.4 if os.environ.get(tunecache.ENV_TUNE) == "0" else tuned_ms
        return c

    monkeypatch.setattr(bench_command, "bench_catchat", bench)
    measure = lambda kind, shape, tiles: 1.0  # noqa: E731  (a real tuning is test_catchat_bench_tune_with_...'s)
    monkeypatch.setattr(bench_command, "tune", lambda cfg, dev, progress: tuner.tune(cfg, dev, measure, progress))
    code, text, err = cli("bench", *SMALL, "--tune", "--json", cache.parent / "bench.json")
    assert code == 0, err
    files = list(cache.glob("*.json"))
    report = json.loads((cache.parent / "bench.json").read_text())
    assert report["tune"]["step_ms_tables"] == 47.4 and report["tune"]["step_ms_tuned"] == tuned_ms
    assert report["tune"]["kept"] is kept
    if kept:
        assert "kept" in text and len(files) == 1 and json.loads(files[0].read_text())["gru"]
        assert report["catchat"]["step_ms"] == tuned_ms
    else:
        assert "not kept" in text and files == []  # there was no cache before: none after
        assert report["catchat"]["step_ms"] == 47.4


def test_a_cache_that_was_there_before_comes_back_byte_for_byte(coop_dev, cache):
    info = coop_dev.info
    tunecache.store(info, {"coop": {"1x2x3/s1/NN": list(dataclasses.astuple(gemm.COOP_SMALL_TILE))}})
    saved = tunecache.snapshot(info)
    tunecache.store(info, {"coop": {"1x2x3/s1/NN": list(dataclasses.astuple(gemm.COOP_TILE))}})
    tunecache.restore(info, saved)
    assert tunecache.cache_path(info).read_bytes() == saved
    assert tunecache.lookup(info, "coop", "1x2x3/s1/NN") == list(dataclasses.astuple(gemm.COOP_SMALL_TILE))
    with tunecache.disabled():
        assert tunecache.lookup(info, "coop", "1x2x3/s1/NN") is None
    assert tunecache.lookup(info, "coop", "1x2x3/s1/NN") is not None
