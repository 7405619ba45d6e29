"""Changefeed topics as the source of `encode --from debezium|ydb`.

A Debezium connector writes one topic per table (record key: the row's primary key as JSON,
value: the change event, with or without the `schema`/`payload` envelope; a tombstone, a null
value, after each delete for log compaction) and, with `provide.transaction.metadata`, a
`<prefix>.transaction` topic of BEGIN/END events. YDB changefeeds read through YDB's Kafka API
carry the JSON records of `formats.ydb`, `resolved` barriers included. Several topics are read
as one feed: a table's data topic and the transaction topic (the CLI takes `--topic` repeated
or comma-separated).

The read is bounded like every Kafka read here (`kafka.source`): each partition of each topic
from its beginning up to its end when the read starts. All of it is read and parsed before any
conversion, so memory holds the parsed records of the read (a streaming merge is the seam for
`--follow`). Then the records are put in the order the converter needs:

* Debezium partitions a table's topic by key, so one transaction's events are spread over
  partitions and interleave differently than in the database's log, which breaks the
  high-water rule of `convert.progress` (a later time seen in one partition says nothing about
  another). Events are therefore merged in the source's own order, their `position` (PostgreSQL
  `(sequence[0], sequence[1], lsn)`, MySQL binlog `(file, pos, row)`, YDB `(step, txId)`),
  ties and position-less events (incremental snapshots) kept in their partition's order after
  the position before them. A connector restart re-sends a tail: the copies sort next to their
  originals and the keyed converter recognises them as replays. Transaction metadata (BEGIN/END)
  goes first: an END before its events is what `DebeziumProgress` expects, and then a
  transaction is finished as soon as its last counted event is in, so the last transaction
  needs no `--close`.
* YDB partitions carry their own barriers: each Kafka partition is one YDB partition stream, in
  offset order, interleaved barrier by barrier as `convert.feed` does with files. A partition
  without a barrier (an empty one too) holds the frontier at 0, as an empty file does.

Tombstones are skipped and counted (`report.skipped["tombstone"]`). A record that is not JSON,
or not a change event, is a `ChangefeedError` located at topic, partition and offset: strict
stops there before anything is written, lenient sets it aside and goes on.

A consumer group is never read from: resuming a conversion mid-stream would need the
converter's state (every key's current row and sequence, the open window, transactions in
flight, the writer's progress) saved with the offsets. A fresh conversion from a committed
offset would retract nothing for rows it never saw and restart progress at time 0: not exact.
(`ingest --kafka --from debezium|ydb` resumes from offsets: the lake table holds the rows.) So
`commit_group` only records in a group how far a finished conversion read, for tools that watch
groups' lag (`encode --from ... --kafka --group G`); every run reads the topics whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from changelake.convert.feed import ChangefeedEncoder, FeedReport
from changelake.convert.upsert import UpsertOptions
from changelake.errors import ChangefeedError, Location
from changelake.formats import lines as jsonl
from changelake.formats.change import Change, Item, Op
from changelake.formats.debezium import DebeziumParser
from changelake.formats.materialize import Sink
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import YdbParser
from changelake.kafka.source import PartitionRange, TopicReader, location
from changelake.protocol.messages import Message

Source = Literal["debezium", "ydb"]


def topic_list(topics: str | Sequence[str]) -> list[str]:
    """Topics as given: one name, names separated by commas, or a sequence of those; each once,
    in the order given."""
    names = [topics] if isinstance(topics, str) else list(topics)
    out: list[str] = []
    for name in names:
        for part in name.split(","):
            part = part.strip()
            if part and part not in out:
                out.append(part)
    if not out:
        raise ChangefeedError("no topic given (--topic T, repeated or comma-separated)")
    return out


@dataclass(slots=True)
class _Parsed:
    """One record, parsed, with what orders it."""

    item: Item
    raw: bytes
    order: tuple[Any, ...]


@dataclass(slots=True)
class TopicFeedRead:
    """What a read covered: each topic's partition ranges, and the records read."""

    ranges: dict[str, list[PartitionRange]] = field(default_factory=dict)
    records: int = 0


