#!/usr/bin/env bash
# Set up, then run the whole test-suite (unit + real multi-process tests).
#
# With no arguments (the whole suite), Accelerate's own test suite (scripts/peer_suite.py: 1.16's, with 1.15's
# engine folders, when ../shared/accelerate-1.16-tests is there) runs first, two files at a time;
# tests/test_peer_suite.py reads its report and fails pytest if it found a difference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
PYTHON=${PYTHON:-python3}
# Idle OpenMP threads sleep instead of spinning: the suite runs ~20 processes on the two cores at its busiest, and a
# spinning thread takes a core from a process with work (tests/test_elastic.py alone: 290 CPU-s -> 274, 184 s -> 173 s).
# Only how idle threads wait changes, never a number a test compares.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if [ "$#" -gt 0 ]; then
    exec "$PYTHON" -m pytest -q -p no:cacheprovider "$@"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# First, on its own: run beside pytest (even niced) it slowed the project's multi-process tests
# (pytest took 28-31 min here instead of 22), and a test of the suite that compares the machine's
# free RAM failed when pytest's processes freed memory meanwhile.
"$PYTHON" scripts/peer_suite.py --jobs 2 --report "$work/peer_suite.json" > "$work/peer_suite.log" 2>&1 || true
export HASTEN_PEER_SUITE_REPORT="$work/peer_suite.json"
# Two test files at a time (pytest-xdist, a file stays on one worker with its module fixtures): most of the
# multi-process tests wait (on timeouts, rendezvous, paced steps), so the two cores were about 45 % busy one file at
# a time; the whole suite took 28 min that way and 20 min this way.
exec "$PYTHON" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15
