#!/bin/sh
# compare experiment on the modeled node: run_experiment.sh N [SEED] (N simulated seconds, default 60).
exec "$(dirname "$0")/../.venv/bin/parfusion" experiment compare --seconds "${1:-60}" --seed "${2:-1}"
