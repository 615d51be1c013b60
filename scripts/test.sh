#!/usr/bin/env bash
# Set up .venv with the development extras (and Debian chromium for the browser test), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: browser tests will skip (under CI=true the run fails)"
  else
    echo "chromium missing and not root: browser tests will skip (under CI=true the run fails)"
  fi
fi
# under CI=true the test run itself refuses to start with chromium, torch or transformers missing (tests/conftest.py)
# two workers (pytest-xdist), each test file on one of them, so module fixtures (an app server) start once
exec .venv/bin/python -m pytest -q -rs --durations=20 -n 2 --dist loadfile "$@"
