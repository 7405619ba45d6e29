"""kill -9 of `changelake capture postgres` at seeded random points while a workload runs (see
`pg_workload.py`): after the restarts and a last run to idle, every table the capture holds
equals its PostgreSQL table and the slot is not confirmed past the capture's frontier. Into a
lake (`--lake`) and into Materialize CDC logs (`--out`).

Each seed is a fresh database (with its slot) of the session's server and a fresh lake or
output directory. A `--lake` seed is two to four Spark processes (a minute or more on CI's two
cores), so all three are in the slow tier (seed 10 is the one whose kill at start-up broke the
lake's metastore), with a kill at the one point a random one rarely hits: between two tables'
initial snapshots. `--out` needs no Spark: its seeds are cheaper (about 9 s each on CI), so
the default run has one and the slow tier 11 more."""

from __future__ import annotations

import pytest

from tests.support.pg_workload import kill_and_check, lake_destination, out_destination

DEFAULT = [1]
SLOW = list(range(2, 13))  # 11 seeds, with the 3 --lake ones 14 in the slow tier
SLOW_LAKE = [1, 10, 19]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_LAKE)
def test_kill_capture(pg_dsn: str, tmp_path, seed: int) -> None:
    kill_and_check(pg_dsn, seed, lake_destination(tmp_path / "lake"), tmp_path)


@pytest.mark.slow
def test_kill_between_two_tables_snapshots(pg_dsn: str, tmp_path) -> None:
    """The first table's snapshot is committed, the others' are not, and the slot's exported
    snapshot dies with the process: the restart must take the whole snapshot again."""
    lake = tmp_path / "lake"
    tables = lake / "tables" / "public"

    def half_done() -> None:
        assert (tables / "accounts" / "_state" / "v1.json").exists()
        assert not (tables / "marks" / "_state" / "v1.json").exists()
        assert list((lake / "capture").glob("*.starting"))  # the start is known unfinished

    happened = kill_and_check(pg_dsn, 100, lake_destination(lake), tmp_path,
                              kills=[("snapshot", 0.0)], killed=half_done,
                              when=(tables / "accounts" / "_state" / "v1.json").exists)
    assert happened[0].startswith("killed")
    assert not list((lake / "capture").glob("*.starting"))


@pytest.mark.parametrize("seed", DEFAULT)
def test_kill_capture_out(pg_dsn: str, tmp_path, seed: int) -> None:
    kill_and_check(pg_dsn, seed, out_destination(tmp_path / "out", pg_dsn), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW)
def test_kill_capture_out_slow(pg_dsn: str, tmp_path, seed: int) -> None:
    kill_and_check(pg_dsn, seed, out_destination(tmp_path / "out", pg_dsn), tmp_path)


@pytest.mark.slow
def test_kill_between_two_logs_snapshots(pg_dsn: str, tmp_path) -> None:
    out = tmp_path / "out"

    def first_log_written() -> bool:
        return any((out / "public.accounts").glob("*.avro"))

    def half_done() -> None:
        # Logs are written fast: the kill, sent once the first log is seen, may land after the
        # last one too. Whenever it lands, a start that has not finished is marked so.
        if not any((out / "public.marks").glob("*.avro")):
            assert list(out.glob(".*.starting"))

    happened = kill_and_check(pg_dsn, 100, out_destination(out, pg_dsn), tmp_path,
                              kills=[("snapshot", 0.0)], killed=half_done,
                              when=first_log_written)
    assert happened[0].startswith("killed")
    assert not list(out.glob(".*.starting"))
