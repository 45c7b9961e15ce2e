#!/usr/bin/env bash
# Set up hasten in the current Python environment: `setup.sh demo` installs what the demo needs (hasten,
# scikit-learn for the digits); `setup.sh test` (the default) installs the test extra (the engines, trackers,
# libraries and Accelerate itself that the tests run against) and Open MPI.
# Installs the CPU build of torch first, and only when no torch is importable:
# letting pip resolve a bare `torch` would download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHAT=${1:-test}
case "$WHAT" in
    demo) EXTRA=demo ;;
    test) EXTRA=test ;;
    *) echo "setup.sh: say what to set up: demo or test (got '$WHAT')" >&2; exit 2 ;;
esac

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"hasten needs Python >= 3.10, this is {sys.version.split()[0]}; set PYTHON=/path/to/python3.10+")
PY

if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "setup: using the installed torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
else
    echo "setup: no torch found; installing the CPU build torch==2.13.0"
    "$PYTHON" -m pip install --quiet "torch==2.13.0" numpy  # numpy too: torch warns at import without it
fi
# Hold the installed torch: nothing in the extras may replace it (a bare resolve could pull a CUDA build).
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$PYTHON" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' > "$constraints"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -c "$constraints" -e ".[$EXTRA]"
echo "setup: hasten $("$PYTHON" -c 'import hasten; print(hasten.__version__)') installed with the $EXTRA extra"
[ "$WHAT" = demo ] && exit 0

# Open MPI for the `--mpirun` launch mode and its tests (optional: those tests skip without it).
if command -v mpirun >/dev/null 2>&1; then
    echo "setup: using the installed Open MPI ($(mpirun --version 2>/dev/null | head -n 1))"
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    if (export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null 2>&1 \
            && apt-get install -y -qq --no-install-recommends openmpi-bin >/dev/null 2>&1) \
        && command -v mpirun >/dev/null 2>&1; then
        echo "setup: installed Open MPI ($(mpirun --version 2>/dev/null | head -n 1))"
    else
        echo "setup: could not install Open MPI with apt-get; the MPI tests will be skipped"
    fi
else
    echo "setup: no mpirun (and no apt-get as root to install openmpi-bin); the MPI tests will be skipped"
fi
