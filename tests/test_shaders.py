"""Shader build: every shader compiles, the cache key sees includes and defines, errors are precise,
prebuilt SPIR-V (a wheel's) is found by the same key without glslc."""

import importlib.util
from pathlib import Path

import pytest

from catchat.errors import ShaderCompileError, VulkanUnavailable
from catchat.vk import shaders

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", shaders.shader_names())
def test_every_shader_compiles(name):
    spirv = shaders.compile_shader(name)
    assert spirv[:4] == b"\x03\x02\x23\x07"  # SPIR-V magic, little-endian


@pytest.fixture
def glsl_tree(tmp_path, monkeypatch):
    """A private glsl/ tree and cache so these tests can write broken shaders."""
    (tmp_path / "glsl" / "include").mkdir(parents=True)
    monkeypatch.setattr(shaders, "GLSL_DIR", tmp_path / "glsl")
    monkeypatch.setattr(shaders, "INCLUDE_DIR", tmp_path / "glsl" / "include")
    monkeypatch.setattr(shaders, "PREBUILT_DIR", tmp_path / "no-prebuilt")
    monkeypatch.setenv("CATCHAT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "glsl"


GOOD = """#version 450
#include "k.glsl"
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { float b[]; };
void main() { b[0] = K; }
"""


def test_cache_key_covers_includes_and_defines(glsl_tree):
    (glsl_tree / "include" / "k.glsl").write_text("#define K 1.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)
    first = shaders.compile_shader("s")
    assert len(list((shaders.cache_dir()).glob("s-*.spv"))) == 1
    assert shaders.compile_shader("s") == first  # served from cache
    (glsl_tree / "include" / "k.glsl").write_text("#define K 2.0\n")
    assert shaders.compile_shader("s") != first  # an include change recompiles
    shaders.compile_shader("s", {"EXTRA": 1})
    assert len(list(shaders.cache_dir().glob("s-*.spv"))) == 3


def test_compile_error_names_file_and_line(glsl_tree):
    (glsl_tree / "bad.comp").write_text("#version 450\nlayout(local_size_x = 1) in;\n\nvoid main() { x = 1; }\n")
    with pytest.raises(ShaderCompileError) as info:
        shaders.compile_shader("bad")
    msg = str(info.value)
    assert msg.startswith("bad.comp:4:") and "'x'" in msg


def test_missing_shader_and_include(glsl_tree):
    with pytest.raises(ShaderCompileError, match="no shader named"):
        shaders.compile_shader("nope")
    (glsl_tree / "inc.comp").write_text('#version 450\n#include "missing.glsl"\nvoid main() {}\n')
    with pytest.raises(ShaderCompileError, match="missing.glsl"):
        shaders.compile_shader("inc")


def test_slots_agree_with_glsl():
    """catchat/vk/slots.py and glsl/include/slots.glsl name the same word slots."""
    import re

    from catchat.vk import slots

    text = (shaders.INCLUDE_DIR / "slots.glsl").read_text()
    glsl = {m[1]: int(m[2]) for m in re.finditer(r"#define ((?:HP|ST)_\w+) (\d+)u", text)}
    assert glsl == slots.all_slots()
    assert max(v for k, v in glsl.items() if k.startswith("HP_") and k != "HP_WORDS") < slots.HP_WORDS
    assert max(v for k, v in glsl.items() if k.startswith("ST_") and k != "ST_WORDS") < slots.ST_WORDS


def test_concurrent_compiles_of_one_variant(glsl_tree):
    """Threads compiling the same variant at once (tools/bench_gru.py does) must not collide."""
    from concurrent.futures import ThreadPoolExecutor

    (glsl_tree / "include" / "k.glsl").write_text("#define K 3.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda _: shaders.compile_shader("s"), range(16)))
    assert len(set(outs)) == 1 and outs[0][:4] == b"\x03\x02\x23\x07"


def _no_glslc(monkeypatch):
    def missing():
        raise VulkanUnavailable("glslc (the GLSL -> SPIR-V compiler) is not on PATH", hint="apt-get install glslc")
    monkeypatch.setattr(shaders, "glslc_version", missing)
    monkeypatch.setattr(shaders, "glslc_path", missing)


def _build_spirv():
    spec = importlib.util.spec_from_file_location("build_spirv", ROOT / "tools" / "build_spirv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_wheel_layout_serves_prebuilt_variants_without_glslc(glsl_tree, tmp_path, monkeypatch):
    """tools/build_spirv.py (the wheel build) and compile_shader (run time) agree on the key: a listed
    variant comes from catchat/spirv/ with no glslc; one not listed names itself and glslc."""
    (glsl_tree / "include" / "k.glsl").write_text("#define K 1.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)
    listed = tmp_path / "variants.txt"
    listed.write_text("# comment\ns\ns EXTRA=2 OTHER=1\n")
    pkg = tmp_path / "pkg"
    assert _build_spirv().build(pkg, listed) == 2
    assert (pkg / "glsl" / "include" / "k.glsl").exists() and len(list((pkg / "spirv").glob("s-*.spv"))) == 2
    want = shaders.compile_shader("s", {"OTHER": 1, "EXTRA": 2})  # compiled here, into the cache
    monkeypatch.setattr(shaders, "GLSL_DIR", pkg / "glsl")
    monkeypatch.setattr(shaders, "INCLUDE_DIR", pkg / "glsl" / "include")
    monkeypatch.setattr(shaders, "PREBUILT_DIR", pkg / "spirv")
    monkeypatch.setenv("CATCHAT_CACHE", str(tmp_path / "empty-cache"))
    _no_glslc(monkeypatch)
    assert shaders.prebuilt_count() == 2
    assert shaders.compile_shader("s", {"EXTRA": 2, "OTHER": 1}) == want
    assert shaders.compile_shader("s")[:4] == b"\x03\x02\x23\x07"
    with pytest.raises(VulkanUnavailable, match=r"`s EXTRA=3` is not among the 2 prebuilt.*needs glslc"):
        shaders.compile_shader("s", {"EXTRA": 3})
    assert not (tmp_path / "empty-cache").exists()


def test_checkout_without_glslc_says_so(glsl_tree, monkeypatch):
    (glsl_tree / "include" / "k.glsl").write_text("#define K 1.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)
    _no_glslc(monkeypatch)
    with pytest.raises(VulkanUnavailable, match="glslc .* is not on PATH"):
        shaders.compile_shader("s")


def test_record_appends_each_variant_once(glsl_tree, tmp_path, monkeypatch):
    (glsl_tree / "include" / "k.glsl").write_text("#define K 1.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)
    log = tmp_path / "rec.txt"
    monkeypatch.setenv(shaders.ENV_RECORD, str(log))
    monkeypatch.setattr(shaders, "_recorded", set())
    for defines in ({"Y": 2, "X": 1}, {"X": 1, "Y": 2}, None):
        shaders.compile_shader("s", defines)
    assert log.read_text().splitlines() == ["s X=1 Y=2", "s"]
    assert shaders.parse_variant("s A=1 B=2") == ("s", {"A": "1", "B": "2"})


def test_variant_list_names_real_shaders():
    """tools/spirv-variants.txt (what a wheel prebuilds) lists only shaders that exist."""
    variants = _build_spirv().read_variants()
    assert len(variants) > 20
    assert {name for name, _ in variants} <= set(shaders.shader_names())
    assert {"axpby", "gemm", "gru_forward", "gru_backward"} <= {name for name, _ in variants}
