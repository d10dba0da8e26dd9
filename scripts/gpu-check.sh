#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): on a lent GPU machine, with .gpu carried, every GPU path within 570 s,
# the report under $OUT. `--dry-run` (here) prints the steps, each command's time limit and their sum.
#   run: command "bash scripts/gpu-check.sh", carry [".gpu"], timeout_s 600    (docs/gpu.md, "Running the check")
cd "$(dirname "$0")/.." || exit 1
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
