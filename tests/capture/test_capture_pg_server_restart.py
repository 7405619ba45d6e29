"""The PostgreSQL server restarted in the middle of a capture (issue 67): the capture stops with
one `changelake: error:` line naming the server and saying what to do, exit status 2, nothing
half-written; run again, it resumes (from the slot, or with `--create-slot` from a snapshot
that did not finish) and holds what the database holds: nothing lost, nothing doubled.

A server restart had been "internal error: DatabaseError: no COPY in progress (a bug ...)"
(`pg_ctl stop -m fast`: the walsender ends the stream) or "... PGRES_COPY_BOTH and no message
from the libpq" (`-m immediate`, as a crash).

The server is one of this module's own, not the session's (`conftest.postgres`): it is stopped
and started again under the capture. The capture writes Materialize CDC logs (`--out`, no
Spark; into a lake in the slow tier): the error is the capture loop's (`capture.Capture.run`),
whatever its sink. The workload is `pg_workload`'s (TOAST, streamed and rolled-back
transactions, a truncate)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from changelake.capture.postgres.capture import Capture, CaptureOptions
from changelake.capture.postgres.server import EmbeddedPostgres
from changelake.capture.postgres.source import SourceError
from changelake.capture.postgres.to_log import LogSink
from tests.support.pg_workload import (
    PUBLICATION,
    TABLES,
    Captured,
    Workload,
    capture_command,
    database_rows,
    lake_destination,
    out_destination,
    slot_position,
)


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedPostgres]:
    """A server of this module's, restarted by its tests (its folder outside pytest's private
    temporary root, as `conftest.postgres`'s)."""
    root = Path(tempfile.mkdtemp(prefix="changelake-test-pg-restart-"))
    started = EmbeddedPostgres(root).start()
    yield started
    started.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dsn(server: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    name = "r_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:50]
    admin = psycopg2.connect(server.dsn)
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    return server.dsn_for(name)


def restart(server: EmbeddedPostgres, mode: str) -> None:
    server.stop(mode)
    server.start()  # on the same port: the DSN the capture was given names it again


def wait_for(condition, proc: subprocess.Popen | None = None, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert proc is None or proc.poll() is None, "the capture ended before its restart"
        assert time.monotonic() < end, "no such moment within the timeout"
        time.sleep(0.05)


def assert_holds_the_database(captured: Captured, dsn: str, slot: str) -> None:
    expected = database_rows(dsn)
    for name in TABLES:
        got = captured.rows[name]
        assert got == expected[name], (name, f"missing {expected[name] - got}",
                                       f"doubled or extra {got - expected[name]}")
    confirmed = slot_position(dsn, slot)
    assert confirmed is not None and confirmed <= captured.frontier


def assert_nothing_half_written(out: Path) -> None:
    """No segment under its temporary name (every file of a log is whole), no lake table's
    snapshot staging, no start marker: nothing the next run must clean up."""
    assert not list(out.glob("*/.*.tmp")), sorted(out.rglob("*"))
    assert not list(out.glob("tables/*/*/_snapshot_stage")), sorted(out.rglob("*"))


@pytest.mark.parametrize(("mode", "into"), [
    ("fast", "out"),  # what a restart by an administrator or a service manager does
    pytest.param("immediate", "out", marks=pytest.mark.slow),  # as a crash of the server
    pytest.param("fast", "lake", marks=pytest.mark.slow),  # two Spark processes
])
def test_a_restart_while_streaming_is_one_line_and_the_rerun_resumes(
        server: EmbeddedPostgres, dsn: str, tmp_path: Path, mode: str, into: str) -> None:
    slot = "restarted"
    out = tmp_path / into
    destination = out_destination(out, dsn) if into == "out" else lake_destination(out)
    workload = Workload(dsn, 67, steps=60, pause=0.02)
    workload.setup()
    # Runs on (no idle stop within the test): only the restart ends it.
    command = capture_command(dsn, destination, slot, until_idle=600)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        wait_for(lambda: slot_position(dsn, slot) is not None, proc, 600)  # slot made
        first = slot_position(dsn, slot)
        workload.start()
        # Mid-stream: a batch of the workload's is committed and confirmed, more to come.
        wait_for(lambda: slot_position(dsn, slot) != first and workload.done >= 10, proc, 600)
        restart(server, mode)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    workload.join()
    if workload.error is not None:  # the restart ended its session too
        assert isinstance(workload.error, psycopg2.Error), workload.error

    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2, err.decode()[-3000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"changelake: error: the connection to PostgreSQL (host=127.0.0.1 "
                               f"port={server.port} user=postgres dbname="), lines[0]
    assert lines[0].endswith("once the server is up, run the same command again: it resumes "
                             f"from slot '{slot}', with nothing lost or taken twice"), lines[0]
    assert_nothing_half_written(out)
    assert not list(out.glob(".*.starting")) and not list(out.glob("capture/*.starting"))

    workload.error = None
    workload.run()  # more transactions while no capture runs: the rerun takes them from the slot
    assert workload.error is None, workload.error
    captured = destination.finish(capture_command(dsn, destination, slot, until_idle=3))
    assert_holds_the_database(captured, dsn, slot)


class RestartMidSnapshot(LogSink):
    """A log sink whose server restarts once, after the first table's snapshot is written
    and before the second's is read: the slot's exported snapshot dies with the replication
    connection that made it."""

    server: EmbeddedPostgres

    def _start(self, source, slot, tables, **how) -> None:  # type: ignore[no-untyped-def]
        for i, item in enumerate(tables.items()):
            if i == 1:
                restart(self.server, "fast")
            super()._start(source, slot, dict([item]), **how)


def test_a_restart_during_the_initial_snapshot_says_take_it_again(
        server: EmbeddedPostgres, dsn: str, tmp_path: Path) -> None:
    slot = "snapshot_restarted"
    out = tmp_path / "out"
    workload = Workload(dsn, 68, steps=30, pause=0.01)
    workload.setup()
    options = CaptureOptions(dsn, PUBLICATION, slot, create_slot=True, until_idle=1)
    sink = RestartMidSnapshot(out, options)
    sink.server = server
    with pytest.raises(SourceError) as refused:
        Capture(sink, options).run()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"the connection to PostgreSQL (host=127.0.0.1 port={server.port} "
                              "user=postgres dbname="), message
    assert message.endswith("once the server is up, run the capture again with --create-slot: "
                            "its initial snapshot did not finish and is taken again"), message
    assert_nothing_half_written(out)
    assert list(out.glob(".*.starting"))  # the rerun knows the start did not finish

    workload.run()
    assert workload.error is None, workload.error
    destination = out_destination(out, dsn)
    captured = destination.finish(capture_command(dsn, destination, slot, until_idle=3))
    assert_holds_the_database(captured, dsn, slot)
    assert not list(out.glob(".*.starting"))
