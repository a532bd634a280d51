"""The workgroup-scope GEMM (glsl/gemm_coopmat2.comp, VK_NV_cooperative_matrix2): which tiles a device
can run and which the program picks, from what kp patch 0006 reports; how its shader compiles. Its
numbers are checked against numpy by `catchat parity` on a GPU that has the extension (lavapipe has no
cooperative matrices: here the GEMM must be refused, never run)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from catchat.errors import UsageError
from catchat.vk import shaders
from catchat.vk.device import coop2_dimension_name
from catchat.vk.kernels import gemm, gemm_tiles
from catchat.vk.probe import DeviceInfo

H200_INFO = DeviceInfo(index=0, name="NVIDIA H200", type="DISCRETE_GPU", vendor="NVIDIA", driver="580",
                       api_version="1.4", max_storage_buffer_bytes=1 << 32, max_shared_memory_bytes=49152,
                       max_push_constant_bytes=256, max_workgroup_invocations=1024, subgroup_size=32,
                       compute_units=132)
# what the H200's driver (580.159.04) reports for float16 products with float32 sums, among others
DIMENSIONS = ((32, 32, 16, 0, 0, 1, 1, 0, 2, 256),
              (32, 16, 16, 0, 0, 1, 1, 0, 2, 128),
              (16, 16, 16, 0, 0, 0, 0, 0, 3, 0))


@dataclass
class FakeDevice:
    """The fields the tile rules read: no Vulkan behind it."""

    info: DeviceInfo = H200_INFO
    features: frozenset = field(default_factory=lambda: frozenset(gemm.COOP2_FEATURES | {"cooperativeMatrixNV"}))
    coop_shapes: tuple = (gemm.COOP_SHAPE,)
    coop2_limits: tuple = (256, 256, 1024)
    coop2_dimensions: tuple = DIMENSIONS


@pytest.fixture
def newer_glslc(monkeypatch, tmp_path):
    """A stand-in for the newer compiler, so that coopmat2_runs depends on the device alone."""
    exe = tmp_path / "glslc"
    exe.write_text("#!/bin/sh\necho shaderc-test\n")
    exe.chmod(0o755)
    monkeypatch.setenv(shaders.ENV_NEWER_GLSLC, str(exe))
    shaders.glslc_path.cache_clear()
    yield exe
    shaders.glslc_path.cache_clear()


def test_dimension_names_read_like_the_shapes():
    assert coop2_dimension_name(DIMENSIONS[0]) == "32x32x16 f16*f16+f32->f32 workgroup 256"
    assert coop2_dimension_name(DIMENSIONS[2]) == "16x16x16 f16*f16+f16->f16 subgroup 0"


def test_the_tiles_a_device_offers(newer_glslc):
    dev = FakeDevice()
    assert gemm.coopmat2_runs(dev)
    assert gemm.COOP2_TILE.problem(dev) is None
    assert gemm.COOP2_NARROW_TILE.problem(dev) is None
    assert gemm.Coop2Tiles(64, 128, 32, 128).problem(dev) is None
    # more threads than the workgroup scope allows, a dimension past the largest, off-grain rows or slice
    assert "workgroup-scope dimensions" in gemm.Coop2Tiles(128, 128, 32, 512).problem(dev)
    assert "workgroup-scope dimensions" in gemm.Coop2Tiles(512, 64, 32).problem(dev)
    assert "workgroup-scope dimensions" in gemm.Coop2Tiles(128, 128, 24).problem(dev)
    assert "workgroup-scope dimensions" in gemm.Coop2Tiles(128, 80, 32).problem(dev)  # 80: not 32-column grains
    # 256 x 256 float32 accumulators on 256 threads: 256 registers each, more than a thread has
    assert "256 accumulators per thread" in gemm.Coop2Tiles(256, 256, 32).problem(
        replace(dev, coop2_limits=(256, 512, 1024)))
    # a workgroup size the driver does not list
    assert gemm.Coop2Tiles(128, 128, 32, 64).problem(dev) is not None


def test_the_program_picks_wide_tiles_for_wide_outputs(newer_glslc):
    dev = FakeDevice()
    assert gemm.coop2_tiles(dev, 32768, 6144) == gemm.COOP2_TILE  # v5's input projection
    assert gemm.coop2_tiles(dev, 32768, 101) == gemm.COOP2_NARROW_TILE  # the head
    assert gemm.coop2_tiles(dev, 256, 512) == gemm.COOP2_NARROW_TILE  # a grid that would not fill the GPU
    # a driver that lists only 128 threads: the 128-thread tile for every shape; none at all: nothing
    assert gemm.coop2_tiles(replace(dev, coop2_dimensions=DIMENSIONS[1:]), 32768, 6144) == gemm.COOP2_NARROW_TILE
    assert gemm.coop2_tiles(replace(dev, coop2_dimensions=DIMENSIONS[2:]), 32768, 6144) is None


def test_subgroup_fragments_first_unless_asked(newer_glslc, monkeypatch):
    """The subgroup-fragment GEMM measured faster on the H200 (docs/benchmarks.md): it is the default
    where it runs; CATCHAT_COOPMAT2=1 or coopmat2=True asks for workgroup scope; a device with only
    the workgroup scope gets it."""
    dev = FakeDevice()
    assert type(gemm.pick_coop_tiles(dev, 32768, 6144, 1, (False, True))) is gemm.CoopTiles
    assert gemm.pick_coop_tiles(dev, 32768, 6144, 1, (False, True), coopmat2=True) == gemm.COOP2_TILE
    only2 = replace(dev, features=frozenset(gemm.COOP2_FEATURES), coop_shapes=())
    assert gemm.pick_coop_tiles(only2, 32768, 6144, 1, (False, True)) == gemm.COOP2_TILE
    assert gemm.pick_coop_tiles(only2, 32768, 6144, 1, (False, True), coopmat2=False) is None
    monkeypatch.setenv(gemm.ENV_COOPMAT2, "1")
    assert gemm.pick_coop_tiles(dev, 32768, 101, 1, (False, True)) == gemm.COOP2_NARROW_TILE


def test_parity_checks_it_only_where_the_program_runs_it(newer_glslc, monkeypatch):
    """coopmat2_first: asked for (CATCHAT_COOPMAT2=1), or the device's only tensor-core GEMM; the
    parity's workgroup-scope cases follow it (they cost the NVIDIA driver ~1 min of pipeline builds)."""
    monkeypatch.delenv(gemm.ENV_COOPMAT2, raising=False)
    dev = FakeDevice()
    assert gemm.coopmat2_runs(dev) and not gemm.coopmat2_first(dev)
    assert gemm.coopmat2_first(replace(dev, features=frozenset(gemm.COOP2_FEATURES), coop_shapes=()))
    monkeypatch.setenv(gemm.ENV_COOPMAT2, "1")
    assert gemm.coopmat2_first(dev)
    monkeypatch.setenv(gemm.ENV_COOPMAT2, "0")
    assert not gemm.coopmat2_first(replace(dev, features=frozenset(gemm.COOP2_FEATURES), coop_shapes=()))


