#!/usr/bin/env bash
# Set up .venv if needed and start the dashboard on http://127.0.0.1:8501.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m streamlit run app.py "$@"
