"""One launch per (library, script, processes, phase) for the whole session: every test compares records of it."""

from __future__ import annotations

import pytest

from .harness import HASTEN, PEER, Runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("parity"))


__all__ = ["Runs", "runs", "PEER", "HASTEN"]
