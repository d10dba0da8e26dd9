#!/usr/bin/env bash
# Set up the venv ($BENCH_STUDIO_VENV, default .venv) with the test tools if needed, lint the tree (scripts/lint.sh)
# and run the whole test suite (extra args go to pytest).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev || exit 1
scripts/lint.sh || { echo "test: lint failed, so pytest did not run (fix the findings above)" >&2; exit 1; }
"${BENCH_STUDIO_VENV:-.venv}/bin/python" -m pytest "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no test for these arguments: nothing ran." >&2
  exit 0
fi
exit "$status"
