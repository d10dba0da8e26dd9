#!/usr/bin/env bash
# Create or update the venv ($BENCH_STUDIO_VENV, default .venv) with the CPU install; `--dev` adds the
# test tools. Safe to re-run: a stamp of the requirement files skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=${BENCH_STUDIO_VENV:-.venv}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
files=(requirements.txt requirements-nodeps.txt)
[ "${1:-}" = "--dev" ] && files+=(requirements-dev.txt requirements-cluster.txt requirements-lmdeploy-reference.txt)
stamp="$venv/.installed-$(cat "${files[@]}" | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "Installing into $venv (first time: a few minutes)..."
  "$venv/bin/python" -m pip install -q --upgrade pip
  # PyPI's Linux torch is a CUDA build: 3.4 GB of CUDA libraries and triton that the CPU engine never loads. Take
  # the pinned torch from PyTorch's CPU index first; where that index cannot be reached, pip warns and takes PyPI's.
  # Only torch (--no-deps) asks it: an unreachable extra index costs its retries once per package pip looks up.
  "$venv/bin/python" -m pip install -q --no-deps --extra-index-url https://download.pytorch.org/whl/cpu \
    -c requirements.txt torch
  "$venv/bin/python" -m pip install -q -r requirements.txt
  "$venv/bin/python" -m pip install -q --no-deps -r requirements-nodeps.txt
  if [ "${1:-}" = "--dev" ]; then
    "$venv/bin/python" -m pip install -q -r requirements-dev.txt
    "$venv/bin/python" -m pip install -q --no-deps -r requirements-lmdeploy-reference.txt
  fi
  touch "$stamp"
fi
