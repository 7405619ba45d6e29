"""When the capture loop ends a batch (`capture.Capture._stream`), on a scripted stream and a
clock of its own (no server, no Spark): `batch_seconds` counts from the last commit's start
once the stream has caught up with what the server held when the batch became due, and at
the latest from the commit's end. And on the embedded PostgreSQL: the stream's caught-up
marker (after a caller that spent a while on it, the transactions that arrived meanwhile come
next, not an `Idle` that would say the database was quiet), and the walsender's position."""

from __future__ import annotations

import time
from contextlib import contextmanager
from types import SimpleNamespace

import psycopg2

from changelake.capture.postgres import capture as capture_module
from changelake.capture.postgres.capture import Capture, CaptureOptions, CaptureReport
from changelake.capture.postgres.source import CAUGHT_UP, Idle, Source
from changelake.capture.postgres.transactions import Transaction

COMMIT_SECONDS = 3.0  # longer than the batch's 2 s


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class Spool:
    """A transaction's changes as far as the loop counts them: one change of 100 bytes."""

    bytes = 100

    def __len__(self) -> int:
        return 1


def tx(xid: int) -> Transaction:
    return Transaction(xid, commit_lsn=100 * xid, end_lsn=100 * xid + 50, commit_time=0,
                       origin=None, spool=Spool())  # type: ignore[arg-type]


class ScriptedSource:
    """Yields the scripted `(at, event)`s, the clock moved to `at` first (never back). The
    server's WAL holds each transaction from its `at` on, or from `committed[xid]` (earlier:
    the walsender is behind); the stream has read up to the last transaction yielded."""

    def __init__(self, clock: Clock, script: list, committed: dict[int, float]) -> None:
        self.clock, self.script, self.committed = clock, script, committed
        self.caught_up, self.read = None, 0

    def stream(self, resume: int, *, memory_limit: int, caught_up: bool = False):
        self.caught_up = caught_up
        for at, event in self.script:
            self.clock.now = max(self.clock.now, at)
            if isinstance(event, Transaction):
                self.read = event.end_lsn
            if event is not CAUGHT_UP or caught_up:
                yield event

    def flushed(self) -> int:
        return max((e.end_lsn for at, e in self.script if isinstance(e, Transaction)
                    and self.committed.get(e.xid, at) <= self.clock.now), default=0)

    def received_through(self, lsn: int) -> bool:
        return self.read >= lsn

    @contextmanager
    def keepalive(self):
        yield

    def confirm(self, lsn: int) -> None:
        pass


class Sink:
    report = CaptureReport()

    def frontiers(self, tables):
        return {name: 0 for name in tables}

    def fetch(self, table, keys):
        return []

    def check_change(self, old, new):
        pass


