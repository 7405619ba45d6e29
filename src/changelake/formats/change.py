"""The one shape every changefeed parses into, so the Python conversion rules are written once
for both feeds.

Debezium JSON (`debezium.py`) and YDB JSON (`ydb.py`) say the same things in different words:
a row was created, read by a snapshot, updated, deleted; a table was truncated; a transaction
ended with N events; a partition has delivered everything before a timestamp. Parsers turn each
input line into exactly one `Item`:

* `Change`: a row-level event (or a truncate / logical message / tombstone);
* `TxBoundary`: a Debezium transaction-metadata BEGIN or END;
* `Resolved`: a YDB barrier, "this partition has delivered every change before `position`";
* `Skipped`: a well-formed message that carries no change (heartbeat, schema-change event, a
  key record, a non-transactional logical message), kept so that callers can count them.

Row values are *plain JSON*, as elsewhere in changelake (see `avro_values`): decimals as
exact decimal strings, temporal values as ISO-8601 strings, bytes as strings of code points
0-255. Two values need care:

* `UNCHANGED` stands for "this column was not sent; it keeps its previous value" (Debezium's
  `__debezium_unavailable_value`, a column absent from a YDB UPDATES-mode record). It is not
  null, it is never written into a row: conversion replaces it by the stored value.
* `NAN` is the one NaN object used for YDB's `"nan"`. NaN is unequal to itself, but Python's
  tuple comparison and hashing check identity first, so rows holding this single object still
  consolidate and deduplicate.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from changelake.errors import Location


class _Unchanged:
    """The type of `UNCHANGED`: one immutable, hashable instance, unequal to any real value."""

    __slots__ = ()
    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __reduce__(self) -> str:
        return "UNCHANGED"  # pickles (Spark workers) as the module-level singleton


UNCHANGED = _Unchanged()
NAN = float("nan")


class Op(enum.Enum):
    """What happened. The letters are Debezium's where Debezium has one."""

    CREATE = "c"  # the row did not exist before
    READ = "r"  # a snapshot says the row exists with this value (an upsert, not an insert)
    UPDATE = "u"  # the row existed and changed (its before-image may be missing or partial)
    UPSERT = "upsert"  # the row now has this value; whether it existed is not said (YDB)
    DELETE = "d"
    TRUNCATE = "t"  # every row of the table goes
    MESSAGE = "m"  # a logical-decoding message: not a row change
    TOMBSTONE = "tombstone"  # Kafka compaction marker after a delete: normally a no-op


Row: TypeAlias = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    """One row-level event, whatever feed it came from.

    `before`/`after` are None when the image is absent or unknown; a column that is null is a
    key with value None, and a column that was not sent holds `UNCHANGED`. `key` is the primary
    key by column name when the feed says it (Debezium Kafka key, YDB key array), else None.

    `position` is a tuple of integers, totally ordered within one connector's stream, used to
    order events of a key and to recognise replays: PostgreSQL `(sequence[0], sequence[1],
    lsn)`, MySQL `(binlog file number, pos, row)`, YDB `(step, txId)`.

    `time` is the CDCv2 time (a non-negative int) or None for "no time of its own: at the
    current time of the stream" (snapshot rows of PostgreSQL, YDB records without virtual
    timestamps). Each parser documents its mapping.
    """

    op: Op
    key: Row | None
    before: Row | None
    after: Row | None
    position: tuple[int, ...] | None
    time: int | None
    transaction: str | None = None
    table: str | None = None
    origin: Location = field(default_factory=Location, compare=False)
    snapshot: bool = False
    #: 1-based index of the event inside its transaction (Debezium `transaction.total_order`),
    #: so that a replayed event is counted once toward the transaction's END count.
    tx_order: int | None = None
    #: For `Op.MESSAGE`: (prefix, content); for the rest unused.
    message: tuple[str, str] | None = None
    #: `time` is its transaction's: the own time of the first event of the transaction the
    #: parser read (PostgreSQL without `sequence`, MySQL with a GTID or a transaction id that
    #: is no binlog position), not this event's. A parser per Spark partition sees only its
    #: own first, so the Python path takes the batch's first over the events so marked
    #: (`convert.base.spark_transaction_time`).
    tx_timed: bool = False


@dataclass(frozen=True, slots=True)
class TxBoundary:
    """A Debezium transaction BEGIN or END. `id` is normalised to match `Change.transaction`."""

    status: str  # "BEGIN" or "END"
    id: str
    event_count: int | None
    per_collection: tuple[tuple[str, int], ...] = ()
    origin: Location = field(default_factory=Location, compare=False)


@dataclass(frozen=True, slots=True)
class Resolved:
    """A YDB barrier: the partition has delivered every change before `position`."""

    position: tuple[int, int]
    origin: Location = field(default_factory=Location, compare=False)

    @property
    def frontier(self) -> int:
        """The CDCv2 frontier this barrier allows: times (steps) below the barrier's step.

        `[S, 0]` finishes every step before S; `[S, x]` with x > 0 finishes part of step S
        only, so S itself stays open either way.
        """
        return self.position[0]


@dataclass(frozen=True, slots=True)
class Skipped:
    """A well-formed message that is not a change: kind is e.g. "heartbeat", "schema-change"."""

    kind: str
    origin: Location = field(default_factory=Location, compare=False)


Item: TypeAlias = Change | TxBoundary | Resolved | Skipped
