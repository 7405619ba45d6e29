"""Changefeed files in, Materialize CDC messages out: parse, convert, track progress, write.

`encode_changefeed` is what `changelake encode --from debezium|ydb` calls. The pieces:

* parsing (`formats.debezium`, `formats.ydb`) turns each line into one `Item`;
* a converter turns `Change`s into `(data, time, diff)`: keyed (`convert.upsert`) when key
  columns are known (`keys`, else the table schema's primary key), from before-images
  (`convert.images`) otherwise;
* progress (`convert.progress`) says which times are finished, and each time the frontier moves
  the converter's updates for the finished times go through `protocol.Writer`, which emits them
  consolidated and followed by one exact progress statement.

Debezium files are read one after another (their order does not matter for the result: only
times and sequences do). `ChangefeedEncoder.feed` takes parsed items from any source instead of
files: `kafka.changefeed` hands it a topic's partitions merged in the connector's order.
YDB files are the partitions of one topic and are interleaved barrier by barrier: the partition
whose last `resolved` is lowest is read next, up to its next barrier, so the frontier (the
minimum over partitions) keeps moving and the window stays small.

Bad input is one `ChangefeedError` naming file and line. In lenient mode it is set aside
instead (handed to `set_aside`, or logged) and reading goes on; in strict mode it is raised,
after every message for the times already finished has been yielded, so nothing accepted
before the bad line is lost. With `close`, the stream is closed when the input ends; without,
it stays open at the frontier the input justifies.
"""

from __future__ import annotations

import itertools
import logging
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from changelake.convert.base import Stats, WindowedConverter
from changelake.convert.images import ImageConverter
from changelake.convert.progress import DebeziumProgress, PartitionFrontiers
from changelake.convert.upsert import KeyedConverter, State, UpsertOptions
from changelake.errors import ChangefeedError, ChangelakeError, InputError, Location, SchemaError
from changelake.formats.change import Change, Item, Resolved, Skipped, TxBoundary
from changelake.formats.debezium import DebeziumParser
from changelake.formats.lines import TOO_LONG, numbered_lines, open_changefeed
from changelake.formats.materialize import SetAside, Sink
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import YdbParser
from changelake.protocol.antichain import Antichain
from changelake.protocol.messages import Message
from changelake.protocol.writer import Writer
from changelake.text import clip

log = logging.getLogger(__name__)

Source = Literal["debezium", "ydb"]


@dataclass(slots=True)
class FeedReport:
    """What an encode saw besides the messages: for the CLI's summary line and for tests."""

    lines: int = 0
    changes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    set_aside: list[SetAside] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)


def read_lines(path: Path) -> Iterator[tuple[int, bytes | None]]:
    """Non-blank lines with their 1-based numbers; None for a line over the maximum length
    (see `formats.lines`)."""
    try:
        with open_changefeed(path) as fo:
            yield from numbered_lines(fo)
    except ValueError as error:
        raise InputError(str(error), Location(str(path))) from None
    except (OSError, EOFError, zlib.error) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise InputError(f"cannot read: {reason}", Location(str(path))) from None


