"""Materialize CDC messages <-> values: Avro JSON and plain values into `Updates` and `Progress`
(rows frozen into `Record`s, each carrying where it was read) and back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from changelake.errors import Location
from changelake.formats import avro_values as av
from changelake.formats.materialize.schema import PROGRESS_BRANCH, CdcSchema
from changelake.protocol.antichain import Antichain
from changelake.protocol.messages import Message, Progress, Updates
from changelake.protocol.time import check_time
from changelake.text import short
from changelake.values import Record, freeze, thaw


@dataclass(frozen=True, slots=True)
class SetAside:
    """Input that lenient mode skipped: where, why, and the raw text (truncated)."""

    location: Location
    reason: str
    raw: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"set_aside": str(self.location), "reason": self.reason, "raw": self.raw}


Sink = Callable[[SetAside], None]


def _times(value: Any, what: str) -> list[int]:
    if not isinstance(value, list):
        raise ValueError(f"{what}: expected an array of times, got {short(value)}")
    try:
        return [check_time(t) for t in value]  # type: ignore[misc]
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


def progress_from_plain(value: Any, origin: Location) -> Progress:
    if not isinstance(value, dict) or set(value) != {"lower", "upper", "counts"}:
        raise ValueError("progress must have exactly lower, upper and counts")
    counts = value["counts"]
    if not isinstance(counts, list):
        raise ValueError("counts: expected an array")
    pairs = []
    for i, c in enumerate(counts):
        if not isinstance(c, dict) or set(c) != {"time", "count"}:
            raise ValueError(f"counts[{i}]: expected {{time, count}}, got {short(c)}")
        try:
            pairs.append((check_time(c["time"]), _long(c["count"], "count")))
        except ValueError as error:
            raise ValueError(f"counts[{i}]: {error}") from None
    return Progress(Antichain(_times(value["lower"], "lower")),
                    Antichain(_times(value["upper"], "upper")), tuple(pairs), origin)


def updates_from_plain(
    value: Any, origin: Location, freeze_data: Callable[[Any], Any]
) -> Updates:
    if not isinstance(value, list):
        raise ValueError("updates must be an array")
    out = []
    for i, u in enumerate(value):
        if not isinstance(u, dict) or set(u) != {"data", "time", "diff"}:
            raise ValueError(f"update {i}: expected {{data, time, diff}}, got {short(u)}")
        try:
            time = check_time(u["time"])
        except ValueError as error:
            raise ValueError(f"update {i}: {error}") from None
        try:
            diff = _long(u["diff"], "diff")
        except ValueError as error:
            raise ValueError(f"update {i}: {error}") from None
        if not isinstance(u["data"], dict):
            raise ValueError(f"update {i}: data must be a record, got {short(u['data'])}")
        out.append((freeze_data(u["data"]), time, diff))
    return Updates(out, origin)


def _long(value: Any, what: str) -> int:
    """A diff or count: an Avro long."""
    if type(value) is not int:
        raise ValueError(f"{what} must be an integer, got {short(value)}")
    low, high = av.LONG_RANGE
    if not low <= value <= high:
        raise ValueError(f"{what} {value} does not fit a 64-bit signed integer")
    return value



def _schemaless_row(data: Any) -> Record:
    """Without a schema, field order carries no meaning: rows are frozen in sorted order."""
    if type(data) is not dict:
        raise av.Invalid
    return Record(sorted([(k, av.freeze_unwrapped(v)) for k, v in data.items()]))


def _freezer(schema: CdcSchema | None) -> Callable[[Any], Any]:
    if schema is None:
        return lambda d: Record(sorted((k, freeze(v)) for k, v in d.items()))
    fields = schema.data_fields
    return lambda d: freeze(d, fields)


def message_from_avro_json(obj: Any, schema: CdcSchema | None, origin: Location) -> Message:
    """One line's JSON value (a wrapped union) to a protocol message."""
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError('expected {"array": [...]} or {"com.materialize.cdc.progress": {...}}')
    ((branch, value),) = obj.items()
    if schema is not None:
        if branch == "array":
            try:
                return _updates_fast(value, origin, schema.json_rows)
            except (av.Invalid, KeyError, TypeError):
                pass  # the generic path below says what is wrong (or accepts defaults)
        value = av.from_avro_json(obj, schema.avro, schema.named)
        if branch == "array":
            return updates_from_plain(value, origin, _freezer(schema))
        return progress_from_plain(value, origin)
    if branch == "array":
        try:
            return _updates_fast_schemaless(value, origin)
        except (av.Invalid, KeyError, TypeError):
            pass  # the generic path below says what is wrong
        return updates_from_plain(av.unwrap_unions_heuristically(value), origin, _freezer(None))
    if branch in (PROGRESS_BRANCH, "progress"):
        return progress_from_plain(value, origin)
    raise ValueError(f"unknown message branch {branch!r}")


