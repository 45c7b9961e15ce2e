#!/usr/bin/env bash
# Set up hasten for development in the current Python environment.
# Installs the CPU build of torch first, and only when no torch is importable:
# letting pip resolve a bare `torch` would download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"hasten needs Python >= 3.10, this is {sys.version.split()[0]}; set PYTHON=/path/to/python3.10+")
PY

if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "setup: using the installed torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
else
    echo "setup: no torch found; installing the CPU build torch==2.13.0"
    "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[test]"
echo "setup: hasten $("$PYTHON" -c 'import hasten; print(hasten.__version__)') installed"
