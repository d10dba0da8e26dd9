#!/usr/bin/env bash
# Set up the venv ($BENCH_STUDIO_VENV, default .venv) with the test tools if needed, lint the tree (scripts/lint.sh)
# and run the whole test suite, naming its 25 slowest tests (extra args go to pytest). `--fast` (the first
# argument) runs the fast tier instead (-m "not slow": every package, no browser, no long runs; minutes on 2 cores).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --dev || exit 1
scripts/lint.sh || { echo "test: lint failed, so pytest did not run (fix the findings above)" >&2; exit 1; }
tier=()
if [ "${1:-}" = "--fast" ]; then
  shift
  tier=(-m "not slow")
fi
"${BENCH_STUDIO_VENV:-.venv}/bin/python" -m pytest --durations=25 "${tier[@]}" "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no test for these arguments: nothing ran." >&2
  exit 0
fi
exit "$status"
