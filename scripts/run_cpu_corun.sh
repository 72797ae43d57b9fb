#!/usr/bin/env bash
# Real CPU co-run benchmark for N seconds of measuring budget (smoke profile unless PROFILE=full).
exec "$(dirname "$0")/../.venv/bin/parfusion" bench cpu-corun --seconds "${1:-150}" --profile "${PROFILE:-smoke}" "${@:2}"