def test_parity_runs_its_cases_where_the_rule_says(dev, monkeypatch):
    from catchat.parity import gemm as parity_gemm

    ran = []
    monkeypatch.setattr(parity_gemm, "_coopmat2_cases", lambda d, rng, half: ran.append(half) or [])
    for first in (False, True):
        monkeypatch.setattr(gemm, "coopmat2_first", lambda d, first=first: first)
        ran.clear()
        parity_gemm._float16_cases(dev, np.random.default_rng(0), half=True)
        assert ran == [True] * first


def test_without_the_extension_or_the_compiler_or_when_turned_off(newer_glslc, monkeypatch):
    assert not gemm.coopmat2_runs(FakeDevice(features=frozenset({"cooperativeMatrixNV"})))
    assert "does not run" in gemm.COOP2_TILE.problem(FakeDevice(features=frozenset()))
    monkeypatch.setenv(gemm.ENV_COOPMAT2, "0")
    assert not gemm.coopmat2_runs(FakeDevice())
    monkeypatch.delenv(gemm.ENV_COOPMAT2)
    monkeypatch.setenv(shaders.ENV_NEWER_GLSLC, str(newer_glslc.parent / "missing"))
    shaders.glslc_path.cache_clear()
    assert not gemm.coopmat2_runs(FakeDevice())


