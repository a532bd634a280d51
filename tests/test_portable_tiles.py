"""Tiles from device properties (catchat/vk/tiles.py's counts scale with the SM count), co-residency
of persistent sweeps from the device's limits (catchat/vk/occupancy.py), and the tuning cache the
pickers consult first (catchat/vk/tune.py): all on fake device descriptions, no GPU needed."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
from test_tiles import H200, LAVAPIPE, choices

from catchat.vk import tiles, tune
from catchat.vk.kernels import gemm, gru
from catchat.vk.kernels.gru import plan as gru_plan  # where plan_sweep counts workgroups
from catchat.vk.occupancy import co_residency

HOPPER = dataclasses.replace(H200, warps_per_cu=64)  # what the driver reports on an H200


def fake(info):
    return SimpleNamespace(info=info)


@pytest.fixture(autouse=True)
def no_user_cache(tmp_path, monkeypatch):
    """Every test here sees an empty tuning cache of its own, and no CATCHAT_PERSISTENT."""
    monkeypatch.setenv("CATCHAT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(tune.ENV_TUNE, raising=False)
    monkeypatch.delenv("CATCHAT_PERSISTENT", raising=False)
    tune._said.clear()


def test_the_warps_per_sm_field_changes_no_choice():
    """Tiles do not read warps per SM; the co-residency check of the sweep plans does: with the
    H200's reported 64 warps, every v3/v5-like sweep plans as with the field unknown."""
    assert choices(HOPPER) == choices(H200)
    for B, H in ((64, 512), (32, 2048), (1, 512), (4, 64)):
        for backward in (False, True):
            hopper, h200 = (gru.plan_sweep(fake(i), B, H, backward) for i in (HOPPER, H200))
            assert (hopper.tiles, hopper.resident) == (h200.tiles, h200.resident), (B, H, backward)
            assert hopper.resident == 132 and hopper.residency.ok, (B, H, backward, hopper.residency)


def test_an_unknown_sm_count_falls_back_to_the_measured_devices_counts():
    """A GPU whose driver does not report SMs (AMD, Intel) gets the H200's measured thresholds,
    and no persistent sweeps (resident 0): the same choices as the H200 at resident 0."""
    other = dataclasses.replace(H200, name="AMD Radeon RX 7900 XTX", vendor="AMD", compute_units=0)
    got, h200 = choices(other), choices(H200)
    for cfg in got:
        assert got[cfg]["gemm"] == h200[cfg]["gemm"] and got[cfg]["split_k"] == h200[cfg]["split_k"]
        assert got[cfg]["colsum"] == h200[cfg]["colsum"]
        assert got[cfg]["gru"] == {k: v for k, v in h200[cfg]["gru"].items() if k.endswith("/wg0")}


def test_counts_scale_with_the_sm_count():
    """Half the SMs: half the workgroups fill the GPU (GEMM large tiles, split-K, column sums,
    per-step sweep tiles)."""
    half = fake(dataclasses.replace(H200, name="NVIDIA small", compute_units=66))
    full = fake(H200)
    assert tiles.scaled_workgroups(264, 66, 132) == 132 and tiles.scaled_workgroups(264, 0, 132) == 264
    # [2048, 1536]: 16 x 12 = 192 tiles of 128x128, below the H200's 264, above 132
    assert gemm.gemm_tiles(full, 2048, 1536) == gemm.GPU_SMALL_TILE
    assert gemm.gemm_tiles(half, 2048, 1536) == gemm.GPU_TILE
    assert gemm.gemm_split_k(half, 1536, 512, 65536) == 6 and gemm.gemm_split_k(full, 1536, 512, 65536) == 11
    assert gemm.colsum_splits(half, 65536, 1536) == 11 and gemm.colsum_splits(full, 65536, 1536) == 22
    # a forward of 64 rows (generation's batched step at v5): k-ranges of 256 over K = 2048, none past
    # SHORT_ROWS rows (a training window's forward keeps its kernels)
    assert gemm.short_split_k(full, 64, 101, 2048) == gemm.short_split_k(full, 64, 6144, 2048) == 8
    assert gemm.short_split_k(full, 64, 1536, 512) == 2 and gemm.short_split_k(full, 32768, 101, 2048) == 1
    # forward per step at B=64, H=512: 256 tiles of (8,8,4,1,1,64) ... (4,16,4,2,2,64) gives 128 workgroups,
    # enough for 66 SMs (threshold 128), not for 132 (256)
    assert gru.table_tiles(full, 64, 512, False, 0) == (8, 16, 4, 1, 1, 64)
    assert gru.table_tiles(half, 64, 512, False, 0) == (4, 16, 4, 2, 2, 64)


