"""One measurement in a fresh process: run this benchmark's own script with arguments, read its last JSON line.

A fresh process per variant keeps one library's imports, caches and allocator state out of the next one's
figures (see each benchmark's docstring for why it matters there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_json_child(script: str, args: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> dict:
    """`python script *args` with `env` added to this environment; its last stdout line as JSON, or exit with its stderr."""
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
