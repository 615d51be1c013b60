#!/usr/bin/env bash
# Create .venv at the repo root and install draftscope. Usage: scripts/setup.sh [dev]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
if [ "${1:-}" = dev ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
else
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
