#!/usr/bin/env bash
# The test command: set up, then run the default (fast, CPU) suite. Extra args go to pytest,
# e.g. `bash scripts/run_tests.sh -m slow` for the slow target.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
