#!/usr/bin/env bash
# One-time (and idempotent) setup for catchat on Debian, as root or with sudo:
#   1. system packages: Vulkan loader + lavapipe, headers, glslc, fmt, pybind11, cmake, g++
#   2. the Kompute Python package `kp==0.9.0`, built from its source distribution against
#      those system headers (no network fetches inside CMake), with catchat's patches from
#      tools/kp-patches/ applied; the built wheel is cached, so a second setup takes seconds
#   3. a virtualenv .venv with catchat installed editable plus its dev extras, and a launcher that puts
#      `catchat` on PATH (/usr/local/bin as root, else ~/.local/bin: tools/install-launcher.sh)
#   4. mpi4py and MPICH (wheels, mpiexec in .venv/bin) for data-parallel training; optional
#   5. Debian 13's glslc (tools/fetch-newer-glslc.sh) for the cooperative-matrix-2 GEMM; optional
# Re-running it does only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

KP_VERSION=0.9.0
VENV=.venv
CACHE="${CATCHAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catchat}"
APT_PACKAGES=(mesa-vulkan-drivers libvulkan-dev vulkan-tools glslc libfmt-dev pybind11-dev cmake g++ make)

say() { printf '\033[1msetup:\033[0m %s\n' "$*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- 1. system packages ------------------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("include"), "Python.h")))' \
    || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "setup: catchat needs Python >= 3.11 (found $(python3 --version))" >&2; exit 1; }

# --- 2. virtualenv -----------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip -q --disable-pip-version-check)
"$PY" -c 'import setuptools, wheel' 2>/dev/null || "${PIP[@]}" install setuptools wheel
# numpy 2 where the index has it for this Python (numpy 1 has no wheels for Python 3.13+), else 1.x;
# a venv that already has numpy keeps it (catchat and the patched kp work under both majors)
if ! "$PY" -c 'import numpy' 2>/dev/null; then
    "${PIP[@]}" install 'numpy>=2' 2>/dev/null || "${PIP[@]}" install 'numpy>=1.24'
fi

# --- 3. kp, patched, from a wheel cache keyed by version + patches --------------------
patch_hash=$(cat tools/kp-patches/*.patch | sha256sum | cut -c1-12)
pytag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheel_dir="$CACHE/wheels/kp-$KP_VERSION-$patch_hash-$pytag"
if ! ls "$wheel_dir"/kp-*.whl >/dev/null 2>&1; then
    say "building kp $KP_VERSION from source (patches $patch_hash; about 90 s on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "${PIP[@]}" download --no-deps --no-binary=:all: "kp==$KP_VERSION" -d "$work" 2>/dev/null
    tar xzf "$work"/kp-$KP_VERSION.tar.gz -C "$work"
    for p in tools/kp-patches/*.patch; do patch -s -p1 -d "$work/kp-$KP_VERSION" < "$p"; done
    KOMPUTE_OPT_INSTALL=OFF KOMPUTE_OPT_USE_BUILT_IN_VULKAN_HEADER=OFF \
    KOMPUTE_OPT_USE_BUILT_IN_FMT=OFF KOMPUTE_OPT_USE_BUILT_IN_PYBIND11=OFF \
        "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$work/wheel" "$work/kp-$KP_VERSION" \
        > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; echo "setup: kp build failed" >&2; exit 1; }
    mkdir -p "$(dirname "$wheel_dir")" && rm -rf "$wheel_dir" && mv "$work/wheel" "$wheel_dir"
fi
# reinstall when the wheel (version + patches) changed or the installed kp lacks a patch's marker
kp_stamp="$VENV/.kp-wheel"
if [ "$(cat "$kp_stamp" 2>/dev/null)" != "$(basename "$wheel_dir")" ] \
   || ! "$PY" -c 'import kp, sys; sys.exit(not (getattr(kp, "catchat_dispatch_barrier", 0) and getattr(kp, "catchat_host_view", 0) and getattr(kp, "catchat_eval_async", 0) and getattr(kp, "catchat_device_features", 0) and getattr(kp, "catchat_coopmat2", 0) and getattr(kp, "catchat_dispatch_concurrent", 0)))' 2>/dev/null; then
    say "installing kp from $wheel_dir"
    "${PIP[@]}" install --force-reinstall --no-deps "$wheel_dir"/kp-*.whl
    basename "$wheel_dir" > "$kp_stamp"
fi

# --- 4. catchat itself (editable) + dev extras -----------------------------------------
stamp="$VENV/.catchat-installed"
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing catchat (editable) with dev extras"
    "${PIP[@]}" install -e '.[dev]'
    echo "$want" > "$stamp"
fi
# `catchat` on PATH for this checkout (a launcher; not in CI, whose clone must not take over the machine's)
if [ "${CI:-}" != true ]; then
    bash tools/install-launcher.sh || say "warning: no launcher installed: run $PWD/.venv/bin/catchat"
fi

# --- 5. MPI for data-parallel training (`mpiexec -n N catchat train`, docs/distributed.md) -------
# mpi4py and MPICH as wheels (MPICH's mpiexec lands in .venv/bin): no system MPI, nothing to build.
# Optional: a single process never imports MPI, so a machine without these wheels still trains.
if ! "$PY" -c 'import mpi4py' 2>/dev/null || [ ! -x "$VENV/bin/mpiexec" ]; then
    say "installing mpi4py and MPICH (wheels) for training on several ranks"
    "${PIP[@]}" install 'mpi4py>=4' 'mpich>=4' \
        || say "warning: mpi4py / MPICH did not install: training on several ranks needs them (docs/distributed.md)"
fi

# --- 6. the newer glslc for the cooperative-matrix-2 GEMM (tensor cores fed by the driver) ---------
# Debian 13's glslc on its own runtime, in the user cache; optional: without it that GEMM is not used.
bash tools/fetch-newer-glslc.sh \
    || say "warning: the newer glslc did not install: the cooperative-matrix-2 GEMM will not be used (docs/benchmarks.md)"

say "ready: $("$PY" -c 'import kp, catchat; import numpy; print(f"catchat {catchat.__version__}, kp {kp.__version__} (patched), numpy {numpy.__version__}")')"