class ChangefeedEncoder:
    """One encode run. `messages()` yields; `report` fills in as it goes."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        source: Source,
        keys: Sequence[str] | None = None,
        table_schema: TableSchema | dict[str, Any] | None = None,
        close: bool = False,
        lenient: bool = False,
        set_aside: Sink | None = None,
        options: UpsertOptions | None = None,
        state: State | None = None,
        batch_size: int = 1024,
    ) -> None:
        if source not in ("debezium", "ydb"):
            raise SchemaError(f"unknown changefeed source {source!r} (debezium or ydb)")
        schema = table_schema
        if isinstance(schema, dict):
            schema = TableSchema.from_json(schema)
        if source == "ydb" and schema is None:
            raise SchemaError("YDB records name no columns: a table schema is required "
                              '({"columns": [{"name": .., "type": ..}], "primary_key": [..]})')
        self.paths = [Path(p) for p in paths]
        self.source = source
        self.schema: TableSchema | None = schema
        self.close = close
        self.lenient = lenient
        self._sink = set_aside
        if options is None:
            key_columns = tuple(keys) if keys else (schema.primary_key if schema else ())
            options = UpsertOptions(keys=key_columns) if key_columns else None
        if options is not None and schema is not None:
            schema.check_keys(options.keys)
        columns = schema.names if schema is not None else None
        self.converter: WindowedConverter = (
            KeyedConverter(options, columns=columns, state=state) if options is not None
            else ImageConverter(columns))
        self.writer = Writer(batch_size=batch_size)
        self.report = FeedReport(stats=self.converter.stats)
        self._table: str | None = None

    # ------------------------------------------------------------------------------ driver

    def messages(self) -> Iterator[Message]:
        """The messages of the files given (`paths`)."""
        if self.source == "debezium":
            parser = DebeziumParser(self.schema)
            streams = [self._parsed(parser.parse_line, path) for path in self.paths]
        else:
            assert self.schema is not None
            ydb_parser = YdbParser(self.schema)
            streams = [self._parsed(ydb_parser.parse_line, path) for path in self.paths]
        return self.feed(streams)

    def feed(self, streams: Sequence[Iterable[tuple[Item, bytes]]]) -> Iterator[Message]:
        """The messages of parsed items from any source (files, Kafka partitions): each item
        with its raw input, for the set-aside report. Debezium streams are read one after
        another, so together they must be in the connector's order (or a replay of it); YDB
        streams are the partitions, interleaved barrier by barrier."""
        if self.source == "debezium":
            yield from self._debezium(itertools.chain.from_iterable(streams))
        else:
            yield from self._ydb([iter(stream) for stream in streams])
        if self.close:
            self.writer.extend(self.converter.advance(None))
            yield from self.writer.close()

    def _advance(self, frontier: int) -> list[Message]:
        if frontier <= self.converter.frontier:
            return []
        self.writer.extend(self.converter.advance(frontier))
        return self.writer.advance_to(Antichain([frontier]))

    def reject(self, error: ChangelakeError, raw: bytes = b"") -> None:
        """Bad input: raised (strict), or set aside and reported (lenient)."""
        self._reject(error, raw)

    def skip(self, kind: str) -> None:
        """Count a well-formed input that carries no change (a heartbeat, a tombstone...)."""
        self.report.skipped[kind] = self.report.skipped.get(kind, 0) + 1

    def _reject(self, error: ChangelakeError, raw: bytes = b"") -> None:
        if not self.lenient:
            raise error
        aside = SetAside(error.location or Location(), error.reason,
                         raw.decode("utf-8", "replace")[:200])
        self.report.set_aside.append(aside)
        if self._sink is not None:
            self._sink(aside)
        else:
            log.warning("set aside %s: %s", aside.location, aside.reason)

    def _parsed(self, parse: Any, path: Path) -> Iterator[tuple[Item, bytes]]:
        for number, line in read_lines(path):
            self.report.lines += 1
            origin = Location(str(path), number)
            if line is None:
                self._reject(ChangefeedError(TOO_LONG, origin))
                continue
            try:
                yield parse(line, origin), line
            except ChangefeedError as error:
                self._reject(error, line)

    def _change(self, change: Change, raw: bytes) -> int | None:
        """Push one change; its time, or None if it was set aside or is a replay."""
        try:
            if change.table is not None:
                if self._table is None:
                    self._table = change.table
                elif change.table != self._table:
                    raise ChangefeedError(
                        f"events of two tables, {clip(self._table)} and {clip(change.table)}: "
                        "encode one table at a time", change.origin)
            time = self.converter.time_of(change)
            self.converter.push(change)
        except ChangefeedError as error:
            self._reject(error, raw)
            return None
        self.report.changes += 1
        return time

    def _skip(self, item: Skipped) -> None:
        self.skip(item.kind)

    # ---------------------------------------------------------------------------- Debezium

    def _debezium(self, items: Iterable[tuple[Item, bytes]]) -> Iterator[Message]:
        progress = DebeziumProgress()
        for item, raw in items:
            if isinstance(item, Change):
                time = self._change(item, raw)
                if time is None:
                    continue
                progress.observe(item, time)
            elif isinstance(item, TxBoundary):
                progress.boundary(item)
            elif isinstance(item, Skipped):
                self._skip(item)
                continue
            else:
                self._reject(ChangefeedError("a YDB resolved record in a Debezium feed",
                                             item.origin), raw)
                continue
            yield from self._advance(progress.frontier())

    # --------------------------------------------------------------------------------- YDB

    def _ydb(self, partitions: list[Iterator[tuple[Item, bytes]]]) -> Iterator[Message]:
        frontiers = PartitionFrontiers(len(partitions))
        streams = dict(enumerate(partitions))
        while streams:
            # The partition with the lowest barrier (none yet counts lowest) goes next.
            partition = min(streams, key=lambda p: (frontiers.resolved(p) or (-1, -1), p))
            for item, raw in streams[partition]:
                if isinstance(item, Resolved):
                    frontiers.barrier(partition, item)
                    yield from self._advance(frontiers.frontier())
                    break
                if isinstance(item, Change):
                    self._ydb_change(partition, item, raw, frontiers)
                elif isinstance(item, Skipped):
                    self._skip(item)
                else:
                    self._reject(ChangefeedError("a Debezium transaction event in a YDB feed",
                                                 item.origin), raw)
            else:
                del streams[partition]

    def _ydb_change(self, partition: int, change: Change, raw: bytes,
                    frontiers: PartitionFrontiers) -> None:
        try:
            if self.converter.is_replay(change):
                self.converter.stats.duplicates += 1
                return
            frontiers.check(partition, change)
        except ChangefeedError as error:
            self._reject(error, raw)
            return
        self._change(change, raw)


def encode_changefeed(
    paths: list[Path],
    *,
    source: Literal["debezium", "ydb"],
    keys: list[str] | None,
    table_schema: TableSchema | dict | None,
    close: bool,
    lenient: bool,
    set_aside: Sink | None = None,
    options: UpsertOptions | None = None,
    state: State | None = None,
) -> Iterator[Message]:
    """Materialize CDC messages (protocol values, data rows as `Record`s) in write order.

    `keys` (else the table schema's primary key) selects keyed upsert conversion; without
    keys, before-images are used. `table_schema` is the parsed `--table-schema` JSON. `close`
    ends the stream when the input ends. `lenient` sets bad lines aside (to `set_aside` if
    given, else the log) instead of raising `ChangefeedError`.
    """
    encoder = ChangefeedEncoder(paths, source=source, keys=keys, table_schema=table_schema,
                                close=close, lenient=lenient, set_aside=set_aside,
                                options=options, state=state)
    return encoder.messages()

