#!/usr/bin/env bash
cd "$(dirname "$0")/.." && make -s install && exec .venv/bin/parfusion up --detach --only bridge "$@"
