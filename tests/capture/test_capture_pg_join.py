"""Tables added to the publication after a capture started join it with a snapshot of their own
(a temporary slot's), while transfers keep running: no gap and no overlap between that snapshot
and the stream, into logs and into lake tables; the history of a joined table starts just
before the temporary slot's consistent point (AS OF an earlier time is refused in the lake);
a capture stopped while tables join takes their snapshot again on the restart."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from changelake.capture.postgres.capture import Capture, CaptureOptions
from changelake.capture.postgres.consistency import database_as_of
from changelake.capture.postgres.rows import Table
from changelake.capture.postgres.source import Slot, Source
from changelake.capture.postgres.to_lake import LakeCapture
from changelake.capture.postgres.to_log import LogSink
from changelake.lake.catalog import Lake
from changelake.lake.sources import ConsistencyError
from tests.capture.test_capture_pg_lake import ACCOUNTS, OPENING, Transfers, check_invariant, rows
from tests.capture.test_capture_pg_lake import database as lake_database
from tests.capture.test_capture_pg_log import database as log_database
from tests.capture.test_capture_pg_log import decoded, plain, segments
from tests.support.postgres import execute

BANK = ("CREATE TABLE accounts (id int PRIMARY KEY, balance numeric(12,2) NOT NULL, note text)",
        "CREATE TABLE ledger (id bigserial PRIMARY KEY, src int, dst int, "
        "amount numeric(12,2))",
        "CREATE TABLE audit (id int PRIMARY KEY, what text)",
        f"INSERT INTO accounts SELECT g, {OPENING}, 'open' FROM generate_series(1, {ACCOUNTS}) g",
        "INSERT INTO audit VALUES (1, 'opened')",
        "CREATE PUBLICATION bank FOR TABLE accounts")
ADD = ("ALTER PUBLICATION bank ADD TABLE ledger, audit",
       # committed after the tables joined the publication and before the capture runs again:
       # the stream re-sends it and the joining tables' snapshot holds it, so it must count once
       "UPDATE audit SET what = 'audited' WHERE id = 1")
TABLES = ("public.accounts", "public.audit", "public.ledger")


def _runs(dsn: str, run, seed: int) -> tuple[list, Transfers]:
    """The capture started with `accounts` only, then run again (with transfers going on) after
    `ledger` and `audit` joined the publication, then once more to idle."""
    writer = Transfers(dsn, seed=seed, pause=0.01)
    writer.start()
    try:
        reports = [run(create_slot=True, max_txns=10)]
        execute(dsn, *ADD)
        reports.append(run(max_txns=20))
    finally:
        writer.stop.set()
        writer.join()
    execute(dsn, "INSERT INTO audit VALUES (2, 'closed')")
    reports.append(run(until_idle=1.0))
    return reports, writer


def _options(dsn: str, **kw) -> CaptureOptions:
    # One batch a run (each lake commit is a Spark job per table); the times are still one
    # per transaction.
    return CaptureOptions(dsn, "bank", "join_slot", batch_seconds=60.0, **kw)


def test_tables_added_to_the_publication_join_a_log_capture(pg_dsn: str, tmp_path: Path) -> None:
    execute(pg_dsn, *BANK)
    out = tmp_path / "out"

    def run(**kw):
        options = _options(pg_dsn, **kw)
        return Capture(LogSink(out, options), options).run()

    reports, _ = _runs(pg_dsn, run, seed=11)
    assert reports[0].tables == ("public.accounts",) and reports[0].joined == ()
    assert reports[1].joined == ("public.audit", "public.ledger")
    assert reports[2].joined == ()
    columns = {"public.accounts": ("id", "balance", "note"), "public.audit": ("id", "what"),
               "public.ledger": ("id", "src", "dst", "amount")}
    for name in TABLES:
        state, frontier = decoded(out / name, columns[name])
        assert state == plain(log_database(pg_dsn, name)), name
        assert frontier == [reports[2].frontier], name
    # A joined log's first segment is [0, C): its snapshot's rows, all at C - 1.
    lower, upper = segments(out / "public.audit")[0]
    assert lower == 0 and upper > segments(out / "public.accounts")[0][1]
    first = min((out / "public.audit").iterdir())
    assert decoded(first, columns["public.audit"]) == (Counter({(1, "audited"): 1}), [upper])


class _StopsWhileJoining(LogSink):
    """Crashes (raises) once the first joining table holds its snapshot."""

    def join(self, source: Source, snapshot: Slot, tables: dict[str, Table]) -> None:
        first = dict(list(tables.items())[:1])
        super().join(source, snapshot, first)
        raise RuntimeError("stopped while tables join")


def test_a_capture_stopped_while_tables_join_joins_them_again(pg_dsn: str,
                                                                tmp_path: Path) -> None:
    execute(pg_dsn, *BANK)
    out = tmp_path / "out"
    options = _options(pg_dsn, create_slot=True, until_idle=0.2)
    Capture(LogSink(out, options), options).run()
    execute(pg_dsn, *ADD)
    options = _options(pg_dsn, until_idle=0.2)
    with pytest.raises(RuntimeError, match="stopped while tables join"):
        Capture(_StopsWhileJoining(out, options), options).run()
    marker = next(out.glob(".*.joining"))
    assert marker.read_text().split() == ["public.audit", "public.ledger"]
    assert segments(out / "public.audit")  # the first one holds its snapshot
    execute(pg_dsn, "UPDATE audit SET what = 'again' WHERE id = 1",
            "INSERT INTO ledger (src, dst, amount) VALUES (1, 2, 0.5)")
    again = Capture(LogSink(out, options), options).run()
    assert again.joined == ("public.audit", "public.ledger")
    assert not marker.exists()
    assert decoded(out / "public.audit", ("id", "what"))[0] == Counter({(1, "again"): 1})
    assert decoded(out / "public.ledger", ("id", "src", "dst", "amount"))[0] == \
        plain(log_database(pg_dsn, "public.ledger"))


def test_tables_added_to_the_publication_join_a_lake_capture(
        spark, pg_dsn: str, tmp_path: Path, no_public_views: None) -> None:
    execute(pg_dsn, *BANK)
    lake = Lake(spark, tmp_path / "lake")
    reports, _ = _runs(pg_dsn, lambda **kw: LakeCapture(lake, _options(pg_dsn, **kw)).run(),
                       seed=12)
    assert reports[1].joined == ("public.audit", "public.ledger")
    for name in TABLES:
        assert rows(lake.table(name).current()) == lake_database(pg_dsn, name), name
    joined_at = lake.table("public.ledger").state().since
    assert lake.table("public.audit").state().since == joined_at
    assert lake.table("public.accounts").state().since == 0
    frontier = reports[2].frontier
    assert frontier is not None and joined_at < frontier
    times = sorted({r["_time"] for r in lake.table("public.ledger").updates().collect()})
    assert times[0] == joined_at  # the snapshot's rows
    database = lake.table("public.accounts").state().origin.name
    for time in [joined_at, times[len(times) // 2], frontier - 1]:
        check_invariant(lake, time)
        assert set(database_as_of(lake, database, time)) == set(TABLES)
    with pytest.raises(ConsistencyError, match="before the since of its tables"):
        database_as_of(lake, database, joined_at - 1)
