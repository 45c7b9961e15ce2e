"""What every multi-process benchmark does to start itself: `hasten launch` on 2 processes, one thread each."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launch_self(script: str, *args: str, launch_args: tuple[str, ...] = (), check: bool = False,
                env: dict[str, str] | None = None) -> int:
    """Run `script` with `args` in 2 processes through `hasten launch` (extra `env` on top); returns the exit status."""
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", *launch_args,
               str(Path(script).resolve()), *args]
    return subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, cwd=ROOT, check=check).returncode
