#!/usr/bin/env bash
# The compiler for the shaders that need a newer glslang than Debian 12 ships (glsl/gemm_coopmat2.comp:
# GL_NV_cooperative_matrix2, SPIR-V 1.6): Debian 13's glslc (shaderc 2025.2, glslang 15), with the C
# and C++ runtime it was built against, run through that runtime's own loader so that nothing of the
# system changes. Fetched with apt-get from Debian's archive into a private apt state (the system's
# sources and lists are not touched) and unpacked into DEST (default: catchat's cache,
# ~/.cache/catchat/toolchains/glslc-newer), whose `glslc` script is what catchat.vk.shaders runs.
# Idempotent; `make setup` runs it, and it is optional: without it the cooperative-matrix-2 GEMM is
# not used (the other shaders need only Debian 12's glslc).
#   bash tools/fetch-newer-glslc.sh [DEST]
set -euo pipefail
CACHE="${CATCHAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catchat}"
dest="${1:-$CACHE/toolchains/glslc-newer}"
SUITE=trixie
PACKAGES=(glslc libshaderc1 libc6 libstdc++6 libgcc-s1)

if [ -x "$dest/glslc" ] && "$dest/glslc" --version >/dev/null 2>&1; then
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/debs"
cat > "$work/sources.list" <<EOF
deb http://deb.debian.org/debian $SUITE main
EOF
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=-"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives"
          -o "APT::Architecture=amd64" -o "APT::Architectures=amd64" -o "Debug::NoLocking=1"
          -o "APT::Sandbox::User=root")
apt-get "${apt_opts[@]}" update -qq >/dev/null
( cd "$work/debs" && apt-get "${apt_opts[@]}" download -qq "${PACKAGES[@]/%//$SUITE}" >/dev/null )
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp/root"
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
# keep the compiler and the libraries it loads (about 9 MB of the packages' 25)
lib=usr/lib/x86_64-linux-gnu
mkdir -p "$dest.tmp/root/usr/bin" "$dest.tmp/root/$lib"
cp -a "$work/root/usr/bin/glslc" "$dest.tmp/root/usr/bin/"
for f in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libgcc_s.so.1 'libstdc++.so.6*' 'libshaderc.so.1*'; do
    cp -a "$work/root/$lib"/$f "$dest.tmp/root/$lib/"
done
cat > "$dest.tmp/glslc" <<'EOF'
#!/bin/sh
# Debian 13's glslc on its own C runtime (tools/fetch-newer-glslc.sh)
here=$(dirname "$(readlink -f "$0")")
lib="$here/root/usr/lib/x86_64-linux-gnu"
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$here/root/usr/bin/glslc" "$@"
EOF
chmod +x "$dest.tmp/glslc"
"$dest.tmp/glslc" --version >/dev/null
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "newer glslc: $("$dest/glslc" --version | head -1) in $dest"
