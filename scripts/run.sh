#!/usr/bin/env bash
# Set up .venv and launch the workbench on the embedded default model (http://127.0.0.1:7860).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python app.py "$@"