def test_every_variant_compiles_with_the_newer_compiler():
    """The shader's defines (operand types, transposes, bias) compile to valid SPIR-V 1.6 with the
    compiler `make setup` fetches; Debian 12's glslc refuses GL_NV_cooperative_matrix2."""
    for defines in ({}, {"FLOAT_IN": 1}, {"TRANS_A": 1, "HAS_BIAS": 1}, {"TRANS_B": 1, "FLOAT_IN": 1, "HAS_BIAS": 1},
                    {"TRANS_A": 1, "TRANS_B": 1, "FLOAT_IN": 1}):
        spirv = shaders.compile_shader("gemm_coopmat2", defines)
        words = np.frombuffer(spirv[:8], np.uint32)
        assert words[0] == 0x07230203 and words[1] >> 16 == 1 and (words[1] >> 8) & 0xFF == 6  # SPIR-V 1.6


def test_a_device_without_it_refuses_the_gemm(dev):
    assert not gemm.coopmat2_runs(dev)
    a = dev.tensor(np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="cooperative"):
        gemm.Gemm(dev, (a, 0, 8), (a, 0, 8), (a, 0, 8), 8, 8, 8, precision="fp16", coopmat=True, coopmat2=True)


def test_the_subgroup_kernel_on_the_khr_extension(newer_glslc, monkeypatch):
    """glsl/gemm_coopmat_khr.comp (gemm_coopmat.comp's source on VK_KHR_cooperative_matrix) where the
    device has both extensions and the newer compiler (measured faster on the H200); CATCHAT_COOP_API=nv
    keeps the NV extension."""
    dev = FakeDevice()
    monkeypatch.setenv(gemm_tiles.ENV_COOP_API, "nv")
    nv = gemm.pick_coop_tiles(dev, 32768, 6144, 1, (False, True))
    assert nv.api == "nv" and nv.shader == "gemm_coopmat"
    monkeypatch.delenv(gemm_tiles.ENV_COOP_API)
    khr = gemm.pick_coop_tiles(dev, 32768, 6144, 1, (False, True))
    assert khr == replace(nv, api="khr") and khr.shader == "gemm_coopmat_khr" and khr.problem(dev) is None
    no_khr = replace(dev, features=dev.features - {"cooperativeMatrixKHR"})
    assert gemm.pick_coop_tiles(no_khr, 32768, 6144, 1, (False, True)).api == "nv"
    assert "VK_KHR_cooperative_matrix" in khr.problem(no_khr)


def test_both_extensions_compile_from_one_source():
    """gemm_coopmat.comp (Debian 12's glslc, SPIR-V 1.3) and gemm_coopmat_khr.comp (the newer one, 1.6)
    are glsl/include/gemm_coopmat.glsl, probes included."""
    for name, minor in (("gemm_coopmat", 3), ("gemm_coopmat_khr", 6)):
        for defines in ({"FLOAT_IN": 1, "VEC4_A": 1, "VEC4_B": 1, "TRANS_B": 1}, {"TRANS_A": 1, "HAS_BIAS": 1},
                        {"FLOAT_IN": 1, "PROBE_MMA_ONLY": 1}):
            words = np.frombuffer(shaders.compile_shader(name, defines)[:8], np.uint32)
            assert words[0] == 0x07230203 and (words[1] >> 8) & 0xFF == minor


def test_split_k_ranges_are_whole_slices_for_the_workgroup_scope_kernel():
    """gemm.k_ranges: ranges a multiple of 4 (vec4 loads along k), or of a coopmat2 tile's k-slice so
    that every range takes the shader's unclamped loads; never more ranges than asked, none empty."""
    assert gemm.k_ranges(1000, 1) == (1000, 1)
    assert gemm.k_ranges(1000, 3) == (336, 3)
    assert gemm.k_ranges(1000, 3, 32) == (352, 3)
    assert gemm.k_ranges(8, 5) == (4, 2)
    assert gemm.k_ranges(40, 5, 32) == (32, 2)
    for K in (1, 31, 64, 1000, 32768):
        for split in (2, 3, 5, 8):
            for multiple in (4, 16, 32, 64):
                k, n = gemm.k_ranges(K, split, multiple)
                assert k % multiple == 0 and 1 <= n <= split and (n - 1) * k < K <= n * k


