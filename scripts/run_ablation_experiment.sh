#!/bin/sh
# ablation experiment on the modeled node: run_ablation_experiment.sh N [SEED] (N simulated seconds, default 60).
exec "$(dirname "$0")/../.venv/bin/parfusion" experiment ablation --seconds "${1:-60}" --seed "${2:-1}"
