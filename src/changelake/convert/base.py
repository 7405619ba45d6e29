"""What every conversion of Changes into CDCv2 updates shares: columns, times, the window.

A converter takes `Change`s in arrival order (`push`) and hands out `(data, time, diff)` updates
for the times that the feed has finished (`advance`). Between the two, changes wait in a
*window*: a feed may deliver the events of one time out of order (YDB between barriers, PITFALLS
P20; Debezium across partitions), and a keyed conversion must not decide which value of a key
wins before all events at that time are in (PITFALLS P6). At `advance(frontier)` the waiting
changes at times before the frontier are applied in `(time, sequence, tie-break)` order.

`push` validates everything that can be wrong with one change (and raises `ChangefeedError`
naming its line), so that `advance` never fails: a lenient caller can set a bad change aside
without losing anything accepted before it.

Changes without a time of their own (`time=None`: snapshot rows, YDB records without virtual
timestamps) are placed at the stream's *current time*: the latest time pushed so far, or the
frontier if that is later. For an initial snapshot that is time 0, before every streamed
transaction; for a snapshot repeated mid-stream it is "now", which is what an upsert means.

The times that a sequential reading derives from what came before are also derived on Spark,
with windows over a batch (`changelake.spark.changefeed.python_path`): the parser's time of a
transaction is a column expression here, beside the rule it restates
(`spark_transaction_time`); `time_of` is `changelake.spark.changefeed.times.current_times`.
`tests/convert/test_convert_spark_rules.py` compares both with the Python on generated feeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from changelake.errors import ChangefeedError
from changelake.formats.change import UNCHANGED, Change
from changelake.protocol.messages import Update
from changelake.values import freeze

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(slots=True)
class Stats:
    """Counts of what conversion did besides applying changes, for reports and tests."""

    applied: int = 0
    duplicates: int = 0  # replays: same sequence and same content as what was applied
    stale: int = 0  # older than what the key already has (never resurrects a deleted key)
    ties: int = 0  # same sequence, different content: the larger tie-break wins
    unresolved: int = 0  # UNCHANGED values with no previous value to take (became null)
    ignored: int = 0  # messages, tombstones, ...
    late: int = 0  # duplicates recognised after their time was already finished


@dataclass(slots=True)
class Pending:
    """A validated change waiting in the window."""

    time: int
    sequence: Any
    tiebreak: tuple[Any, ...]
    change: Change
    extra: dict[str, Any] = field(default_factory=dict)

    def order(self) -> tuple[Any, ...]:
        return (self.time, self.sequence, self.tiebreak)


class WindowedConverter:
    """The window and the columns; subclasses decide what a change means."""

    def __init__(self, columns: Sequence[str] | None = None) -> None:
        self.columns: tuple[str, ...] | None = tuple(columns) if columns is not None else None
        #: Columns given (a table schema's, or a batch's decided up front): an image column
        #: beyond them is schema drift. Not given: they grow with the images (`_check_columns`).
        self.fixed_columns = columns is not None
        self.stats = Stats()
        self._frontier = 0
        self._max_time = 0
        self._window: list[Pending] = []

    @property
    def frontier(self) -> int:
        """Times below this are finished: converted and handed out."""
        return self._frontier

    def current_time(self) -> int:
        return max(self._max_time, self._frontier)

    def time_of(self, change: Change) -> int:
        return self.current_time() if change.time is None else change.time

    def push(self, change: Change) -> None:
        raise NotImplementedError

    def is_replay(self, change: Change) -> bool:
        """Was this event (or a newer one for its key) applied already?"""
        raise NotImplementedError

    def advance(self, frontier: int | None) -> list[Update]:
        """Finish every time below `frontier` (None: every time) and return their updates."""
        if frontier is not None and frontier <= self._frontier:
            return []
        ready = [p for p in self._window if frontier is None or p.time < frontier]
        self._window = [p for p in self._window if frontier is not None and p.time >= frontier]
        ready.sort(key=Pending.order)
        out = self._apply(ready)
        if frontier is not None:
            self._frontier = frontier
        else:
            self._frontier = max(self._max_time + 1, self._frontier)
        return out

    def _apply(self, ready: list[Pending]) -> list[Update]:
        raise NotImplementedError

    def _enqueue(self, pending: Pending) -> None:
        self._max_time = max(self._max_time, pending.time)
        self._window.append(pending)

    # ---------------------------------------------------------------------------- columns

    def _check_columns(self, change: Change) -> None:
        """The columns are those of the images in arrival order: the first image's, then each
        column a later image adds (a source's `ALTER TABLE ... ADD COLUMN` while it streams)
        appended where it first appears. A row frozen before a column appeared lacks it: it
        reads null there (`freeze` fills a missing field with None, and a lake table reads an
        added column null in earlier rows). A column a later image lacks (`DROP COLUMN`) stays,
        null in the rows after. Given columns (a table schema's) are fixed: an image column
        beyond them is schema drift, refused at its line."""
        for image in (change.after, change.before):
            if image is None:
                continue
            if self.columns is None:
                self.columns = tuple(image)
                continue
            extra = [c for c in image if c not in self.columns]
            if extra and self.fixed_columns:
                raise ChangefeedError(
                    f"columns {extra} are not among the table's columns {list(self.columns)} "
                    "(schema drift: give a table schema that lists them)", change.origin)
            if extra:
                self.columns = (*self.columns, *extra)

    def freeze_row(self, row: dict[str, Any], columns: Sequence[str]) -> Any:
        if any(row.get(c) is UNCHANGED for c in columns):
            raise AssertionError("UNCHANGED must be resolved before a row is frozen")
        return freeze(row, fields=columns)


# ------------------------------------------------------------------ the same rules on Spark

#: The order a Spark batch is read in: what the files' order is to the sequential encoder.
SPARK_ORDER = ("file", "line")


def spark_transaction_time(time: str = "time", tx: str = "tx", timed: str = "tx_timed",
                           order: Sequence[str] = SPARK_ORDER) -> Column:
    """The time `DebeziumParser` gives each event, over a frame of parsed changes whose
    `timed` column says the parser gave it its transaction's (`Change.tx_timed`): the time of
    the first event so marked of its transaction in `order`; any other event keeps its own.

    The parser gives a MySQL GTID and a PostgreSQL `txId` without `sequence` the time of the
    first of their events it parses (each later one is marked), and every other event its own
    time. On Spark each partition has a parser of its own, so only the first marked event of a
    transaction in the whole batch is sure to carry the time the sequential parser gives them
    all (its own): this takes that event's time for every marked one. The same as the
    encoder's when it is given the files in `order`. An event timed by its own `sequence`
    keeps that time, even where its transaction's events disagree on it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    marked = F.coalesce(F.col(timed), F.lit(False)) & F.col(tx).isNotNull()
    # An unmarked event keeps its time: each is a partition of its own, not one of them all.
    whole = Window.partitionBy(F.when(marked, F.col(tx)),
                               *(F.when(~marked, F.col(c)) for c in order)).orderBy(*order) \
        .rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    first = F.first(F.when(marked, F.col(time)), ignorenulls=True).over(whole)
    return F.when(marked & F.col(time).isNotNull(), first).otherwise(F.col(time))