def test_per_step_tiles_respect_the_devices_shared_memory_and_threads():
    small = fake(dataclasses.replace(H200, name="NVIDIA tiny", max_shared_memory_bytes=16 * 1024,
                                     max_workgroup_invocations=256))
    for B, H in ((64, 512), (32, 2048)):
        for backward in (False, True):
            t = gru.table_tiles(small, B, H, backward, 0)
            assert t[0] * t[1] * t[2] <= 256 and gru.shared_bytes(t, backward) <= 16 * 1024


def test_co_residency_from_the_devices_limits():
    one = co_residency(HOPPER, 1, 1024, 49152)
    assert one.ok
    assert co_residency(HOPPER, 132, 512, 40000, registers=100).ok
    # two 512-thread workgroups of ~100 registers each do not fit an SM's 64K registers
    r = co_residency(HOPPER, 264, 512, 1000, registers=100)
    assert not r.ok and r.capacity == 132 and "registers 1" in r.reason
    # small workgroups: four per SM by threads (64 warps x 32 = 2048), shared memory allows 4 of 12 KB
    r = co_residency(HOPPER, 528, 512, 12 * 1024, registers=32)
    assert r.ok and r.per_cu == 4
    assert not co_residency(HOPPER, 529, 512, 12 * 1024, registers=32).ok
    # unknown register use: 255 per thread assumed
    assert co_residency(HOPPER, 264, 128, 1024).per_cu == 2
    # warps per SM unknown: a maximum-size workgroup still fits an SM
    assert co_residency(H200, 132, 1024, 49152).ok
    r = co_residency(dataclasses.replace(H200, compute_units=0), 8, 64, 0)
    assert not r.ok and "VK_NV_shader_sm_builtins" in r.reason
    assert not co_residency(LAVAPIPE, 2, 64, 0).ok


def test_a_sweep_not_shown_co_resident_runs_a_dispatch_per_step(monkeypatch):
    """The persistent dispatch is checked before it is planned: where the workgroups are not shown
    resident at once, the sweep takes per-step tiles and says why; CATCHAT_PERSISTENT (or a caller's
    count) forces the count unchecked."""
    dev = fake(dataclasses.replace(HOPPER, compute_units=4))
    plan = gru.plan_sweep(dev, 64, 512, False)
    assert plan.resident == 4 and plan.residency.ok and "co-resident" in plan.residency.reason
    monkeypatch.setattr(gru_plan, "resident_workgroups", lambda dev: 1000)  # a budget beyond the device
    plan = gru.plan_sweep(dev, 64, 512, False)
    assert plan.resident == 0 and not plan.residency.ok and "exceed" in plan.residency.reason
    assert plan.tiles == gru.table_tiles(dev, 64, 512, False, 0)
    assert gru.plan_sweep(dev, 64, 512, False, persistent=1000).resident == 1000
    monkeypatch.setenv("CATCHAT_PERSISTENT", "1000")
    assert gru.plan_sweep(dev, 64, 512, False).resident == 1000


def test_tensor_core_sweeps_are_judged_co_resident_by_their_own_resources():
    """The tensor-core sweeps (coop) run other kernels than the FMA ones their tiles name: 512 threads
    and their own shared memory (registers not modelled). A device with room for v3's FMA backward
    sweep (3,840 B a workgroup) but not the tensor-core one's (26,368 B) plans the coop sweep per
    step, with the reason, and so `coop_sweeps` would not pick it."""
    tiles = gru.plan_sweep(fake(HOPPER), 64, 512, True).tiles
    assert gru.coop_tiles_ok(tiles)
    assert gru.resident_resources(tiles, 64, 512, True, 32, coop=True) == (
        128, gru.COOP_THREADS, gru.coop_shared_bytes(512, backward=True), 0)
    fma = gru.resident_resources(tiles, 64, 512, True, 32)
    assert fma[:3] == (128, 512, 3840) and fma[3] > 0
    small = fake(dataclasses.replace(HOPPER, max_shared_memory_bytes=20000))
    plain, coop = (gru.plan_sweep(small, 64, 512, True, coop=c) for c in (False, True))
    assert plain.resident == 132 and plain.residency.ok and gru.coop_tiles_ok(plain.tiles)
    assert coop.resident == 0 and not coop.residency.ok and "shared memory 0" in coop.residency.reason


