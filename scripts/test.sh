#!/usr/bin/env bash
# Set up, then run the whole test-suite (unit + real multi-process tests).
#
# With no arguments (the whole suite), Accelerate's own test suite (scripts/peer_suite.py, when
# ../shared/accelerate-1.15-tests is there) runs beside pytest, one file at a time and niced: the
# project's multi-process tests leave a core idle much of the time (processes starting, waiting for
# each other). tests/test_peer_suite.py reads its report and fails pytest if it found a difference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
PYTHON=${PYTHON:-python3}
if [ "$#" -gt 0 ]; then
    exec "$PYTHON" -m pytest -q -p no:cacheprovider "$@"
fi
work=$(mktemp -d)
# At the lowest priority, so that it takes only the CPU pytest leaves: at the same priority the whole
# pytest run took 31 min here, against 22 min without the suite beside it.
nice -n 19 "$PYTHON" scripts/peer_suite.py --jobs 1 --report "$work/peer_suite.json" > "$work/peer_suite.log" 2>&1 &
beside=$!
trap 'kill "$beside" 2>/dev/null || true; rm -rf "$work"' EXIT
export HASTEN_PEER_SUITE_REPORT="$work/peer_suite.json"
status=0
"$PYTHON" -m pytest -q -p no:cacheprovider --durations=15 || status=$?
wait "$beside" 2>/dev/null || true
exit "$status"
