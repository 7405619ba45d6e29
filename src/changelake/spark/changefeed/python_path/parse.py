"""Step 1 of the Python path: each line through the Python parser (`DebeziumParser`,
`YdbParser`) in a `mapInPandas` worker, into one row per item (`PARSED_DDL`), with what the
partition saw of the image columns (`Seen`), which the driver merges into the batch's column
names and types (`batch_columns`).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from changelake.convert.images import event_identity
from changelake.convert.upsert import key_of, split_moved_key, unkeyed
from changelake.errors import ChangefeedError, Location
from changelake.formats.change import Change, Op, Resolved, Skipped, TxBoundary, _Unchanged
from changelake.formats.debezium import DebeziumParser
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import YdbParser
from changelake.spark.changefeed.python_path.values import ARROW_TYPES, infer_kind
from changelake.spark.changefeed.types import spark_type

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame


PARSED_DDL = (
    "file string, line long, kind string, item binary, key binary, time long, tx string, "
    "tx_order long, end_count long, barrier long, pos binary, ident binary, op string, "
    "error string, tbl string, end_collections string, tx_timed boolean"
)
#: Changes that carry no key and still mean something to keyed conversion (or nothing at all).
_KEYLESS = frozenset({Op.TRUNCATE, Op.MESSAGE, Op.TOMBSTONE})


def _parser(source: str, schema: TableSchema | None) -> Any:
    return DebeziumParser(schema) if source == "debezium" else YdbParser(schema)  # type: ignore[arg-type]


def parse_partition(source: str, schema: TableSchema | None, keys: Sequence[str] | None,
                     frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    import pandas as pd

    parser = _parser(source, schema)
    names = [c.split()[0] for c in PARSED_DDL.split(", ")]
    seen = Seen()
    for frame in frames:
        rows: list[dict[str, Any]] = []
        for value, file, line in zip(frame["value"], frame["file"], frame["line"], strict=True):
            base: dict[str, Any] = dict.fromkeys(names)
            base.update(file=file, line=int(line))
            try:
                item = parser.parse_line(value, Location(file, int(line)))
            except ChangefeedError as error:
                rows.append({**base, "kind": "error", "error": error.reason})
                continue
            if isinstance(item, Change):
                rows.extend(_change_rows(base, item, keys))
                seen.observe(item, file, int(line))
            elif isinstance(item, TxBoundary):
                rows.append({**base, "kind": item.status, "tx": item.id,
                             "end_count": item.event_count,
                             "end_collections": orjson.dumps(item.per_collection).decode()})
            elif isinstance(item, Resolved):
                rows.append({**base, "kind": "resolved", "barrier": item.frontier,
                             "pos": pickle.dumps(item.position)})
            else:
                assert isinstance(item, Skipped)
                rows.append({**base, "kind": "skipped"})
        yield pd.DataFrame(rows, columns=names)
    # What this partition saw of the columns: one row, merged on the driver (`batch_columns`).
    yield pd.DataFrame([{**dict.fromkeys(names), "kind": "columns",
                         "item": pickle.dumps(seen)}], columns=names)


def rejected_lines(source: str, schema: TableSchema | None,
                   frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The lines of `frames` (`value`, `file`, `row`, ...) the Python parser rejects, without
    `value`, with `reason`: the parser's own, as `parse_partition` gives it (one parser per
    partition, as there)."""
    parser = _parser(source, schema)
    for frame in frames:
        reasons: list[str | None] = []
        for value, file, row in zip(frame["value"], frame["file"], frame["row"], strict=True):
            try:
                parser.parse_line(value, Location(file, int(row)))
            except ChangefeedError as error:
                reasons.append(error.reason)
            else:
                reasons.append(None)
        out = frame.drop(columns="value").assign(reason=reasons)
        yield out[out["reason"].notna()]


