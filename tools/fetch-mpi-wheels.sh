#!/usr/bin/env bash
# Download the MPI wheels (mpi4py + MPICH, manylinux x86_64) into .device-deps/mpi/, for a GPU machine
# that reaches no package registry (run it where `bash ../shared/device/fetch-deps.sh` runs; copy
# .device-deps/ along with the project). On that machine, after `. .device-deps/setup.sh`:
#   python3 -m venv --system-site-packages /tmp/mpi-venv
#   /tmp/mpi-venv/bin/pip install --no-index --find-links .device-deps/mpi mpi4py mpich
#   export PATH=/tmp/mpi-venv/bin:$PATH      # mpiexec, and a python that sees kp (PYTHONPATH) and mpi4py
#   mpiexec -n 8 python -m catchat train configs/catchat-v5.toml
# (a venv, not `pip --target`: MPICH's wheel puts libmpi in the environment's lib/, which --target drops).
# Usage: tools/fetch-mpi-wheels.sh [PYTHON_VERSION ...]   (default: 3.10 3.11 3.12 3.13)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.device-deps/mpi
mkdir -p "$dest"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.10 3.11 3.12 3.13)
for v in "${versions[@]}"; do
    python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --no-deps -d "$dest" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --python-version "$v" 'mpi4py>=4' 'mpich>=4'
done
ls "$dest"
du -sh "$dest"
