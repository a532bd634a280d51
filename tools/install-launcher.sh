#!/usr/bin/env bash
# Put `catchat` on PATH for this checkout: a two-line launcher in BIN_DIR (default /usr/local/bin as
# root, else ~/.local/bin) that runs this checkout's .venv/bin/catchat, so the README's commands work
# in any shell without activating the venv. `make setup` runs it (not under CI=true: CI's clone must
# not take over the machine's `catchat`). A launcher of another checkout is replaced (the last
# `make setup` wins, as with pip) and that is said; anything else named catchat there is left alone.
#   bash tools/install-launcher.sh [BIN_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${1:-}" ]; then bin="$1"
elif [ "$(id -u)" = 0 ]; then bin=/usr/local/bin
else bin="$HOME/.local/bin"
fi
mkdir -p "$bin"
target="$bin/catchat"
marker="# catchat launcher (tools/install-launcher.sh)"
if [ -e "$target" ] && ! grep -qF "$marker" "$target" 2>/dev/null; then
    echo "launcher: $target exists and is not catchat's launcher: left alone (use $root/.venv/bin/catchat)" >&2
    exit 0
fi
previous=$(sed -n 's/^exec "\(.*\)\/.venv\/bin\/catchat".*/\1/p' "$target" 2>/dev/null || true)
tmp="$target.tmp.$$"
printf '#!/bin/sh\n%s\nexec "%s/.venv/bin/catchat" "$@"\n' "$marker" "$root" > "$tmp"
chmod 755 "$tmp" && mv "$tmp" "$target"
if [ -n "$previous" ] && [ "$previous" != "$root" ]; then
    echo "launcher: $target now runs $root (it ran $previous)"
fi
case ":$PATH:" in
    *":$bin:"*) echo "launcher: \`catchat\` on PATH ($target -> $root/.venv/bin/catchat)" ;;
    *) echo "launcher: $target installed, but $bin is not on PATH: add it (export PATH=\"$bin:\$PATH\")" ;;
esac