def _updates_fast(value: Any, origin: Location, rows: Callable[[list], list]) -> Updates:
    """The common case, fast: every check of `updates_from_plain`, on the whole message at
    once (a few C-level passes over its times and diffs), its rows frozen by `rows` (a
    message's rows at once: `CdcSchema.json_rows`, `_schemaless_rows`). Raises `Invalid` (or
    KeyError, TypeError) on anything unusual, for the generic path to explain."""
    if type(value) is not list:
        raise av.Invalid
    if not value:
        return Updates([], origin)
    if set(map(type, value)) != {dict} or set(map(len, value)) != {3}:
        raise av.Invalid
    low, high = av.LONG_RANGE
    times = list(map(_TIME, value))
    diffs = list(map(_DIFF, value))
    if set(map(type, times)) != {int} or min(times) < 0 or max(times) > high \
            or set(map(type, diffs)) != {int} or min(diffs) < low or max(diffs) > high:
        raise av.Invalid
    return Updates(list(zip(rows(list(map(_DATA, value))), times, diffs, strict=True)), origin)


_DATA, _TIME, _DIFF = itemgetter("data"), itemgetter("time"), itemgetter("diff")

_FLAT = frozenset({str, int, float, bool, type(None)})
"""Types that `freeze_unwrapped` returns unchanged, as JSON parsing produces them (JSON has no
NaN, so a parsed float never needs the shared NaN)."""

_UNWRAPPED = av.PRIMITIVES - {"null"}
"""The union branch names `freeze_unwrapped` unwraps."""


def _updates_fast_schemaless(value: Any, origin: Location) -> Updates:
    """`_updates_fast` with rows frozen as `_schemaless_row` freezes each."""
    return _updates_fast(value, origin, _schemaless_rows)


def _schemaless_rows(rows: list) -> list[Record]:
    """`[_schemaless_row(row) for row in rows]` for the rows of one message (parsed JSON), a
    column at a time when every row has the same fields: a column of plain scalars is taken
    as it is, one of primitive union values (`{"int": 12}`, or null) is unwrapped with a few
    C-level passes; the rows are made from the columns at once. Other messages go row by
    row, and other columns value by value, through `freeze_unwrapped`."""
    if set(map(type, rows)) != {dict}:
        raise av.Invalid
    first = rows[0]
    names = sorted(first)
    if not names or set(map(len, rows)) != {len(names)}:
        return list(map(_schemaless_row, rows))
    try:
        columns = [list(map(itemgetter(name), rows)) for name in names]
    except KeyError:  # rows of other fields
        return list(map(_schemaless_row, rows))
    pairs = [zip(repeat(name), _unwrapped_column(column))
             for name, column in zip(names, columns, strict=True)]
    return list(map(Record, zip(*pairs, strict=True)))


def _unwrapped_column(column: list) -> list:
    kinds = set(map(type, column))
    if kinds <= _FLAT:
        return column
    if dict in kinds and kinds <= _FLAT | {dict}:
        wrapped = [v for v in column if type(v) is dict]
        if set(map(len, wrapped)) == {1} and set(chain.from_iterable(wrapped)) <= _UNWRAPPED:
            inner = list(chain.from_iterable(map(dict.values, wrapped)))
            if set(map(type, inner)) <= _FLAT:
                if len(inner) == len(column):
                    return inner
                values = iter(inner)
                return [next(values) if type(v) is dict else v for v in column]
    unwrapped = av.freeze_unwrapped
    return [v if type(v) in _FLAT else unwrapped(v) for v in column]


def message_to_plain(message: Message, *, json_safe: bool = False) -> Any:
    """A protocol message as the plain value of its union branch."""
    if isinstance(message, Updates):
        return [{"data": thaw(d, json_safe=json_safe), "time": t, "diff": r}
                for d, t, r in message.updates]
    return {
        "lower": list(message.lower),
        "upper": list(message.upper),
        "counts": [{"time": t, "count": c} for t, c in message.counts],
    }


def message_to_avro_json(message: Message, schema: CdcSchema | None) -> dict[str, Any]:
    branch = "array" if isinstance(message, Updates) else PROGRESS_BRANCH
    if schema is not None:  # the message's kind is its branch: a bad value is named as such
        plain = message_to_plain(message)
        if isinstance(message, Updates):
            try:
                return {branch: schema.updates_avro_json(plain)}
            except av.Invalid:
                pass  # the generic conversion below says what is wrong
        branch_schema = schema.avro[0 if isinstance(message, Updates) else 1]
        return {branch: av.to_avro_json(plain, branch_schema, schema.named)}
    return {branch: message_to_plain(message, json_safe=True)}