def commits(monkeypatch, script: list, seconds: float = COMMIT_SECONDS,
            committed: dict[int, float] | None = None) -> list[tuple[float, list[int]]]:
    """When each batch was committed and its transactions, a commit taking `seconds`."""
    clock = Clock()
    monkeypatch.setattr(capture_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    made: list[tuple[float, list[int]]] = []

    class Recording(Capture):
        def _commit_batch(self, state, tables, batch, lower, upper) -> None:
            made.append((clock.now, [t.xid for t in batch]))
            clock.now += seconds

    source = ScriptedSource(clock, script, committed or {})
    Recording(Sink(), CaptureOptions("", "p", "s", batch_seconds=2.0))._stream(
        source, {"public.t": None}, None)  # type: ignore[arg-type, dict-item]
    assert source.caught_up
    return made


def test_a_batch_ends_once_caught_up_after_a_commit_longer_than_the_batch_time(monkeypatch):
    script = [
        (0.0, tx(1)), (0.1, CAUGHT_UP),  # not due yet
        (2.5, tx(2)),  # due: 2 s since the stream started; committed until 5.5
        (5.5, tx(3)), (5.5, tx(4)),  # arrived during that commit, read after it: 3 s since
        (6.0, tx(5)),  # that commit began, the batch is due once both are read, not tx 5
    ]
    assert commits(monkeypatch, script) == [(2.5, [1, 2]), (5.5, [3, 4]), (8.5, [5])]


def test_what_arrived_during_a_commit_is_read_before_the_next(monkeypatch):
    """Due by the commit's start, the batch still waits until the stream has read what the
    server held then: a socket read empty while the walsender has more to send (it stopped
    at a full socket during the commit) is not the end of the batch."""
    script = [
        (0.0, tx(1)), (2.0, tx(2)),  # committed at 2.0 until 5.0
        (5.0, tx(3)), (5.0, CAUGHT_UP),  # the socket's share read: more to come
        (5.05, tx(4)), (5.1, tx(5)), (5.1, CAUGHT_UP),
    ]
    committed = {3: 3.0, 4: 4.0, 5: 4.5}
    assert commits(monkeypatch, script, committed=committed) == [(2.0, [1, 2]),
                                                                  (5.1, [3, 4, 5])]


def test_without_catching_up_a_batch_ends_the_batch_time_after_the_last_commit(monkeypatch):
    script = [
        (0.0, tx(1)), (2.0, tx(2)),  # committed at 2.0 until 5.0
        (5.0, tx(3)), (6.0, tx(4)),  # a stream slower than the server: never caught up
        (7.0, tx(5)),  # 2 s after the commit's end: due
        (8.0, tx(6)),
    ]
    committed = {3: 4.0, 4: 4.0, 5: 4.0, 6: 4.0}
    assert commits(monkeypatch, script, committed=committed) == [(2.0, [1, 2]),
                                                                  (7.0, [3, 4, 5]),
                                                                  (10.0, [6])]


def test_a_short_commit_leaves_the_batch_time_from_its_start(monkeypatch):
    """A commit shorter than the batch time: the next is due the batch time after it began,
    not after it ended (was: 2 s + the commit's time apart)."""
    script = [
        (0.0, tx(1)), (2.0, tx(2)),  # committed at 2.0 until 2.5
        (2.6, tx(3)), (3.0, CAUGHT_UP),  # 1 s since it began: not due
        (4.1, CAUGHT_UP),  # 2.1 s since it began (1.6 s since it ended): due
        (4.2, Idle(1000)),
    ]
    assert commits(monkeypatch, script, seconds=0.5) == [(2.0, [1, 2]), (4.1, [3])]


def published_table(dsn: str):
    """An autocommit connection to `dsn`, whose table `t (id int PRIMARY KEY)` is in the
    publication `p`."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY)")
        c.execute("CREATE PUBLICATION p FOR TABLE t")
    return conn


def test_after_a_long_wait_at_caught_up_what_arrived_meanwhile_comes_first(pg_dsn) -> None:
    conn = published_table(pg_dsn)
    with conn.cursor() as c:
        c.execute("INSERT INTO t VALUES (1)")
    with Source(pg_dsn, "p", "caught") as source:
        slot = source.open_slot(create=True)
        with conn.cursor() as c:
            c.execute("INSERT INTO t VALUES (2)")
        events = source.stream(slot.consistent_point, idle_every=0.5, caught_up=True)
        first = next(e for e in events if isinstance(e, Transaction))
        assert next(events) is CAUGHT_UP  # nothing more to read now
        # The caller commits for longer than `idle_every` while two transactions arrive.
        with conn.cursor() as c:
            c.execute("INSERT INTO t VALUES (3)")
            c.execute("INSERT INTO t VALUES (4)")
        time.sleep(1.5)
        after = []
        for event in events:
            if isinstance(event, Idle):
                break
            if isinstance(event, Transaction):
                after.append(event.commit_lsn)
                event.spool.close()
        first.spool.close()
    conn.close()
    assert len(after) == 2 and first.commit_lsn < after[0] < after[1]


def test_the_stream_knows_when_it_has_read_what_the_server_flushed(pg_dsn) -> None:
    conn = published_table(pg_dsn)
    with Source(pg_dsn, "p", "sent") as source:
        slot = source.open_slot(create=True)
        events = source.stream(slot.consistent_point, idle_every=0.5, caught_up=True)
        next(events)  # streaming
        with conn.cursor() as c:
            c.execute("INSERT INTO t VALUES (1)")
        flushed = source.flushed()
        assert flushed is not None and flushed > slot.consistent_point
        assert not source.received_through(flushed)
        received = []
        deadline = time.monotonic() + 30
        while not source.received_through(flushed):  # the transaction, or a keepalive
            assert time.monotonic() < deadline
            event = next(events)
            if isinstance(event, Transaction):
                received.append(event.commit_lsn)
                event.spool.close()
        assert len(received) == 1 and received[0] < flushed
    conn.close()
