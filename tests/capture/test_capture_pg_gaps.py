"""A restart resumes no earlier than the slot's confirmed position, so a table whose frontier
is behind it has missed transactions: the capture refuses it, naming it, instead of streaming
on with a gap in its history (`capture._check_continuous`). Three ways a table falls behind:
a run whose `--tables` left it out, a time out of the publication, a slot dropped and made
again under its name. And the slot is confirmed only up to the tables' frontier, never to the
end of the last commit record, so a table that received everything is never behind. Into
Materialize CDC logs (`--out`): no Spark; the check is the capture loop's, whatever the sink."""

from __future__ import annotations

from pathlib import Path

import pytest

from changelake.capture.postgres.capture import Capture, CaptureOptions
from changelake.capture.postgres.source import SourceError
from changelake.capture.postgres.to_log import LogSink
from tests.capture.test_capture_pg_log import decoded, slot_confirmed
from tests.support.pg_workload import drop_slot
from tests.support.postgres import execute

SLOT = "gaps"


def run(dsn: str, out: Path, **kw) -> None:
    options = CaptureOptions(dsn, "p", SLOT, until_idle=0.3, heartbeat_seconds=0.2, **kw)
    Capture(LogSink(out, options), options).run()


def ids(out: Path, table: str) -> list[int]:
    rows, _ = decoded(out / table, ("id",))
    return sorted(row[0] for row, n in rows.items() for _ in range(n))


@pytest.fixture
def two(pg_dsn: str) -> str:
    execute(pg_dsn, "CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
            "CREATE PUBLICATION p FOR TABLE a, b")
    return pg_dsn


REFUSED = r"tables public\.b stopped before slot 'gaps'\'s confirmed position .*: the slot " \
    r"streamed on without them .* their history would have a gap"


def test_a_table_left_out_of_a_run_is_refused_when_it_comes_back(two: str, tmp_path) -> None:
    out = tmp_path / "out"
    run(two, out, create_slot=True)
    execute(two, "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)")
    run(two, out, tables=("public.a",))  # b's insert is streamed past, not into b's log
    execute(two, "INSERT INTO a VALUES (2)", "INSERT INTO b VALUES (2)")
    with pytest.raises(SourceError, match=REFUSED):
        run(two, out)
    assert ids(out, "public.a") == [1] and ids(out, "public.b") == []  # nothing written
    run(two, out, tables=("public.a",))  # the table that has everything goes on
    assert ids(out, "public.a") == [1, 2]


def test_a_table_out_of_the_publication_for_a_while_is_refused(two: str, tmp_path) -> None:
    out = tmp_path / "out"
    run(two, out, create_slot=True)
    execute(two, "ALTER PUBLICATION p DROP TABLE b", "INSERT INTO a VALUES (1)",
            "INSERT INTO b VALUES (1)")  # never sent: b is not published
    run(two, out)
    execute(two, "ALTER PUBLICATION p ADD TABLE b", "INSERT INTO b VALUES (2)")
    with pytest.raises(SourceError, match=REFUSED):
        run(two, out)
    assert ids(out, "public.b") == []


def test_a_slot_made_again_under_its_name_is_refused(two: str, tmp_path) -> None:
    out = tmp_path / "out"
    run(two, out, create_slot=True)
    execute(two, "INSERT INTO b VALUES (1)")
    drop_slot(two, SLOT)
    execute(two, "INSERT INTO b VALUES (2)",  # in no slot's stream
            f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
    with pytest.raises(SourceError, match=r"tables public\.a, public\.b stopped before slot "
                                          r"'gaps'\'s confirmed position"):
        run(two, out)
    assert ids(out, "public.b") == []


def test_the_slot_is_confirmed_to_the_frontier_so_every_restart_goes_on(two: str,
                                                                        tmp_path) -> None:
    out = tmp_path / "out"
    run(two, out, create_slot=True)
    for i in range(1, 4):
        execute(two, f"INSERT INTO a VALUES ({i})", f"INSERT INTO b VALUES ({i})")
        run(two, out, max_txns=2)  # stops right after a batch's commit: no heartbeat after
        _, frontier = decoded(out / "public.b", ("id",))
        assert slot_confirmed(two, SLOT) <= frontier[0]
    assert ids(out, "public.a") == ids(out, "public.b") == [1, 2, 3]
