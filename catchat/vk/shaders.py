"""GLSL -> SPIR-V with glslc, cached by a hash of source + includes + defines + compiler version.

Shaders live in `glsl/NAME.comp`, shared code in `glsl/include/*.glsl`. Sizes that vary by config
reach a shader as specialization constants (geometry) or push constants (shapes); defines select
variants of one source. A compile error names the shader file, the line and glslc's message.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

from catchat.errors import ShaderCompileError, VulkanUnavailable

GLSL_DIR = Path(__file__).resolve().parents[2] / "glsl"
INCLUDE_DIR = GLSL_DIR / "include"
TARGET_ENV = "vulkan1.1"  # subgroup operations; every Vulkan 1.1+ driver (lavapipe, NVIDIA, AMD, Intel)
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_ERROR_RE = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<msg>.*)$", re.MULTILINE)


def cache_dir() -> Path:
    """Where compiled SPIR-V is kept (CATCHAT_CACHE or ~/.cache/catchat)."""
    root = os.environ.get("CATCHAT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "catchat")
    return Path(root) / "spirv"


@functools.cache
def glslc_path() -> str:
    """The glslc executable, or a one-line error naming the Debian package."""
    path = shutil.which("glslc")
    if path is None:
        raise VulkanUnavailable("glslc (the GLSL -> SPIR-V compiler) is not on PATH",
                                hint="apt-get install glslc   (or run `make setup`)")
    return path


@functools.cache
def glslc_version() -> str:
    """First line of `glslc --version`: part of every cache key."""
    out = subprocess.run([glslc_path(), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0].strip()


def shader_names() -> list[str]:
    """Every compute shader in glsl/ (without the .comp suffix)."""
    return sorted(p.stem for p in GLSL_DIR.glob("*.comp"))


def _sources(path: Path, seen: set[Path] | None = None) -> list[Path]:
    """The shader file followed by every file it includes, transitively, in a stable order."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    files = [path]
    for name in _INCLUDE_RE.findall(path.read_text()):
        inc = (path.parent / name) if (path.parent / name).exists() else INCLUDE_DIR / name
        if not inc.exists():
            raise ShaderCompileError(f"{path.name}: #include \"{name}\" not found in {INCLUDE_DIR}")
        files += _sources(inc.resolve(), seen)
    return files


def _cache_key(path: Path, defines: dict[str, object]) -> str:
    h = hashlib.sha256()
    for f in _sources(path):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for k in sorted(defines):
        h.update(f"-D{k}={defines[k]}\0".encode())
    h.update(f"{glslc_version()}\0{TARGET_ENV}".encode())
    return h.hexdigest()[:32]


def compile_shader(name: str, defines: dict[str, object] | None = None) -> bytes:
    """SPIR-V bytes of `glsl/<name>.comp` with the given defines, compiled once and cached on disk."""
    defines = dict(defines or {})
    path = (GLSL_DIR / f"{name}.comp").resolve()
    if not path.exists():
        raise ShaderCompileError(f"no shader named {name!r}: {path} does not exist")
    out = cache_dir() / f"{name}-{_cache_key(path, defines)}.spv"
    if out.exists():
        return out.read_bytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")  # unique per compiling thread
    cmd = [glslc_path(), "-fshader-stage=compute", f"--target-env={TARGET_ENV}", "-O", "-Werror",
           "-I", str(INCLUDE_DIR), *(f"-D{k}={v}" for k, v in sorted(defines.items())),
           str(path), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise _compile_error(name, res.stderr)
    os.replace(tmp, out)  # atomic: a concurrent reader never sees half a file
    return out.read_bytes()


def _compile_error(name: str, stderr: str) -> ShaderCompileError:
    m = _ERROR_RE.search(stderr)
    if m is None:
        return ShaderCompileError(f"glslc failed on glsl/{name}.comp: {stderr.strip()}")
    file = Path(m["file"]).name
    return ShaderCompileError(f"{file}:{m['line']}: {m['msg'].strip()} (compiling glsl/{name}.comp)")