class TopicFeed:
    """One bounded read of changefeed topics converted to Materialize CDC messages.

    `messages()` once; `report` (the converter's: changes, skipped kinds, set-aside records,
    replays in `report.stats.duplicates`) and `read` fill in as it goes. The other options are
    `encode --from`'s (see `convert.feed.ChangefeedEncoder`); `config` adds librdkafka settings.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: str | Sequence[str],
        *,
        source: Source,
        keys: Sequence[str] | None = None,
        table_schema: TableSchema | dict[str, Any] | None = None,
        close: bool = False,
        lenient: bool = False,
        set_aside: Sink | None = None,
        options: UpsertOptions | None = None,
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
        idle_timeout: float = 60.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topic_list(topics)
        self.config = config
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.encoder = ChangefeedEncoder(
            [], source=source, keys=keys, table_schema=table_schema, close=close,
            lenient=lenient, set_aside=set_aside, options=options)
        self.source = source
        self.read = TopicFeedRead()

    @property
    def report(self) -> FeedReport:
        return self.encoder.report

    def commit_group(self, group: str) -> None:
        """Record in consumer group `group` that each partition read was read to the end of
        its range (after the conversion's output is complete; see the module docstring)."""
        for topic, ranges in self.read.ranges.items():
            with TopicReader(self.bootstrap, topic, group=group, framed=False,
                             config=self.config, timeout=self.timeout) as reader:
                reader.commit({r.partition: r.end for r in ranges})

    def messages(self) -> Iterator[Message]:
        """Read every topic (bounded), then convert: see the module docstring."""
        streams = self._read()
        if self.source == "debezium":
            yield from self.encoder.feed([_debezium_order(streams)])
        else:
            yield from self.encoder.feed([[(p.item, p.raw) for p in stream]
                                          for stream in streams])

    # ------------------------------------------------------------------------------ reading

    def _read(self) -> list[list[_Parsed]]:
        """Each partition's parsed records, in offset order; tombstones and records set aside
        are counted and left out."""
        parse = self._parser()
        streams: list[list[_Parsed]] = []
        for topic in self.topics:
            by_partition: dict[int, list[_Parsed]] = {}
            last: dict[int, tuple[int, ...]] = {}
            with TopicReader(self.bootstrap, topic, framed=False, config=self.config,
                             timeout=self.timeout, idle_timeout=self.idle_timeout) as reader:
                self.read.ranges[topic] = reader.plan()
                for planned in self.read.ranges[topic]:  # an empty partition is a stream too:
                    by_partition[planned.partition] = []  # (YDB) its frontier is still 0
                for record in reader.records():
                    self.read.records += 1
                    self.encoder.report.lines += 1
                    where = location(topic, record.partition, record.offset)
                    raw = record.value or b""
                    try:
                        item = parse(record.key, record.value, where)
                    except ChangefeedError as error:
                        self.encoder.reject(error, raw)
                        continue
                    if isinstance(item, Change) and item.op is Op.TOMBSTONE:
                        self.encoder.skip("tombstone")
                        continue
                    position = last.get(record.partition, ())
                    if isinstance(item, Change) and item.position is not None:
                        position = last[record.partition] = item.position
                    order = (position, len(streams), record.partition, record.offset)
                    by_partition.setdefault(record.partition, []).append(
                        _Parsed(item, raw, order))
            for partition in sorted(by_partition):
                streams.append(by_partition[partition])
        return streams

    def _parser(self) -> Any:
        """A function (key, value, where) -> Item for the source's records."""
        if self.source == "debezium":
            debezium = DebeziumParser(self.encoder.schema)

            def parse_debezium(key: bytes | None, value: bytes | None, where: Location) -> Item:
                record = {"key": _json(key, "key", where), "value": _json(value, "value", where)}
                return debezium.parse(record, where)

            return parse_debezium
        assert self.encoder.schema is not None
        ydb = YdbParser(self.encoder.schema)

        def parse_ydb(key: bytes | None, value: bytes | None, where: Location) -> Item:
            if value is None:
                return Change(Op.TOMBSTONE, None, None, None, None, None, origin=where)
            return ydb.parse(_json(value, "value", where), where)

        return parse_ydb


def _json(data: bytes | None, what: str, where: Location) -> Any:
    if data is None:
        return None
    try:
        return jsonl.loads(data)
    except jsonl.JsonError as error:
        raise ChangefeedError(f"the record {what} is not JSON: {error}", where) from None


def _debezium_order(streams: Iterable[list[_Parsed]]) -> list[tuple[Item, bytes]]:
    """The Debezium feed in the connector's order: transaction metadata and other non-change
    records first, then the changes merged by source position (see the module docstring)."""
    first: list[_Parsed] = []
    changes: list[_Parsed] = []
    for stream in streams:
        for parsed in stream:
            (changes if isinstance(parsed.item, Change) else first).append(parsed)
    changes.sort(key=lambda p: p.order)
    return [(p.item, p.raw) for p in (*first, *changes)]


def changefeed_messages(
    bootstrap: str,
    topics: str | Sequence[str],
    *,
    source: Source,
    keys: Sequence[str] | None = None,
    table_schema: TableSchema | dict[str, Any] | None = None,
    close: bool = False,
    lenient: bool = False,
    set_aside: Sink | None = None,
    config: Mapping[str, Any] | None = None,
) -> Iterator[Message]:
    """Materialize CDC messages (protocol values) from a bounded read of Debezium or YDB
    changefeed topics, as `changelake encode --from debezium|ydb --kafka B --topic T` writes
    them. `topics`: the table's data topic and, for Debezium, the connector's transaction
    metadata topic for exact progress (names, or comma-separated). `keys` (else the table
    schema's primary key) are the key columns; `close` ends the stream at the end of the read;
    `lenient` sets bad records aside (to `set_aside`) instead of raising `ChangefeedError`.
    Use `TopicFeed` for the report (tombstones, replays, set-aside records)."""
    feed = TopicFeed(bootstrap, topics, source=source, keys=keys, table_schema=table_schema,
                     close=close, lenient=lenient, set_aside=set_aside, config=config)
    return feed.messages()


__all__ = ["TopicFeed", "TopicFeedRead", "changefeed_messages", "topic_list"]
