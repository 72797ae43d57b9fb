#!/usr/bin/env bash
# GPU co-run benchmark (opt-in): refuses unless NVML shows a candidate GPU idle. Usage: scripts/run_gpu_corun.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.." && exec .venv/bin/parfusion bench gpu-corun --seconds "${1:-30}"
