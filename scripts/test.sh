#!/usr/bin/env bash
# Set up, then run the whole test-suite (unit + real multi-process tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
PYTHON=${PYTHON:-python3}
exec "$PYTHON" -m pytest -q -p no:cacheprovider "$@"