@dataclass
class Seen:
    """The columns of a partition's images: the first image's names (by file, line) and the
    kinds of every non-null value, so that a column's Spark type does not depend on which
    rows a sample happened to hold (a column null in the first rows is not a string)."""

    first: tuple[str, int, tuple[str, ...]] | None = None
    kinds: dict[str, set[str]] = field(default_factory=dict)
    firsts: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # by (file, line)
    #: Where each column first appears: (file, line, image (after 0, before 1), index).
    places: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)

    def observe(self, change: Change, file: str, line: int) -> None:
        for side, image in enumerate((change.after, change.before)):
            if image is None:
                continue
            if self.first is None or (file, line) < self.first[:2]:
                self.first = (file, line, tuple(image))
            for index, name in enumerate(image):
                place = (file, line, side, index)
                if name not in self.places or place < self.places[name]:
                    self.places[name] = place
            for name, value in image.items():
                if value is not None and not isinstance(value, _Unchanged):
                    kind = infer_kind(value)
                    self.kinds.setdefault(name, set()).add(kind)
                    if name not in self.firsts or (file, line) < self.firsts[name][:2]:
                        self.firsts[name] = (file, line, kind)

    def merge(self, other: Seen) -> None:
        if other.first is not None and (self.first is None or other.first < self.first):
            self.first = other.first
        for name, kinds in other.kinds.items():
            self.kinds.setdefault(name, set()).update(kinds)
        for name, first in other.firsts.items():
            if name not in self.firsts or first < self.firsts[name]:
                self.firsts[name] = first
        for name, place in other.places.items():
            if name not in self.places or place < self.places[name]:
                self.places[name] = place

    def names(self) -> list[str]:
        """Every image's columns in (file, line) order, each where it first appears: the
        columns `WindowedConverter._check_columns` grows to over the same lines."""
        return sorted(self.places, key=self.places.__getitem__)

    def kind(self, name: str) -> str | None:
        """The Spark type of a column (None: no value seen): the one numeric type that holds
        every number seen, else the kind of the first value (the odd values are bad lines)."""
        kinds = self.kinds.get(name)
        if not kinds:
            return None
        if len(kinds) > 1 and kinds <= {"bigint", "decimal(20,0)"}:
            return "decimal(20,0)"
        if len(kinds) > 1 and kinds <= {"bigint", "decimal(20,0)", "double"}:
            return "double"
        return self.firsts[name][2]


def _change_rows(base: dict[str, Any], change: Change,
                 keys: Sequence[str] | None) -> list[dict[str, Any]]:
    """One row per change; an update that moves its key is two (see `split_moved_key`), one
    for each key's group. A keyed event whose key cannot be told is an error row here, where
    its line is known, rather than a failure inside a group."""
    moved = split_moved_key(change, keys) if keys else None
    rows = []
    for part in moved or (change,):
        key = key_of(part, keys) if keys else None
        if keys and key is None and part.op not in _KEYLESS:
            return [{**base, "kind": "error", "error": unkeyed(part, keys).reason}]
        rows.append({**base, "kind": "change", "op": part.op.value, "item": pickle.dumps(part),
                     "key": pickle.dumps(_one_spelling(key)) if key is not None else None,
                     "time": part.time, "tx": part.transaction, "tx_order": part.tx_order,
                     "tx_timed": part.tx_timed,
                     "tbl": part.table, "pos": pickle.dumps(part.position),
                     "ident": pickle.dumps(event_identity(part))})
    return rows


def _one_spelling(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A key as the bytes Spark groups by: values Python holds equal (`1`, `1.0` and `True`;
    `0.0` and `-0.0`) pickle alike, so they reach one key's group, as they are one key to
    the converter's dicts."""
    def spell(value: Any) -> Any:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    return tuple(spell(v) for v in key)


def batch_columns(schema: TableSchema | None, parsed: DataFrame,
             state: DataFrame | None = None) -> list[tuple[str, str]]:
    """Column names and Spark types. The names are the table schema's (a column beyond them is
    schema drift, an error at its line), else those of every image in (file, line) order, each
    where it first appears, as the sequential encoder grows them (a column a source's `ALTER
    TABLE ... ADD COLUMN` added mid-batch comes after the others; one it dropped stays, null in
    later rows), else the state's. The types are the table schema's,
    else the state's (the table's, so that one batch's types cannot drift from the table's),
    else the one kind that holds every value of the batch (`Seen.kind`)."""
    seen = Seen()
    for row in parsed.where(parsed["kind"] == "columns").select("item").collect():
        seen.merge(pickle.loads(row["item"]))
    stated = {f.name: f.dataType.simpleString() for f in state.schema.fields} \
        if state is not None else {}
    if schema is not None:
        names = list(schema.names)
    elif seen.first is not None:
        names = seen.names()
    else:
        names = list(stated)
    typed = {c.name: c.type for c in schema.columns} if schema is not None else {}
    out = []
    for n in names:
        if typed.get(n):
            kind = spark_type(typed[n])
        elif stated.get(n) in ARROW_TYPES:
            kind = stated[n]
        else:
            kind = seen.kind(n) or "string"
        out.append((n, kind))
    return out
