#!/usr/bin/env bash
# The linters exactly as CI runs them (.ci/run calls this), so a local run checks the same paths.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "---- ruff"
ruff check src tests benchmarks scripts setup.py
ruff format --check src tests benchmarks scripts setup.py
echo "---- mypy (the library, then the tests; both strict)"
mypy
mypy tests
echo "---- cython-lint"
cython-lint cython/
