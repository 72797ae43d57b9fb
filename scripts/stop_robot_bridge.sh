#!/usr/bin/env bash
cd "$(dirname "$0")/.." && exec .venv/bin/parfusion down --only bridge "$@"
