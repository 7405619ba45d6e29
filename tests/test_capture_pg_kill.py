"""kill -9 of `changelake capture postgres --lake` at seeded random points while a workload
runs (see `pg_workload.py`): after the restarts and a last run to idle, every lake table equals
its PostgreSQL table and the slot is not confirmed past the lake's frontier.

Each seed is a fresh database (with its slot) of the session's server and a fresh lake. A CLI
process costs a Spark start-up (~10 s), so the default run has two seeds and the slow tier
twenty more."""

from __future__ import annotations

import pytest

from pg_workload import kill_and_check, lake_destination

DEFAULT = [1, 2]
SLOW = list(range(3, 23))


def _kill(pg_dsn: str, tmp_path, seed: int) -> None:
    kill_and_check(pg_dsn, seed, lake_destination(tmp_path / "lake"), tmp_path)


@pytest.mark.parametrize("seed", DEFAULT)
def test_kill_capture(pg_dsn: str, tmp_path, seed: int) -> None:
    _kill(pg_dsn, tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW)
def test_kill_capture_slow(pg_dsn: str, tmp_path, seed: int) -> None:
    _kill(pg_dsn, tmp_path, seed)
