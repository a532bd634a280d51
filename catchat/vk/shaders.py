"""GLSL -> SPIR-V: one way to get a shader variant, from a source checkout or an installed wheel.

Shaders live in `glsl/NAME.comp`, shared code in `glsl/include/*.glsl`, except the includes
generated from Python (`GENERATED_INCLUDES`: `slots.glsl`, from catchat/vk/slots.py), which are
never files in glsl/: every glslc run gets them written into a scratch directory on its include
path. Sizes that vary by config reach a shader as specialization constants (geometry) or push
constants (shapes); defines select variants of one source. A variant is (name, defines), and its
key hashes the shader, every file it includes (a generated one by its generated text), the defines,
the target environment and the compile flags (not the compiler version), so it can be computed
wherever the GLSL is, with or without glslc. `compile_shader` looks in turn:

1. prebuilt: `catchat/spirv/NAME-KEY.spv`, which a wheel carries for every variant listed in
   tools/spirv-variants.txt (compiled by tools/build_spirv.py when the wheel is built); a source
   checkout has none;
2. the user cache: `~/.cache/catchat/spirv/NAME-KEY2.spv` (KEY2 adds glslc's version);
3. else glslc compiles it into the cache: in a checkout from `glsl/`, in a wheel from the copy of
   `glsl/` it carries as `catchat/glsl/` (the generated includes come from the installed
   catchat/vk/slots.py either way). A variant that is not prebuilt needs glslc.

A compile error names the shader file, the line and glslc's message. NEWER_SHADERS (GL_NV_cooperative_matrix2,
GL_KHR_cooperative_matrix; SPIR-V 1.6) and any variant defining KHR compile with a newer glslc than
Debian 12's: $CATCHAT_GLSLC_NEWER, else the one `make setup` fetched (tools/fetch-newer-glslc.sh) into
the cache; where it is missing their kernels are not used.

`compile_async` runs the same lookup on a thread pool of one thread per core: a program's kernels
submit their variants as they are built and make their pipelines on first use (`Kernel.algo`), so
a first run compiles on every core instead of one glslc after another.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from catchat.environment import cache_root
from catchat.errors import ShaderCompileError, VulkanUnavailable
from catchat.vk import slots

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # catchat/
# a wheel carries its GLSL as catchat/glsl/; a checkout has it beside the package
GLSL_DIR = PACKAGE_DIR / "glsl" if (PACKAGE_DIR / "glsl").is_dir() else PACKAGE_DIR.parent / "glsl"
INCLUDE_DIR = GLSL_DIR / "include"
PREBUILT_DIR = PACKAGE_DIR / "spirv"  # only in a wheel
TARGET_ENV = "vulkan1.1"  # subgroup operations; every Vulkan 1.1+ driver (lavapipe, NVIDIA, AMD, Intel)
FLAGS = ("-fshader-stage=compute", f"--target-env={TARGET_ENV}", "-O", "-Werror")
# Shaders that need SPIR-V 1.6 and a glslang newer than Debian 12's (GL_NV_cooperative_matrix2,
# GL_KHR_cooperative_matrix):
# compiled by NEWER_GLSLC for Vulkan 1.3, and run only where the device has what they use.
NEWER_SHADERS = frozenset({"gemm_coopmat2", "gemm_coopmat_khr", "coopmat_layout"})
NEWER_FLAGS = ("-fshader-stage=compute", "--target-env=vulkan1.3", "-O", "-Werror")
# Shaders compiled without spirv-opt's -O: Debian 12's crashes on the sum of two cooperative-matrix
# accumulators (glsl/gru_*_stream.comp, decode_layer_coop.comp). The driver optimises the SPIR-V it is given anyway.
UNOPTIMISED_SHADERS = frozenset({"gru_forward_stream", "gru_backward_stream", "decode_layer_coop"})
# The newer compiler: $CATCHAT_GLSLC_NEWER, else what `make setup` fetched (Debian 13's glslc with its
# own C runtime, tools/fetch-newer-glslc.sh) into the user cache.
ENV_NEWER_GLSLC = "CATCHAT_GLSLC_NEWER"
ENV_RECORD = "CATCHAT_SPIRV_RECORD"  # a file: every variant asked for is appended (tools/build_spirv.py)
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_ERROR_RE = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<msg>.*)$", re.MULTILINE)
_recorded: set[str] = set()
_record_lock = threading.Lock()


def cache_dir() -> Path:
    """Where compiled SPIR-V is kept (cache_root()/spirv)."""
    return cache_root() / "spirv"


def newer_glslc_default() -> Path:
    """Where `make setup` puts the newer compiler (a script running Debian 13's glslc)."""
    return cache_root() / "toolchains" / "glslc-newer" / "glslc"


@functools.cache
def glslc_path(newer: bool = False) -> str:
    """The glslc executable (newer: the one for NEWER_SHADERS), or a one-line error saying how to get it."""
    if newer:
        path = os.environ.get(ENV_NEWER_GLSLC) or str(newer_glslc_default())
        if not os.access(path, os.X_OK):
            raise VulkanUnavailable(f"the compiler for the cooperative-matrix-2 shaders ({path}) is missing",
                                    hint="run `make setup` (or bash tools/fetch-newer-glslc.sh), or set "
                                         f"{ENV_NEWER_GLSLC} to a glslc from shaderc 2024.3 or newer")
        return path
    path = shutil.which("glslc")
    if path is None:
        raise VulkanUnavailable("glslc (the GLSL -> SPIR-V compiler) is not on PATH",
                                hint="apt-get install glslc   (or run `make setup`)")
    return path


@functools.cache
def glslc_version(newer: bool = False) -> str:
    """First line of `glslc --version`: part of every cache key."""
    out = subprocess.run([glslc_path(newer), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0].strip()


def needs_newer(name: str, defines: dict[str, object]) -> bool:
    """Whether a variant compiles with the newer glslc: NEWER_SHADERS, and any variant defining KHR (the
    sweeps' and the decode step's fragments on VK_KHR_cooperative_matrix, include/sweep_frag.glsl)."""
    return name in NEWER_SHADERS or "KHR" in defines


def _flags(name: str, defines: dict[str, object]) -> tuple[str, ...]:
    flags = NEWER_FLAGS if needs_newer(name, defines) else FLAGS
    return tuple(f for f in flags if f != "-O") if name in UNOPTIMISED_SHADERS else flags


def shader_names() -> list[str]:
    """Every compute shader in glsl/ (without the .comp suffix)."""
    return sorted(p.stem for p in GLSL_DIR.glob("*.comp"))


def prebuilt_count() -> int:
    """How many SPIR-V variants this installation carries prebuilt (0 in a source checkout)."""
    return sum(1 for _ in PREBUILT_DIR.glob("*.spv")) if PREBUILT_DIR.is_dir() else 0


def slots_glsl() -> str:
    """The text of `#include "slots.glsl"`: every slot of catchat/vk/slots.py as a `#define NAME Nu`,
    in slots.py's order, and the two accessors."""
    defines = "".join(f"#define {name} {index}u\n" for name, index in slots.all_slots().items())
    return ("// Word slots of the `hyper` (host -> GPU) and `stats` (GPU -> host) buffers; floats are stored as\n"
            "// uint bits. Generated from catchat/vk/slots.py by catchat/vk/shaders.py for every compile.\n"
            "#ifndef CATCHAT_SLOTS_GLSL\n#define CATCHAT_SLOTS_GLSL\n"
            f"{defines}\n"
            "// Read a float / uint slot of a uint word buffer.\n"
            "#define HPF(buf, slot) uintBitsToFloat(buf[slot])\n"
            "#define HPU(buf, slot) (buf[slot])\n"
            "\n#endif\n")


# includes made from Python for every compile (never files in glsl/): name -> its text's generator
GENERATED_INCLUDES = {"slots.glsl": slots_glsl}


def _sources(path: Path, seen: set[object] | None = None) -> list[tuple[str, bytes]]:
    """(file name, content) of the shader and of every file it includes, transitively, in a stable
    order; a generated include by its generated text."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    data = path.read_bytes()
    files = [(path.name, data)]
    for name in _INCLUDE_RE.findall(data.decode()):
        local = path.parent / name
        if name in GENERATED_INCLUDES:
            stale = [p for p in (local, INCLUDE_DIR / name) if p.exists()]
            if stale:  # glslc would read the file instead of the generated text the key hashes
                raise ShaderCompileError(f"{stale[0]}: a stale copy of the generated include {name!r} "
                                         f"(made from catchat/vk/ at every compile): delete it")
            if name not in seen:
                seen.add(name)
                files.append((name, GENERATED_INCLUDES[name]().encode()))
            continue
        inc = local if local.exists() else INCLUDE_DIR / name
        if not inc.exists():
            raise ShaderCompileError(f"{path.name}: #include \"{name}\" not found in {INCLUDE_DIR}")
        files += _sources(inc.resolve(), seen)
    return files


def variant_key(path: Path, defines: dict[str, object]) -> str:
    """The key of a variant: sources (by file name and content, a generated include by its text),
    defines, target and flags. The same wherever the GLSL lies, so a wheel's prebuilt file is found by it."""
    h = hashlib.sha256()
    for name, data in _sources(path):
        h.update(name.encode() + b"\0" + data + b"\0")
    for k in sorted(defines):
        h.update(f"-D{k}={defines[k]}\0".encode())
    h.update(("\0".join(_flags(path.stem, defines))).encode())
    return h.hexdigest()[:32]


def format_variant(name: str, defines: dict[str, object]) -> str:
    """'gemm TRANS_A=1 VEC4_B=1': one line of tools/spirv-variants.txt."""
    return " ".join([name, *(f"{k}={defines[k]}" for k in sorted(defines))])


def parse_variant(line: str) -> tuple[str, dict[str, str]]:
    """The inverse of `format_variant`."""
    name, *pairs = line.split()
    return name, dict(p.split("=", 1) for p in pairs)


def compile_shader(name: str, defines: dict[str, object] | None = None, key: str | None = None) -> bytes:
    """SPIR-V bytes of `glsl/<name>.comp` with the given defines: prebuilt, cached, or compiled once
    with glslc into the cache (see the module docstring). `key`: the variant's `variant_key` where
    the caller has it (compile_async), so the sources are not read and hashed again."""
    defines = dict(defines or {})
    path = (GLSL_DIR / f"{name}.comp").resolve()
    if not path.exists():
        raise ShaderCompileError(f"no shader named {name!r}: {path} does not exist")
    if os.environ.get(ENV_RECORD):
        _record(name, defines)
    key = key or variant_key(path, defines)
    prebuilt = PREBUILT_DIR / f"{name}-{key}.spv"
    if prebuilt.exists():
        return prebuilt.read_bytes()
    try:
        return compile_cached(path, defines, key).read_bytes()
    except VulkanUnavailable as exc:
        if PREBUILT_DIR.is_dir():  # a wheel without glslc: say which variant it lacks
            raise VulkanUnavailable(
                f"shader variant `{format_variant(name, defines)}` is not among the {prebuilt_count()} "
                f"prebuilt in this installation, and compiling it needs glslc, which is not on PATH",
                hint=exc.hint) from None
        raise


def compile_cached(path: Path, defines: dict[str, object], key: str) -> Path:
    """The user cache's file of the variant (`key`: its variant_key) with this glslc's version in its
    name, compiled into the cache first where it is not there: the one place glslc's output is kept,
    shared by the runtime and a wheel's build (tools/build_spirv.py)."""
    name = path.stem
    version = glslc_version(needs_newer(name, defines))
    cache_key = hashlib.sha256(f"{key}\0{version}".encode()).hexdigest()[:32]
    out = cache_dir() / f"{name}-{cache_key}.spv"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")  # unique per compiling thread
    glslc(path, defines, tmp)
    os.replace(tmp, out)  # atomic: a concurrent reader never sees half a file
    return out


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_in_flight: dict[tuple[str, str], Future] = {}  # (name, variant key) -> its compile, until done


def compile_async(name: str, defines: dict[str, object] | None = None) -> Future:
    """`compile_shader` on catchat's compile pool (one thread per core; glslc runs as a process, so
    the threads compile in parallel): a Future of the SPIR-V bytes, whose result() raises what
    compile_shader would. A variant asked for while it compiles shares that Future (two kernels of
    one variant would otherwise both miss the cache and both compile); once done, it is in the
    cache."""
    global _pool
    defines = dict(defines or {})
    path = (GLSL_DIR / f"{name}.comp").resolve()
    variant = variant_key(path, defines) if path.exists() else None  # None: compile_shader says it is missing
    key = (name, variant or "")
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="catchat-glslc")
        future = _in_flight.get(key)
        submitted = future is None
        if submitted:
            future = _in_flight[key] = _pool.submit(compile_shader, name, defines, variant)
    if submitted:  # outside the lock: a future already done runs the callback here, and _forget takes it
        future.add_done_callback(lambda f: _forget(key, f))
    return future


def _forget(key: tuple[str, str], future: Future) -> None:
    with _pool_lock:
        if _in_flight.get(key) is future:
            del _in_flight[key]


def glslc(path: Path, defines: dict[str, object], out: Path) -> None:
    """Compile one variant of the shader at `path` to `out` with glslc; the generated includes are
    written into a scratch directory searched after glsl/include/ (which must not hold a copy)."""
    with tempfile.TemporaryDirectory(prefix="catchat-glsl-") as generated:
        for name, text in GENERATED_INCLUDES.items():
            Path(generated, name).write_text(text())
        cmd = [glslc_path(needs_newer(path.stem, defines)), *_flags(path.stem, defines), "-I", str(INCLUDE_DIR),
               "-I", generated, *(f"-D{k}={v}" for k, v in sorted(defines.items())), str(path), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise _compile_error(path.stem, res.stderr)


def _record(name: str, defines: dict[str, object]) -> None:
    """Append the variant to $CATCHAT_SPIRV_RECORD (once per process)."""
    line = format_variant(name, defines)
    with _record_lock:
        if line in _recorded:
            return
        _recorded.add(line)
        with open(os.environ[ENV_RECORD], "a") as f:
            f.write(line + "\n")


def _compile_error(name: str, stderr: str) -> ShaderCompileError:
    m = _ERROR_RE.search(stderr)
    if m is None:
        return ShaderCompileError(f"glslc failed on glsl/{name}.comp: {stderr.strip()}")
    file = Path(m["file"]).name
    return ShaderCompileError(f"{file}:{m['line']}: {m['msg'].strip()} (compiling glsl/{name}.comp)")
