"""How far a changefeed is finished: the frontier handed to the CDCv2 writer.

Debezium data topics carry no progress statement (SPEC §5). Two signals are combined:

* *High water*: Debezium emits one connector's events in commit order, so once an event at
  time T is in, every time below T has all its events (within one ordered stream: a single
  partition, or every partition read to the same point). Times below the highest time seen are
  finished; the highest stays open, since more of its events may follow.
* *Transaction metadata* (`provide.transaction.metadata`): a transaction whose END is in and
  whose distinct events (by `total_order`, so replays count once) reach END's `event_count`
  is complete: its time is finished even if it is the highest, and an incomplete one holds the
  frontier at its time however far the high water goes (its events may be in another file).
  END may arrive before or after the events it counts, and duplicate ENDs are harmless. An
  END whose events never arrive holds nothing back: its time is unknown. When END lists its
  `data_collections`, the count that applies is the one of the events' table: a feed of one
  table's topic beside the connector's transaction topic sees only that table's events of a
  transaction that touched several.

YDB JSON has barriers: `resolved [S, x]` in a partition means every change before `[S, x]` of
that partition is in, so steps below S are finished there; the feed's frontier is the minimum
over partitions (SPEC §2.5). A data record below its partition's last barrier breaks the
guarantee (ydb#6985) and is an error, unless it is a replay of a change already applied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from changelake.errors import ChangefeedError
from changelake.formats.change import Change, Resolved, TxBoundary


@dataclass(slots=True)
class _Tx:
    time: int | None = None
    orders: set[int] = field(default_factory=set)
    total: int | None = None  # END's event_count
    per_table: dict[str, int] = field(default_factory=dict)  # END's data_collections
    table: str | None = None  # the table of its events seen

    @property
    def expected(self) -> int | None:
        if self.total is None:
            return None
        if self.table is not None and self.per_table:
            return self.per_table.get(self.table, self.total)
        return self.total


class DebeziumProgress:
    def __init__(self) -> None:
        self.high: int | None = None
        self._tx: dict[str, _Tx] = {}
        self._finished = 0

    def observe(self, change: Change, time: int) -> None:
        if change.time is not None:
            self.high = time if self.high is None else max(self.high, time)
        if change.transaction is not None and change.tx_order is not None:
            tx = self._tx.setdefault(change.transaction, _Tx())
            tx.time = time if tx.time is None else min(tx.time, time)
            tx.orders.add(change.tx_order)
            if change.table is not None:
                tx.table = change.table

    def boundary(self, boundary: TxBoundary) -> None:
        if boundary.status == "END":
            tx = self._tx.setdefault(boundary.id, _Tx())
            if tx.total is None:
                tx.total = boundary.event_count
                tx.per_table = dict(boundary.per_collection)

    def frontier(self) -> int:
        """Times below this are finished. Never moves back."""
        if self.high is None:
            return self._finished
        txs = [(t.time, len(t.orders), t.expected) for t in self._tx.values()]
        self._finished = max(self._finished, frontier_from(self.high, txs))
        # Forget transactions wholly behind the frontier (a replay of them is a duplicate).
        self._tx = {i: t for i, t in self._tx.items()
                    if t.time is None or t.time >= self._finished}
        return self._finished


def frontier_from(high: int, txs: Iterable[tuple[int | None, int, int | None]],
                  since: int | None = None) -> int:
    """The Debezium rule, for one stream or for aggregates of a DataFrame: `high` is the
    highest time seen; each transaction with metadata is `(time, distinct events, END count)`
    (time None: only its END is in; count None: no END yet).

    A transaction before `since` (a table's committed frontier) counts for nothing: the table
    holds it whole, as `DebeziumProgress` forgets one its frontier passed. A batch read from
    where a commit left off may meet one again, re-sent by a connector restart without its
    first events or its END: counted, it would look incomplete and hold the frontier below
    the committed one on every batch from then on. (The Spark path restates this rule as
    aggregates: `spark.changefeed.progress`.)"""
    frontier = high
    at_high: list[bool] = []
    for time, seen, expected in txs:
        if time is not None and since is not None and time < since:
            continue
        complete = expected is not None and seen >= expected
        if time == high:
            at_high.append(complete)
        if time is not None and not complete:
            frontier = min(frontier, time)
    if at_high and all(at_high) and frontier == high:
        frontier = high + 1
    return frontier


class PartitionFrontiers:
    """YDB barriers per partition (one input file = one partition)."""

    def __init__(self, partitions: int) -> None:
        self._resolved: list[tuple[int, int] | None] = [None] * partitions

    def resolved(self, partition: int) -> tuple[int, int] | None:
        return self._resolved[partition]

    def barrier(self, partition: int, item: Resolved) -> None:
        last = self._resolved[partition]
        if last is None or item.position > last:
            self._resolved[partition] = item.position  # a lower one is a re-read: keep

    def check(self, partition: int, change: Change) -> None:
        last = self._resolved[partition]
        if last is not None and change.position is not None and change.position < last:
            raise ChangefeedError(
                f"record at ts {list(change.position)} arrives after resolved {list(last)} in "
                "the same partition: the feed broke its barrier guarantee (see ydb#6985)",
                change.origin)

    def frontier(self) -> int:
        if any(r is None for r in self._resolved):
            return 0
        return min(r[0] for r in self._resolved if r is not None)


def barrier_violations(items: Iterable[tuple[int, Resolved | Change, bool]]
                       ) -> list[tuple[int, str]]:
    """`PartitionFrontiers.check` over one partition's items `(line, item, replay)` in line
    order, for Spark, which checks each file on its own: `(line, reason)` of each record below
    the partition's last barrier. A `replay` is not checked: the sequential encoder skips an
    event that its converter already applied (`is_replay`) before checking it; Spark, which
    converts after checking, counts as a replay a record repeating an earlier event of its
    partition (`event_identity`)."""
    frontiers = PartitionFrontiers(1)
    bad: list[tuple[int, str]] = []
    for line, item, replay in items:
        if isinstance(item, Resolved):
            frontiers.barrier(0, item)
        elif not replay:
            try:
                frontiers.check(0, item)
            except ChangefeedError as error:
                bad.append((line, error.reason))
    return bad


def ydb_frontier(last: Iterable[Any], partitions: int) -> int:
    """`PartitionFrontiers.frontier` from each partition's last barrier position (fewer than
    `partitions` of them: some partition has none yet)."""
    frontiers = PartitionFrontiers(partitions)
    for index, position in enumerate(last):
        frontiers.barrier(index, Resolved(tuple(position)))
    return frontiers.frontier()


def changefeed_waiting_reason(source: str, frontier: int) -> str:
    """Why a changefeed's frontier is not further along, in words, for both engines: what the
    rules above need before time `frontier` counts as complete."""
    if source == "ydb":
        return (f"time {frontier} is complete only once every partition has a resolved record "
                "beyond it; more input finishes it, or --close if the input is the whole feed")
    return (f"nothing shows time {frontier} complete: Debezium finishes a time when a later "
            "one arrives, or when transaction metadata counts all its events; more input "
            "finishes it, or --close if the input is the whole feed")
