#!/usr/bin/env bash
# Lint and type-check the tree: ruff check, ruff format --check, mypy on bench_core (settings in pyproject.toml).
# The tools come from the venv ($BENCH_STUDIO_VENV, default .venv; scripts/setup.sh --dev installs them), or from
# $BENCH_STUDIO_LINT_BIN, a folder holding ruff and mypy; mypy reads the project's imports from the venv.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${BENCH_STUDIO_VENV:-.venv}
bin=${BENCH_STUDIO_LINT_BIN:-$venv/bin}
for tool in ruff mypy; do
  [ -x "$bin/$tool" ] || { echo "lint: $bin/$tool is missing: run scripts/setup.sh --dev" >&2; exit 1; }
done
failed=()
"$bin/ruff" check --no-cache . || failed+=("ruff check")
"$bin/ruff" format --no-cache --check . || failed+=("ruff format --check")
"$bin/mypy" --python-executable "$venv/bin/python" || failed+=("mypy")
if [ "${#failed[@]}" -gt 0 ]; then
  echo "lint failed: $(IFS=,; echo "${failed[*]}" | sed 's/,/, /g') (see above; scripts/lint.sh runs them again)" >&2
  exit 1
fi
