#!/usr/bin/env bash
# Create .venv at the repo root and install draftscope. Usage: [DRAFTSCOPE_ACCEL=tpu|gpu] scripts/setup.sh [dev]
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
case "${DRAFTSCOPE_ACCEL:-cpu}" in
  cpu) ;;
  tpu|gpu) .venv/bin/python -m pip install -q --disable-pip-version-check -r "requirements-${DRAFTSCOPE_ACCEL}.txt" ;;
  *) echo "DRAFTSCOPE_ACCEL must be cpu, tpu or gpu, got '${DRAFTSCOPE_ACCEL}'" >&2; exit 2 ;;
esac
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
