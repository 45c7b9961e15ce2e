#!/usr/bin/env bash
# Set up, then train the demo CNN on scikit-learn's digits with 2 processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
PYTHON=${PYTHON:-python3}
exec "$PYTHON" -m hasten launch --num_processes 2 examples/cv_example.py "$@"
