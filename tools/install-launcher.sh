#!/usr/bin/env bash
# Put `catchat` on PATH for this checkout: a small bash launcher in BIN_DIR (default /usr/local/bin as
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
# The launcher holds Ctrl-C while the interpreter starts (~30 ms before any catchat line, where Python
# would print a KeyboardInterrupt traceback): GNU env blocks SIGINT across the exec, so one that comes
# then stays pending, and catchat's first line (catchat/__init__.py, told by CATCHAT_LAUNCHER_HELD_SIGINT)
# installs its handler and unblocks it: "interrupted", exit 130, nothing lost. Without an env that can
# block (not GNU coreutils >= 8.31) SIGINT is ignored instead (a Ctrl-C in that window is lost, never
# a traceback). A SIGINT ignored already (`nohup`, `cmd &` in a script) is left so: bash's `trap -p INT`
# shows it.
if env --block-signal=INT true 2>/dev/null; then
    hold='export CATCHAT_LAUNCHER_HELD_SIGINT=blocked; exec env --block-signal=INT'
else
    hold="trap '' INT; export CATCHAT_LAUNCHER_HELD_SIGINT=ignored; exec"
fi
{
    printf '#!/usr/bin/env bash\n%s\n' "$marker"
    printf '# Ctrl-C is held while Python starts, until catchat takes it (docs/reliability.md, Ctrl-C while a command starts)\n'
    printf 'if [ -z "$(trap -p INT)" ]; then %s "%s/.venv/bin/catchat" "$@"; fi\n' "$hold" "$root"
    printf 'exec "%s/.venv/bin/catchat" "$@"\n' "$root"
} > "$tmp"
chmod 755 "$tmp" && mv "$tmp" "$target"
if [ -n "$previous" ] && [ "$previous" != "$root" ]; then
    echo "launcher: $target now runs $root (it ran $previous)"
fi
case ":$PATH:" in
    *":$bin:"*) echo "launcher: \`catchat\` on PATH ($target -> $root/.venv/bin/catchat)" ;;
    *) echo "launcher: $target installed, but $bin is not on PATH: add it (export PATH=\"$bin:\$PATH\")" ;;
esac
