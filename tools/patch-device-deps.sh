#!/usr/bin/env bash
# Apply catchat's kp patches (tools/kp-patches/) to the kp source distribution in .device-deps/
# (filled by shared/device/fetch-deps.sh), so the GPU machine builds the same patched kp that
# `make setup` builds here, and add the newer glslc (tools/fetch-newer-glslc.sh) as .device-deps/glslc-newer.
# Idempotent: the pristine tarball is kept as kp-0.9.0.tar.gz.orig.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=.device-deps
[ -f "$deps/kp-0.9.0.tar.gz" ] || { echo "run: bash ../shared/device/fetch-deps.sh first" >&2; exit 1; }
[ -f "$deps/kp-0.9.0.tar.gz.orig" ] || cp "$deps/kp-0.9.0.tar.gz" "$deps/kp-0.9.0.tar.gz.orig"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
tar xzf "$deps/kp-0.9.0.tar.gz.orig" -C "$work"
for p in tools/kp-patches/*.patch; do patch -s -p1 -d "$work/kp-0.9.0" < "$p"; done
tar czf "$deps/kp-0.9.0.tar.gz" -C "$work" kp-0.9.0
echo "patched $deps/kp-0.9.0.tar.gz with $(ls tools/kp-patches/*.patch | wc -l) patches"
# the newer glslc (self-contained: runs on the GPU machine as it is), which compiles the KHR cooperative-matrix
# GEMM that `make setup` gives users: setup.sh points catchat at it, so no device call measures the slower NV
# extension by forgetting CATCHAT_GLSLC_NEWER (the 2026-12-06 H200 calls without it: v5's GEMMs 45.2 ms, 39.1 with)
bash tools/fetch-newer-glslc.sh "$deps/glslc-newer"
line='export CATCHAT_GLSLC_NEWER="${CATCHAT_GLSLC_NEWER:-$here/glslc-newer/glslc}"  # tools/patch-device-deps.sh'
grep -qF "$line" "$deps/setup.sh" || printf '%s\n' "$line" >> "$deps/setup.sh"
