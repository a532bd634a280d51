"""The subgroup-fragment GEMM's tiles (glsl/gemm_coopmat.comp): which a device can run, the grid the
tuner and tools/bench_gemm.py measure, and the extension chosen. The numbers are `catchat parity`'s on a
GPU with cooperative matrices (lavapipe has none: here only the rules, on a stand-in device)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from catchat.vk import shaders
from catchat.vk.kernels import gemm
from catchat.vk.probe import DeviceInfo

H200 = DeviceInfo(index=0, name="NVIDIA H200", type="DISCRETE_GPU", vendor="NVIDIA", driver="580",
                  api_version="1.4", max_storage_buffer_bytes=1 << 32, max_shared_memory_bytes=49152,
                  max_push_constant_bytes=256, max_workgroup_invocations=1024, subgroup_size=32, compute_units=132)


@dataclass
class FakeDevice:
    """The fields the tile rules read: no Vulkan behind it."""

    info: DeviceInfo = H200
    features: frozenset = field(default_factory=lambda: frozenset({"cooperativeMatrixNV", "cooperativeMatrixKHR"}))
    coop_shapes: tuple = (gemm.COOP_SHAPE,)
    coop2_limits: tuple = ()
    coop2_dimensions: tuple = ()


@pytest.fixture
def no_newer_glslc(monkeypatch, tmp_path):
    monkeypatch.setenv(shaders.ENV_NEWER_GLSLC, str(tmp_path / "missing-glslc"))
    shaders.glslc_path.cache_clear()
    yield
    shaders.glslc_path.cache_clear()


def test_pipeline_fields_are_checked():
    dev = FakeDevice()
    assert gemm.CoopTiles(2, 4, 4, 4, 16, 2).problem(dev) is None
    assert "bad cooperative-matrix tiles" in gemm.CoopTiles(2, 2, 4, 4, 24, 2).problem(dev)
    assert "bad cooperative-matrix tiles" in gemm.CoopTiles(2, 2, 4, 4, 32, 3).problem(dev)
    # 128 x 256 over 32-deep slices in two buffers: 54 KiB, more than 48
    assert "shared memory" in gemm.CoopTiles(2, 4, 4, 4, 32, 2).problem(dev)
    assert gemm.CoopTiles(2, 4, 4, 4, 32, 1).spec() == [256, 2, 4, 4, 4, 32, 1]


def test_the_grid_holds_only_what_runs_with_the_programs_tiles_first(no_newer_glslc):
    dev = FakeDevice()
    for trans in ((False, False), (False, True), (True, False)):
        grid = gemm.coop_candidates(dev, trans)
        assert grid[:3] == [gemm.COOP_TILE, gemm.COOP_NARROW_TILE, gemm.COOP_SMALL_TILE]
        assert len(grid) == len(set(grid)) > 20
        assert all(t.problem(dev, trans) is None and t.api == "nv" for t in grid)
        assert {t.stages for t in grid} == {1, 2} and {t.bk for t in grid} == {16, 32}
    small = replace(dev, info=replace(H200, max_shared_memory_bytes=16384))
    assert all(t.shared_bytes(False, True) <= 16384 for t in gemm.coop_candidates(small, (False, True)))
    assert gemm.coop_candidates(replace(dev, coop_shapes=())) == []  # no tensor cores: nothing to measure


def test_the_extension_follows_the_compiler_and_the_environment(monkeypatch, tmp_path, no_newer_glslc):
    dev = FakeDevice()
    assert gemm.coop_api(dev) == "nv"  # the newer glslc is missing
    exe = tmp_path / "glslc"
    exe.write_text("#!/bin/sh\necho shaderc-test\n")
    exe.chmod(0o755)
    monkeypatch.setenv(shaders.ENV_NEWER_GLSLC, str(exe))
    shaders.glslc_path.cache_clear()
    assert gemm.coop_api(dev) == "khr"
    assert {t.api for t in gemm.coop_candidates(dev)} == {"khr"}
    assert gemm.pick_coop_tiles(dev, 32768, 6144, 1, (False, True), False).api == "khr"
    monkeypatch.setenv(gemm.ENV_COOP_API, "nv")
    assert gemm.coop_api(dev) == "nv"
    assert gemm.pick_coop_tiles(dev, 32768, 6144, 1, (False, True), False) == gemm.COOP_TILE


def test_split_gemm_tiles(no_newer_glslc, monkeypatch):
    """The float32 GEMM from float16 splits (SPLIT): one shared buffer and twice a slice's words; 128 x 128
    where the grid fills an H200 or, for the head's 101 columns, gives a workgroup per two SMs; 64 x 64
    for short grids; on by default only for large float32 products on a GPU with cooperative matrices."""
    monkeypatch.delenv(gemm.ENV_GEMM32_SPLIT, raising=False)
    dev = FakeDevice()
    assert gemm.SPLIT_TILE.shared_bytes(False, True, split=True) == 2 * gemm.SPLIT_TILE.shared_bytes(False, True)
    assert gemm.SPLIT_TILE.problem(dev, (False, True), split=True) is None
    assert "one shared buffer" in replace(gemm.SPLIT_TILE, stages=2).problem(dev, split=True)
    assert gemm.CoopTiles(2, 4, 4, 4, 32, 1).problem(dev, split=True) is not None  # 54 KB
    assert gemm.split_tiles(dev, 32768, 6144) == gemm.SPLIT_TILE  # nv: the newer glslc is missing here
    assert gemm.split_tiles(dev, 32768, 101) == gemm.SPLIT_TILE
    assert gemm.split_tiles(dev, 256, 256) == gemm.SPLIT_SMALL_TILE
    assert all(t.stages == 1 for t in gemm.split_candidates(dev)) and gemm.SPLIT_TILE in gemm.split_candidates(dev)
    assert gemm.split_gemm(dev, 32768, 6144, 2048) and not gemm.split_gemm(dev, 64, 6144, 2048)
    assert gemm.products(dev, "fp32") == "fp32 (large GEMMs on tensor cores from float16 splits, " \
        "VK_NV_cooperative_matrix)"
    monkeypatch.setenv(gemm.ENV_GEMM32_SPLIT, "0")
    assert not gemm.split_gemm(dev, 32768, 6144, 2048) and gemm.products(dev, "fp32") == "fp32"
