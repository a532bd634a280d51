#!/usr/bin/env bash
# `make demo`: the main job end to end on whatever Vulkan device is here (lavapipe on a CPU):
# check the device, train configs/tiny.toml on the built-in Shakespeare for 170 s of wall clock
# (--time-budget: the schedule is planned on this machine's measured speed, so a slow machine trains
# fewer steps instead of taking longer), score the whole held-out split, plot, and sample. Running it
# again continues the same run where its budget allows (or re-scores and re-samples it).
set -euo pipefail
cd "$(dirname "$0")/.."
run=runs/tiny
budget_s=170
cc=.venv/bin/catchat
$cc doctor
echo
echo "=== train: configs/tiny.toml for ${budget_s} s of wall clock, start-up included; then about 2 minutes (2 CPU cores) scoring the held-out split: about 5 minutes in all ==="
if [ -f "$run/checkpoints/latest" ]; then
    $cc train configs/tiny.toml --run-dir "$run" --resume
else
    $cc train configs/tiny.toml --run-dir "$run" --time-budget "$budget_s"
fi
echo
echo "=== eval: the whole held-out split (34 scenes the model never trained on) ==="
$cc eval "$run"
$cc plot "$run" || true   # plots are optional (matplotlib); the run is what matters
echo
echo "=== sample (temperature 0.8, seed 1) ==="
$cc sample "$run" --speaker ROMEO --prompt "" --length 400 --temperature 0.8 --seed 1
