"""Bringing Delta tables' `current` up to their commits, and their logs' checkpoints, in a
thread of its own.

A Delta table commits at the append to `updates` (`delta_storage.py`); `current`, what every
other engine reads, follows by a MERGE that is most of a small commit's time. A writer that
commits often (`capture postgres --lake`) would otherwise wait for each MERGE before it reads
its next batch, so a transaction's commit would wait for the MERGE of the batch before it.
With a `CurrentFollower` on the lake (`following`), a Delta table's commit records the version
in `updates` alone and hands `current`'s catch-up to this thread.

The promise: after `flush()` or a clean `close()`, every table committed through the lake holds
in `current` the last version committed (`delta_storage.catch_up`, which applies several
versions in one MERGE; one starts at most every `INTERVAL_SECONDS`); in between, `current`
trails the commit point by the MERGEs still to run, never ahead and always one whole committed
version, as after a crash between a commit and its MERGE (the next catch-up applies what is
missing). The commit point, and so what a source is told (a slot, offsets), does not wait for
it: `current` is derived from `updates`.

It also writes the checkpoints of both tables' logs (`delta_storage.checkpoint_logs`), which
Delta would write inside every tenth commit, a Spark job the commit would wait for. A writer
whose MERGE is better inline (`following(lake, merge=False)`: on two cores a MERGE beside the
writer's jobs slows both, `follow_changefeed.py`) hands this thread the checkpoints alone:
its commits still bring `current` up before they return, and none of them waits for a
checkpoint, or for the read of the log that tells whether one is due.

What it holds: the latest committed state per table still to apply (a newer commit replaces an
older request: one MERGE covers both), and the first error a catch-up or checkpoint raised,
which the next `request`, `flush` or `close` raises in the writer's thread. A catch-up that
fails because another process's commit (which catches up inline) moved `current` to the same
version or past it is no error.

The thread runs its Spark jobs on a session of its own (`SparkSession.newSession`: the same
context, catalog and Delta log cache, its own SQL settings), since `catch_up` sets Delta's
transaction settings for its MERGE, which must not reach the writer's own jobs, and in a
scheduler pool of its own (`POOL`), so that the writer's jobs share the cores with a MERGE in
progress instead of waiting for it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from changelake.durable import SYNC_SLACK_SECONDS
from changelake.lake import delta_storage
from changelake.lake.identifier import TableIdentifier
from changelake.lake.layout import TableState, current_path

INTERVAL_SECONDS = 5.0
"""The least time from the start of one catch-up to the start of the next (unless a flush
waits): a MERGE's cost is mostly fixed, so while commits come faster than that, one MERGE
applies several, and the writer keeps more of the machine."""

POOL = "changelake-current"
"""The Spark scheduler pool of the follower's jobs."""


@dataclass(frozen=True)
class _Request:
    ident: TableIdentifier
    table_dir: Path
    state: TableState


class CurrentFollower:
    """A thread that applies Delta tables' committed versions to their `current` tables
    (unless `merge` is false: their commits do) and writes their logs' checkpoints."""

    def __init__(self, spark: SparkSession, *, interval: float = INTERVAL_SECONDS,
                 merge: bool = True) -> None:
        self._spark = _own_session(spark)
        self._interval = interval
        self.merges = merge
        """Whether this thread brings `current` up (else each commit does, inline)."""
        self._pending: dict[str, _Request] = {}
        self._busy = False
        self._hurry = False  # a flush or close waits: no pause before the next catch-up
        self._closed = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="changelake-current",
                                        daemon=True)
        self._thread.start()

    def request(self, ident: TableIdentifier, table_dir: Path, state: TableState) -> None:
        """Bring `current` of the table at `table_dir` to `state` (just committed), unless
        the commit did, and write the checkpoints due."""
        with self._cond:
            self._raise()
            if self._closed:
                raise RuntimeError("the current follower is closed")
            self._pending[str(table_dir)] = _Request(ident, table_dir, state)
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every requested version is applied; raise what a catch-up raised."""
        with self._cond:
            self._hurry = True
            self._cond.notify_all()
            while (self._pending or self._busy) and self._error is None:
                self._cond.wait()
            self._hurry = False
            self._raise()

    def close(self, *, finish: bool = True) -> None:
        """Stop the thread: with `finish`, after the requested versions are applied (raising
        what a catch-up raised); without, after the catch-up in progress, if any."""
        with self._cond:
            if not finish:
                self._pending.clear()
            self._closed = self._hurry = True
            self._cond.notify_all()
        self._thread.join()
        if finish:
            with self._cond:
                self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        # A pool of its own: the writer's jobs get their share of the cores while a MERGE
        # runs (the session's `spark.scheduler.mode` is FAIR).
        self._spark.sparkContext.setLocalProperty("spark.scheduler.pool", POOL)
        due = time.monotonic()
        while True:
            with self._cond:
                while not self._closed and (not self._pending or (
                        not self._hurry and time.monotonic() < due)):
                    self._cond.wait(None if not self._pending else due - time.monotonic())
                if not self._pending:
                    return
                _, request = self._pending.popitem()
                self._busy = True
                due = time.monotonic() + self._interval
            try:
                self._apply(request)
            except BaseException as error:  # raised in the writer's thread
                with self._cond:
                    self._error = error
                    self._pending.clear()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _apply(self, request: _Request) -> None:
        spark, path = self._spark, current_path(request.table_dir)
        started = time.time() - SYNC_SLACK_SECONDS
        if self.merges:
            try:
                delta_storage.catch_up(spark, request.ident, request.table_dir, request.state)
            except Exception:
                applied = delta_storage.transaction_version(spark, path)
                if applied is None or applied < request.state.version:
                    raise
                return  # another writer's commit caught it up meanwhile
        delta_storage.checkpoint_logs(spark, request.table_dir)
        delta_storage.sync(request.table_dir, started)


def _own_session(spark: SparkSession) -> SparkSession:
    """A session on `spark`'s context with its settings, those set after it was built
    included (a static or core setting the new session refuses is the context's anyway)."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    own = spark.newSession()
    for key, value in spark.conf.getAll.items():
        if own.conf.get(key, None) != value:
            with contextlib.suppress(PySparkException, Py4JJavaError):
                own.conf.set(key, value)
    return own


@contextlib.contextmanager
def following(lake, *, merge: bool = True) -> Iterator[CurrentFollower]:
    """`lake`'s Delta commits leave `current` (unless `merge` is false) and their logs'
    checkpoints to a `CurrentFollower` for the block; at its end `current` is caught up and
    the checkpoints due written (after an error in the block, only the work in progress is
    finished, and the block's error is the one raised)."""
    follower = CurrentFollower(lake.spark, merge=merge)
    lake.current_follower = follower
    try:
        yield follower
    except BaseException:
        lake.current_follower = None
        follower.close(finish=False)
        raise
    lake.current_follower = None
    follower.close()
