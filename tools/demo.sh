#!/usr/bin/env bash
# `make demo`: the main job end to end on whatever Vulkan device is here (lavapipe on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/catchat doctor
