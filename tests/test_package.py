"""The wheel: built from an sdist of this tree, installed into a scratch directory, it carries its
shaders and runs `catchat parity` from outside the checkout, on a machine without glslc.

The installed package is run with `python -S` and PYTHONPATH = scratch + this venv's site-packages:
kp, numpy and the other dependencies come from the venv, while -S keeps out the editable install's
import hook (a meta-path finder that would otherwise import catchat from the checkout).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from catchat import parity

ROOT = Path(__file__).resolve().parents[1]
# what an sdist is made from (MANIFEST.in then decides what goes in)
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "catchat", "glsl",
           "tools/build_spirv.py", "tools/spirv-variants.txt")

pytestmark = pytest.mark.slow


def run(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False, **kw)
    assert res.returncode == 0, (f"{' '.join(map(str, cmd))} -> {res.returncode}\n"
                                 f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(scratch dir with the installed wheel, the wheel's file names)."""
    tmp = tmp_path_factory.mktemp("package")
    src = tmp / "src"
    for rel in SOURCES:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_dir():
            shutil.copytree(ROOT / rel, src / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / rel, src / rel)
    # the sdist first (PEP 517 hook), then the wheel from it, as an index would
    run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])",
         tmp / "sdist"], cwd=src)
    sdist = next((tmp / "sdist").glob("catchat-*.tar.gz"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", sdist])
    wheel = next((tmp / "dist").glob("catchat-*.whl"))
    site = tmp / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel])
    import zipfile

    return site, zipfile.ZipFile(wheel).namelist()


def test_wheel_carries_glsl_and_every_listed_variant(installed):
    from catchat.vk import shaders

    _, names = installed
    for name in shaders.shader_names():
        assert f"catchat/glsl/{name}.comp" in names
    for inc in shaders.INCLUDE_DIR.glob("*.glsl"):
        assert f"catchat/glsl/include/{inc.name}" in names
    # generated includes travel as their source (catchat/vk/slots.py), never as a copy that could go stale
    assert "catchat/vk/slots.py" in names
    for name in shaders.GENERATED_INCLUDES:
        assert not [n for n in names if n.endswith(f"/{name}")], name
    listed = [ln for ln in (ROOT / "tools/spirv-variants.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    spirv = [n for n in names if n.startswith("catchat/spirv/") and n.endswith(".spv")]
    assert listed and len(spirv) == len(set(listed))


def test_installed_wheel_runs_parity_without_glslc(installed, tmp_path):
    """The installed wheel runs the whole `catchat parity` from outside the checkout without glslc: every
    shader comes prebuilt, every check of every group passes, and the summary and record name them all."""
    site, _ = installed
    paths = sysconfig.get_paths()
    no_glslc = tmp_path / "bin"  # PATH holds nothing: no glslc, so every shader must come prebuilt
    no_glslc.mkdir()
    cache = tmp_path / "cache"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    # the wheel's defaults: no switch of the caller's shell (CATCHAT_FRAG_W=1 asks for variants it does not ship)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CATCHAT_"))},
           "PYTHONPATH": f"{site}:{paths['purelib']}:{paths['platlib']}", "PATH": str(no_glslc),
           "CATCHAT_CACHE": str(cache), "COLUMNS": "200"}
    py = [sys.executable, "-S"]
    where = run([*py, "-c", "import catchat.vk.shaders as s; print(s.GLSL_DIR); print(s.prebuilt_count())"],
                cwd=outside, env=env).stdout.split()
    assert where[0] == str(site / "catchat" / "glsl") and int(where[1]) > 0
    record = tmp_path / "parity.json"
    res = run([*py, "-m", "catchat", "parity", "--summary", "--json", record], cwd=outside, env=env)
    assert " 0 failed" in res.stdout and "passed" in res.stdout, res.stdout
    assert not list(cache.rglob("*.spv")), "a shader was compiled at run time instead of coming prebuilt"
    # the whole command passes and summarises (this suite's one run of every group; tests/test_parity_cli.py
    # checks the command's plumbing on a few): every group in the table and in the JSON record
    for group in parity.GROUPS:
        assert group in res.stdout
    r = json.loads(record.read_text())
    assert r["groups"] == list(parity.GROUPS) and r["failed"] == 0 and f"{r['passed']} passed" in res.stdout
    assert {c["group"] for c in r["checks"]} == set(parity.GROUPS)


def test_installed_wheel_compiles_unlisted_variant_with_generated_slots(installed, tmp_path):
    """A variant the wheel does not prebuild is compiled at run time from its catchat/glsl/ copy, with
    slots.glsl generated from the installed catchat/vk/slots.py: the same key and SPIR-V as here."""
    from catchat.vk import shaders

    site, _ = installed
    paths = sysconfig.get_paths()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    cache = tmp_path / "cache"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
           "PYTHONPATH": f"{site}:{paths['purelib']}:{paths['platlib']}", "CATCHAT_CACHE": str(cache)}
    name, defines = "loss_reduce", {"CATCHAT_TEST_UNLISTED": 1}  # includes slots.glsl; no list has this define
    out = tmp_path / "variant.spv"
    code = (f"import sys, catchat.vk.shaders as s; assert s.GLSL_DIR.is_relative_to({str(site)!r}); "
            f"d = {defines!r}; print(s.variant_key(s.GLSL_DIR / '{name}.comp', d)); "
            f"open(sys.argv[1], 'wb').write(s.compile_shader('{name}', d))")
    key = run([sys.executable, "-S", "-c", code, out], cwd=outside, env=env).stdout.strip()
    assert key == shaders.variant_key(shaders.GLSL_DIR / f"{name}.comp", defines)
    assert len(list(cache.rglob(f"{name}-*.spv"))) == 1  # compiled at run time, not prebuilt
    assert out.read_bytes() == shaders.compile_shader(name, defines)
