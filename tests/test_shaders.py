"""Shader build: every shader compiles, the cache key sees includes and defines, errors are precise,
prebuilt SPIR-V (a wheel's) is found by the same key without glslc."""

import threading
from pathlib import Path

import pytest

from catchat.errors import ShaderCompileError, VulkanUnavailable
from catchat.vk import shaders

from support import load_tool

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


def test_compile_async_compiles_each_variant_once_in_parallel(glsl_tree, monkeypatch):
    """A program's kernels submit their variants to the compile pool as they are built: each variant
    compiles once however many kernels ask (a request while it compiles shares its Future; after,
    the cache has it), the bytes are compile_shader's, and a compile error comes out of result()."""
    (glsl_tree / "include" / "k.glsl").write_text("#define K 1.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)
    (glsl_tree / "bad.comp").write_text("#version 450\nlayout(local_size_x = 1) in;\nvoid main() { x = 1; }\n")
    runs = []
    glslc = shaders.glslc
    monkeypatch.setattr(shaders, "glslc", lambda *a: (runs.append(a[0].stem), glslc(*a)))
    gate = threading.Event()  # hold the pool's compiles until every request is in
    compile_shader = shaders.compile_shader
    monkeypatch.setattr(shaders, "compile_shader", lambda *a: (gate.wait(), compile_shader(*a))[1])
    futures = [shaders.compile_async("s", {"V": v}) for v in (1, 2, 1, 2, 3)]
    gate.set()
    assert futures[0] is futures[2] and futures[1] is futures[3]
    results = [f.result() for f in futures]  # every compile done (V = 3's too) before runs is counted
    assert results[:3] == [shaders.compile_shader("s", {"V": v}) for v in (1, 2, 1)]
    assert sorted(runs) == ["s", "s", "s"]  # V = 1, 2, 3: once each; compile_shader then read the cache
    assert shaders.compile_async("s", {"V": 1}).result() == futures[0].result() and len(runs) == 3
    with pytest.raises(ShaderCompileError, match="bad.comp:3:"):
        shaders.compile_async("bad").result()


def test_compile_async_of_a_compile_done_at_once_does_not_deadlock(glsl_tree, monkeypatch):
    """A cached variant can finish before compile_async registers its done-callback, which then runs
    in the caller's thread: it must not wait for the lock compile_async holds (a hang seen as a
    `catchat eval` that never returned)."""
    from concurrent.futures import Future

    (glsl_tree / "include" / "k.glsl").write_text("#define K 1.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)

    class AtOnce:  # a pool whose work is done before submit returns
        def submit(self, fn, *args):
            f = Future()
            f.set_result(fn(*args))
            return f

    monkeypatch.setattr(shaders, "_pool", AtOnce())
    done = []
    t = threading.Thread(target=lambda: done.append(shaders.compile_async("s").result()), daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "compile_async deadlocked on its own lock"
    key = ("s", shaders.variant_key((glsl_tree / "s.comp").resolve(), {}))
    assert done == [shaders.compile_shader("s")] and key not in shaders._in_flight  # forgotten once done
    # (only its own key: another test's compile can still be finishing its done-callbacks in the pool)


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


def _slot_defines(text):
    import re

    return {m[1]: int(m[2]) for m in re.finditer(r"^#define ((?:HP|ST|DC|DS)_\w+) (\d+)u$", text, re.MULTILINE)}


def test_generated_slots_glsl_defines_exactly_the_python_slots():
    """slots.glsl is generated from catchat/vk/slots.py (the one table): the same names, values and
    order, every slot inside its buffer, and no hand-written copy left in glsl/."""
    from catchat.vk import slots

    text = shaders.slots_glsl()
    assert _slot_defines(text) == slots.all_slots()
    assert list(_slot_defines(text)) == list(slots.all_slots())  # slots.py's order
    assert len(slots.all_slots()) == sum(ln.startswith("#define ") for ln in text.splitlines()) - 3  # guard, HPF, HPU
    assert "#define HPF(buf, slot) uintBitsToFloat(buf[slot])" in text and "#define HPU(buf, slot) (buf[slot])" in text
    for table, words in (("HP_", slots.HP_WORDS), ("ST_", slots.ST_WORDS), ("DC_", slots.DC_WORDS),
                         ("DS_", slots.DS_WORDS)):
        found = {k: v for k, v in slots.all_slots().items() if k.startswith(table) and not k.endswith("_WORDS")}
        assert max(found.values()) < words and len(set(found.values())) == len(found)  # inside, none shared
    assert slots.DC_STOP + 8 <= slots.DC_WORDS  # the 256-bit stop mask fits
    assert not (ROOT / "glsl" / "include" / "slots.glsl").exists()
    assert not list(ROOT.glob("glsl/**/slots.glsl"))


def test_slots_change_changes_the_key_of_every_includer(monkeypatch):
    """The key hashes the generated text: editing slots.py recompiles exactly the shaders that include it."""
    from catchat.vk import slots

    path = lambda name: shaders.GLSL_DIR / f"{name}.comp"  # noqa: E731
    users = [n for n in shaders.shader_names() if ("slots.glsl", shaders.slots_glsl().encode())
             in shaders._sources(path(n))]
    assert {"optimizer", "loss_reduce", "gru_forward"} <= set(users)  # gru_forward: via grid_sync.glsl
    before = {n: shaders.variant_key(path(n), {}) for n in shaders.shader_names()}
    monkeypatch.setattr(slots, "HP_TF_TOPK", 21)
    after = {n: shaders.variant_key(path(n), {}) for n in shaders.shader_names()}
    assert {n for n in before if before[n] != after[n]} == set(users)


def test_stale_copy_of_a_generated_include_is_refused(glsl_tree):
    (glsl_tree / "s.comp").write_text('#version 450\n#include "slots.glsl"\nlayout(local_size_x = 1) in;\n'
                                      "layout(set = 0, binding = 0) buffer B { uint b[]; };\n"
                                      "void main() { b[ST_LOSS_SUM] = HPU(b, HP_LR); }\n")
    assert shaders.compile_shader("s")[:4] == b"\x03\x02\x23\x07"  # generated: no file needed
    (glsl_tree / "include" / "slots.glsl").write_text("#define HP_LR 5u\n")
    with pytest.raises(ShaderCompileError, match="stale copy of the generated include 'slots.glsl'"):
        shaders.compile_shader("s")


def test_shader_reads_the_slots_the_host_writes(dev, glsl_tree):
    """On the device: a shader built with the generated include sees every slot index the host has,
    and reads a float and a uint slot of a `hyper` buffer the host filled through slots.py."""
    import numpy as np

    from catchat.vk import slots
    from catchat.vk.device import host_view

    names = list(slots.all_slots())
    body = "".join(f"    o[{i}] = {name};\n" for i, name in enumerate(names))
    (glsl_tree / "slots_probe.comp").write_text(
        '#version 450\n#include "slots.glsl"\nlayout(local_size_x = 1) in;\n'
        "layout(set = 0, binding = 0) readonly buffer Hyper { uint hyper[]; };\n"
        "layout(set = 0, binding = 1) buffer Out { uint o[]; };\n"
        f"void main() {{\n{body}"
        f"    o[{len(names)}] = floatBitsToUint(2.0 * HPF(hyper, HP_LR));\n"
        f"    o[{len(names) + 1}] = HPU(hyper, HP_STEP) + 1u;\n}}\n")
    hyper = np.zeros(slots.HP_WORDS, np.uint32)
    hyper[slots.HP_LR] = slots.f32_bits(0.375)
    hyper[slots.HP_STEP] = 41
    t_hyper, t_out = dev.tensor(hyper, np.uint32), dev.tensor(len(names) + 2, np.uint32)
    algo = dev.algorithm([t_hyper, t_out], shaders.compile_shader("slots_probe"), [1])
    dev.recorded([dev.kp.OpAlgoDispatch(algo)], upload=[t_hyper, t_out], download=[t_out]).eval()
    out = host_view(t_out)
    assert dict(zip(names, out[:len(names)].tolist(), strict=True)) == slots.all_slots()
    assert slots.word_f32(out, len(names)) == 0.75 and out[len(names) + 1] == 42


def test_concurrent_compiles_of_one_variant(glsl_tree):
    """Threads compiling the same variant at once (tools/bench_gru.py does) must not collide."""
    from concurrent.futures import ThreadPoolExecutor

    (glsl_tree / "include" / "k.glsl").write_text("#define K 3.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda _: shaders.compile_shader("s"), range(16)))
    assert len(set(outs)) == 1 and outs[0][:4] == b"\x03\x02\x23\x07"


def _no_glslc(monkeypatch):
    def missing(newer=False):
        raise VulkanUnavailable("glslc (the GLSL -> SPIR-V compiler) is not on PATH", hint="apt-get install glslc")
    monkeypatch.setattr(shaders, "glslc_version", missing)
    monkeypatch.setattr(shaders, "glslc_path", missing)


def _build_spirv():
    return load_tool("build_spirv")


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


def test_wheel_build_and_run_time_share_the_user_cache(glsl_tree, tmp_path, monkeypatch):
    """The wheel build compiles through the user cache: a variant the runtime compiled is copied, not
    compiled again, and one the build compiled is in the cache for the runtime; the bytes are glslc's. Where
    the cache cannot be written, the build compiles into the wheel."""
    (glsl_tree / "include" / "k.glsl").write_text("#define K 1.0\n")
    (glsl_tree / "s.comp").write_text(GOOD)
    listed = tmp_path / "variants.txt"
    listed.write_text("s\ns EXTRA=2\n")
    first = shaders.compile_shader("s")  # the runtime compiles one of the two
    compiled = []
    real = shaders.glslc
    monkeypatch.setattr(shaders, "glslc", lambda path, defines, out: (compiled.append(dict(defines)),
                                                                       real(path, defines, out)))
    build = _build_spirv().build
    assert build(tmp_path / "pkg", listed) == 2 and compiled == [{"EXTRA": "2"}]
    spv = {p.name: p.read_bytes() for p in (tmp_path / "pkg" / "spirv").glob("*.spv")}
    assert spv[f"s-{shaders.variant_key(glsl_tree / 's.comp', {})}.spv"] == first
    extra = f"s-{shaders.variant_key(glsl_tree / 's.comp', {'EXTRA': 2})}.spv"
    assert shaders.compile_shader("s", {"EXTRA": 2}) == spv[extra] and len(compiled) == 1  # from the cache
    assert build(tmp_path / "pkg2", listed) == 2 and len(compiled) == 1  # a second build compiles nothing
    assert {p.name: p.read_bytes() for p in (tmp_path / "pkg2" / "spirv").glob("*.spv")} == spv
    # a cache that cannot be written (here a file where its directory would be): compiled into the wheel
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("CATCHAT_CACHE", str(tmp_path / "not-a-dir"))
    assert build(tmp_path / "pkg3", listed) == 2 and len(compiled) == 3
    assert {p.name: p.read_bytes() for p in (tmp_path / "pkg3" / "spirv").glob("*.spv")} == spv


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