def test_the_h200_plans_persistent_sweeps_at_v3_and_v5():
    for B, H in ((64, 512), (32, 2048), (1, 512)):
        for backward in (False, True):
            plan = gru.plan_sweep(fake(HOPPER), B, H, backward)
            assert plan.resident == 132 and plan.residency.ok
            assert plan.tiles == gru.table_tiles(fake(HOPPER), B, H, backward, 132)


# ------------------------------------------------------------------------------------ the tuning cache
def test_cached_choices_come_first_and_invalid_ones_are_noted(capsys):
    dev = fake(LAVAPIPE)
    key = tune.gemm_key(300, 200, 64, 1, False, True)
    assert gemm.gemm_tiles(dev, 300, 200, 1, 64, (False, True)) == gemm.CPU_TILE
    tune.store(LAVAPIPE, {"gemm": {key: [64, 64, 8, 4, 4]},
                          "gru": {tune.gru_key(3, 40, False, 0): ["tuple", [8, 8, 4, 1, 1, 64]]}})
    assert gemm.gemm_tiles(dev, 300, 200, 1, 64, (False, True)) == gemm.GPU_SMALL_TILE
    assert gemm.gemm_tiles(dev, 300, 200, 1) == gemm.CPU_TILE  # no K: the tables
    assert gru.default_tiles(dev, 3, 40, False, 0) == (8, 8, 4, 1, 1, 64)
    assert gru.default_tiles(dev, 3, 40, True, 0) == gru.table_tiles(dev, 3, 40, True, 0)
    # a choice that is no longer a candidate (here: more threads than the device allows)
    tune.store(LAVAPIPE, {"gemm": {key: [256, 256, 8, 4, 4]}, "gru": {tune.gru_key(3, 40, False, 0): ["tuple", [1]]}})
    assert gemm.gemm_tiles(dev, 300, 200, 1, 64, (False, True)) == gemm.CPU_TILE
    assert gru.default_tiles(dev, 3, 40, False, 0) == gru.table_tiles(dev, 3, 40, False, 0)
    err = capsys.readouterr().err
    assert "ignoring the tuned GEMM tiles [256, 256, 8, 4, 4]" in err and "ignoring the tuned sweep tiles" in err


def test_a_cache_of_other_limits_or_a_corrupt_one_is_ignored_with_a_warning(monkeypatch, capsys):
    dev = fake(LAVAPIPE)
    key = tune.gemm_key(300, 200, 64, 1, False, False)
    path = tune.store(LAVAPIPE, {"gemm": {key: [64, 64, 8, 4, 4]}})
    other = dataclasses.replace(LAVAPIPE, max_shared_memory_bytes=65536)
    assert tune.cache_path(other) == path and tune.lookup(other, "gemm", key) is None
    assert "ignoring the tuning cache" in capsys.readouterr().err
    monkeypatch.setenv(tune.ENV_TUNE, "0")
    assert gemm.gemm_tiles(dev, 300, 200, 1, 64) == gemm.CPU_TILE
    monkeypatch.delenv(tune.ENV_TUNE)
    assert gemm.gemm_tiles(dev, 300, 200, 1, 64) == gemm.GPU_SMALL_TILE
    for junk in ("{not json", json.dumps([1, 2]), json.dumps({"version": 99}), "\0\1\2"):
        path.write_text(junk)
        tune._said.clear()  # each warning is printed once per process
        assert gemm.gemm_tiles(dev, 300, 200, 1, 64) == gemm.CPU_TILE
        assert "ignoring the tuning cache" in capsys.readouterr().err
    # store() replaces a corrupt file rather than failing on it
    tune.store(LAVAPIPE, {"gemm": {key: [64, 64, 8, 4, 4]}})
    assert gemm.gemm_tiles(dev, 300, 200, 1, 64) == gemm.GPU_SMALL_TILE
