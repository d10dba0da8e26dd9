#!/usr/bin/env bash
# Build .gpu/ (git-ignored), the files the GPU check carries to the GPU machine, and check it against the manifest
# in scripts/gpu_check.py (what the check needs, each part's declared size, the 64 MiB upload limit).
#   scripts/gpu-carry.sh --recipe ../shared/gpu/make-carry.sh --lmdeploy-repo PATH_TO_LMDEPLOY_CLONE
cd "$(dirname "$0")/.." || exit 1
exec "${PYTHON:-python3}" scripts/gpu_check.py --build-carry "$@"
