"""Shader build: every shader compiles, the cache key sees includes and defines, errors are precise."""

import pytest

from catchat.errors import ShaderCompileError
from catchat.vk import shaders


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
