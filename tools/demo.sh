#!/usr/bin/env bash
# `make demo`: the main job end to end on whatever Vulkan device is here (lavapipe on a CPU):
# check the device, train configs/tiny.toml on the built-in Shakespeare (a few minutes on 2 CPU
# cores), evaluate, plot, and sample. Running it again continues (or re-samples) the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
run=runs/tiny
cc=.venv/bin/catchat
$cc doctor
if [ -f "$run/checkpoints/latest" ]; then
    $cc train configs/tiny.toml --run-dir "$run" --resume
else
    $cc train configs/tiny.toml --run-dir "$run"
fi
$cc plot "$run" || true   # plots are optional (matplotlib); the run is what matters
echo
echo "=== sample (temperature 0.8, seed 1) ==="
$cc sample "$run" --speaker ROMEO --prompt "" --length 400 --temperature 0.8 --seed 1
