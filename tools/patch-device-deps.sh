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
# the newer glslc for glsl/gemm_coopmat2.comp (self-contained: runs on the GPU machine as it is);
# a run there points catchat at it with CATCHAT_GLSLC_NEWER=$PWD/.device-deps/glslc-newer/glslc
bash tools/fetch-newer-glslc.sh "$deps/glslc-newer"
