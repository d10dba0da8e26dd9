#!/usr/bin/env bash
# Set up the venv ($BENCH_STUDIO_VENV, default .venv) if needed and start the dashboard on
# http://127.0.0.1:8501 (extra args go to `streamlit run`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec "${BENCH_STUDIO_VENV:-.venv}/bin/python" -m streamlit run app.py "$@"
