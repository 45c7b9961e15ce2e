"""What every benchmark does with a figure it prints: append it as one JSON line for `run_all.py`.

`record(section, name, **values)` writes `{"section": ..., "name": ..., **values}` to the file named by
the environment variable HASTEN_BENCH_RESULTS, and does nothing when it is unset (a script run alone).
In a process started by a launcher only global rank 0 records, so a figure is never written twice.
"""

from __future__ import annotations

import json
import math
import os

ENV = "HASTEN_BENCH_RESULTS"


def _plain(value):
    """JSON-safe: NaN/inf become null, tuples lists, anything else unknown its str()."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def record(section: str, name: str, **values) -> None:
    """Append one result line (no-op without HASTEN_BENCH_RESULTS, and on every rank but 0)."""
    path = os.environ.get(ENV)
    if not path or os.environ.get("RANK", "0") != "0":
        return
    line = json.dumps({"section": section, "name": name, **{k: _plain(v) for k, v in values.items()}})
    # one write() of one line with O_APPEND: lines from consecutive scripts never interleave
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