def test_the_share_of_workgroups_on_the_unclamped_path():
    """Gemm.unclamped_share, what tools/bench_gemm.py prints beside a workgroup-scope row: inner tiles of
    aligned operands whose k range is whole slices; none where an offset or stride is not 16-byte groups;
    None for the other kernels. (The values themselves are checked by `catchat parity` on a GPU.)"""
    def fake(M, N, K, tiles, split_k=1, offsets=(8, 264, 16, 520), coopmat2=True):
        g = object.__new__(gemm.Gemm)
        k_split, g.split_k = gemm.k_ranges(K, split_k, tiles.bk)
        g.M, g.N, g.K, g.tiles, g.coopmat2 = M, N, K, tiles, coopmat2
        g.grid = [-(-M // tiles.bm), -(-N // tiles.bn), g.split_k]
        g.push = (M, N, K, *offsets, 0, N, 0, 1.0, 0.0, k_split, 0)
        return g

    t = gemm.COOP2_TILE  # 128 x 256, 32-deep slices
    assert fake(32768, 6144, 2048, t).unclamped_share() == 1.0  # v5's input projection: every tile
    assert fake(300, 520, 320, t).unclamped_share() == 4 / 9  # 2 x 2 inner tiles of 3 x 3
    assert fake(300, 520, 330, t).unclamped_share() == 0.0  # k not whole slices
    assert fake(256, 256, 1000, t, split_k=3).unclamped_share() == 2 / 3  # 352, 352, then 296
    assert fake(256, 256, 1024, t, offsets=(5, 264, 16, 520)).unclamped_share() == 0.0
    assert fake(256, 256, 1024, t, coopmat2=False).unclamped_share() is None


def test_the_sweeps_fragments_on_either_extension(newer_glslc, monkeypatch):
    """CATCHAT_SWEEP_API puts include/sweep_frag.glsl's real fragments (the streamed sweeps, the tensor-core
    decode step) on VK_KHR_cooperative_matrix where that runs (the KHR define), never emulated ones; NV
    where the device lacks it; anything but nv or khr is the user's mistake, said in one line."""
    dev = FakeDevice()
    monkeypatch.delenv(gemm_tiles.ENV_SWEEP_API, raising=False)
    assert gemm_tiles.sweep_api(dev) == gemm_tiles.SWEEP_API_DEFAULT
    monkeypatch.setenv(gemm_tiles.ENV_SWEEP_API, "khr")
    assert gemm_tiles.sweep_api(dev) == "khr"
    assert gemm_tiles.frag_defines(dev, emulate=False) == {"KHR": 1}
    assert gemm_tiles.frag_defines(dev, emulate=True) == {}
    no_khr = replace(dev, features=dev.features - {"cooperativeMatrixKHR"})
    assert gemm_tiles.sweep_api(no_khr) == "nv" and gemm_tiles.frag_defines(no_khr, emulate=False) == {}
    resident = gemm_tiles.RESIDENT_SWEEP_API_DEFAULT  # the resident sweeps follow the variable, else their default
    assert gemm_tiles.frag_defines(dev, False, resident) == {"KHR": 1}
    monkeypatch.delenv(gemm_tiles.ENV_SWEEP_API)
    assert gemm_tiles.frag_defines(dev, False, resident) == ({"KHR": 1} if resident == "khr" else {})
    monkeypatch.setenv(gemm_tiles.ENV_SWEEP_API, "khr")
    monkeypatch.setenv(gemm_tiles.ENV_SWEEP_API, "nv")
    assert gemm_tiles.sweep_api(dev) == "nv" and gemm_tiles.frag_defines(dev, emulate=False) == {}
    monkeypatch.setenv(gemm_tiles.ENV_SWEEP_API, "KHR")
    with pytest.raises(UsageError, match="CATCHAT_SWEEP_API='KHR' is not nv or khr"):
        gemm_tiles.sweep_api(dev)


def capabilities(spirv: bytes) -> set[int]:
    """The OpCapability operands of a SPIR-V module."""
    words, at, out = np.frombuffer(spirv, np.uint32), 5, set()
    while at < len(words):
        count, op = int(words[at]) >> 16, int(words[at]) & 0xFFFF
        if op == 17:  # OpCapability
            out.add(int(words[at + 1]))
        at += count
    return out


@pytest.mark.parametrize("name, defines", [
    ("gru_forward_stream", "BLOCKED_W=1 FULL=true KFLAGS=1 KPG=2 LF=2 LG=2 PD=2 PERSISTENT=1 RES=2 SAVE16=1"),
    ("gru_forward_stream", "BLOCKED_W=1 FULL=true KFLAGS=1 KPG=16 LF=2 PD=4 PERSISTENT=1 SPLIT=1"),
    ("gru_backward_ksplit", "BIAS_SUMS=15 BLOCKED_W=1 KPW=24 LF=2 PD=4 PERSISTENT=1 RES=12 SAVE16=1"),
    ("gru_backward_stream", "BIAS_SUMS=14 BLOCKED_W=1 FULL=true KFLAGS=1 KPG=6 LF=2 LG=2 PD=4 PERSISTENT=1 RES=6"),
    ("decode_layer_coop", "KS=4 PD=2 SEQ=1 SF=4"),
    ("gru_forward_resident",
     "COOP=1 COOP_KF=2 HV4=1 KS=16 KV=2 LB=4 LOG2SL=4 NTR=3 NU=16 PERSISTENT=1 RU=2 SL=16 TB=16"),
    # the fp32 forward from float16 splits at v3 (CATCHAT_RESIDENT_SPLIT; Debian 12's glslc once crashed on it)
    ("gru_forward_resident",
     "COOP=1 COOP_KF=8 HV4=1 KS=16 KV=2 LB=4 LOG2SL=4 NTR=3 NU=16 PERSISTENT=1 RU=2 SL=16 SPLIT=1 TB=16"),
    ("gru_backward_resident", "BIAS_SUMS=13 COOP=1 COOP_NF=2 CPT=2 LB=8 LOG2SL=1 NTR=1 NU=16 PERSISTENT=1 SL=2 TB=16"),
])
def test_the_sweeps_compile_on_either_extension(name, defines):
    """The sweeps and the decode step (variants an H200 runs, tools/spirv-variants.txt) compile for
    VK_NV_cooperative_matrix with Debian 12's glslc (SPIR-V 1.3) and, with KHR, for VK_KHR_cooperative_matrix
    with the newer one (1.6): each with its own capability and not the other's."""
    nv_cap, khr_cap = 5357, 6022  # CooperativeMatrixNV, CooperativeMatrixKHR
    base = dict(pair.split("=") for pair in defines.split())
    for extra, minor, cap, other in (({}, 3, nv_cap, khr_cap), ({"KHR": 1}, 6, khr_cap, nv_cap)):
        spirv = shaders.compile_shader(name, {**base, **extra})
        words = np.frombuffer(spirv[:8], np.uint32)
        assert words[0] == 0x07230203 and (words[1] >> 8) & 0xFF == minor
        assert cap in capabilities(spirv) and other not in capabilities(spirv)


def test_doctor_names_the_extension_each_tensor_core_kernel_runs_on(newer_glslc, monkeypatch):
    """`catchat doctor`'s half-precision line says which extension the GEMMs and the sweeps use (they are
    chosen apart: CATCHAT_COOP_API, CATCHAT_SWEEP_API), and nothing of the kind without cooperative matrices."""
    dev = FakeDevice()
    monkeypatch.delenv(gemm_tiles.ENV_COOP_API, raising=False)
    monkeypatch.setenv(gemm_tiles.ENV_SWEEP_API, "nv")
    assert gemm_tiles.tensor_core_extensions(dev) == (
        "tensor-core GEMMs on VK_KHR_cooperative_matrix, streamed sweeps and decode on VK_NV_cooperative_matrix, "
        "register-resident sweeps on VK_NV_cooperative_matrix")
    monkeypatch.setenv(gemm_tiles.ENV_SWEEP_API, "khr")
    assert gemm_tiles.tensor_core_extensions(dev).endswith("register-resident sweeps on VK_KHR_cooperative_matrix")
    monkeypatch.delenv(gemm_tiles.ENV_SWEEP_API)  # the defaults: KHR where measured faster, NV where not yet run
    assert gemm_tiles.tensor_core_extensions(dev) == (
        "tensor-core GEMMs on VK_KHR_cooperative_matrix, streamed sweeps and decode on VK_KHR_cooperative_matrix, "
        "register-resident sweeps on VK_NV_cooperative_matrix")
    assert gemm_tiles.tensor_core_extensions(replace(dev, coop_shapes=())) is None
