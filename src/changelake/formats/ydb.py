"""YDB changefeed JSON (`FORMAT = 'JSON'`, every MODE) and DEBEZIUM_JSON into `Change`s.

A JSON record names no columns: `key` is an array in primary-key order, and `update` / `reset`
/ `newImage` / `oldImage` hold non-key columns only (SPEC §2.2-2.3). So a `TableSchema` is
required; rows are rebuilt as key ⊕ image, every column of the schema by name.

What each record becomes:

* `erase` → DELETE; `before` = key ⊕ `oldImage` when present.
* `update`/`reset` with `newImage` → UPDATE with `before` = key ⊕ `oldImage` when there is an
  old image, else UPSERT (NEW_IMAGE cannot tell an insert from an update).
* `update`/`reset` with only `oldImage` (OLD_IMAGE mode) → UPDATE whose `after` is unknown
  (None): there is nothing to convert it with, and conversion says so.
* `update` without images (UPDATES mode; KEYS_ONLY looks the same) → UPSERT of a *partial*
  row: the columns it names, every other non-key column `UNCHANGED`. `reset` (REPLACE) → UPSERT
  whose unnamed columns are null, their default (YDB-COL `PatchState`).
* `{"resolved": [step, txId]}` → `Resolved`.

Position and time: `ts = [step, txId]` is the position (lexicographic, a global order); the time
is `step` (DESIGN.md Conventions: two Uint64s do not fit one long, so a step's transactions share
a time while `[step, txId]` keeps ordering them as the sequence). Without virtual timestamps a
record has neither (time None: "the stream's current time").

Values follow YDB's serializer (YDB-SER `ToJson`) and come out as plain JSON: `"nan"`/`"inf"`/
`"-inf"` floats as floats (`NAN` for NaN), Decimal and DyNumber as strings, String (bytes) from
base64 to a 0-255 code-point string, Json/Yson as canonical JSON text, Date as `YYYY-MM-DD`,
Date32/Datetime64/Timestamp64 (raw integers on the wire) as ISO strings. Uint64 values beyond a
signed long stay exact Python ints.

DEBEZIUM_JSON values (`{"payload": {"op": ..., "source": {"connector": "ydb", "step", "txId"}}}`)
go through the Debezium parser; their images include the key columns and are decoded here by
the YDB types of the table schema.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from changelake.errors import ChangefeedError, Location
from changelake.formats.change import NAN, UNCHANGED, Change, Item, Op, Resolved
from changelake.formats.debezium import DebeziumParser, loads
from changelake.formats.tableschema import TableSchema
from changelake.protocol.time import MAX_TIME
from changelake.text import short

_OPTIONAL = re.compile(r"^Optional<(.*)>$")
_INTS = {
    **{f"Int{b}": (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)},
    **{f"Uint{b}": (0, (1 << b) - 1) for b in (8, 16, 32, 64)},
    "Interval": (-(1 << 63), (1 << 63) - 1),
    "Interval64": (-(1 << 63), (1 << 63) - 1),
}
_FLOATS = {"nan": NAN, "inf": math.inf, "-inf": -math.inf}
_DATA_FIELDS = frozenset({"key", "update", "reset", "erase", "newImage", "oldImage", "ts"})
_EPOCH = dt.datetime(1970, 1, 1)


class YdbParser:
    """Parses the records of one topic partition against one table schema."""

    def __init__(self, table_schema: TableSchema) -> None:
        if not table_schema.primary_key:
            raise ChangefeedError("a YDB table schema needs its primary_key, to name the key "
                                  "array of each record")
        self.schema = table_schema
        self._types = {c.name: _base_type(c.type) for c in table_schema.columns}
        self._non_key = tuple(n for n in table_schema.names if n not in table_schema.primary_key)
        self._debezium = DebeziumParser()

    def parse_line(self, line: bytes | str, origin: Location) -> Item:
        return self.parse(loads(line, origin), origin)

    def parse(self, value: Any, origin: Location) -> Item:
        if not isinstance(value, dict):
            raise ChangefeedError(f"a YDB record must be a JSON object, got {short(value)}",
                                  origin)
        if "resolved" in value:
            if len(value) != 1:
                raise ChangefeedError("a resolved record must hold nothing else", origin)
            return Resolved(_pair(value["resolved"], "resolved", origin), origin)
        if "payload" in value or "value" in value:
            return self._debezium_json(value, origin)
        return self._record(value, origin)

    # ----------------------------------------------------------------------- JSON format

    def _record(self, value: dict[str, Any], origin: Location) -> Change:
        unknown = set(value) - _DATA_FIELDS
        if unknown:
            raise ChangefeedError(f"unknown fields {sorted(unknown)} in a YDB record", origin)
        kinds = [k for k in ("update", "reset", "erase") if k in value]
        if len(kinds) != 1:
            raise ChangefeedError("a YDB data record needs exactly one of update, reset, erase; "
                                  f"found {kinds or 'none'}", origin)
        kind = kinds[0]
        if not isinstance(value[kind], dict):
            raise ChangefeedError(f"{kind} must be an object", origin)
        key = self._key(value.get("key"), origin)
        position: tuple[int, int] | None = None
        time: int | None = None
        if "ts" in value:
            position = _pair(value["ts"], "ts", origin)
            time = position[0]
            if time > MAX_TIME:
                raise ChangefeedError(f"step {time} does not fit a 64-bit signed integer, as "
                                      "CDCv2 times must", origin)
        old = self._image(value.get("oldImage"), "oldImage", origin)
        new = self._image(value.get("newImage"), "newImage", origin)
        before = {**key, **old} if old is not None else None
        if kind == "erase":
            if new is not None:
                raise ChangefeedError("an erase record must not have a newImage", origin)
            return Change(Op.DELETE, key, before, None, position, time, origin=origin)
        if new is not None:
            op = Op.UPDATE if before is not None else Op.UPSERT
            return Change(op, key, before, {**key, **new}, position, time, origin=origin)
        if old is not None:  # OLD_IMAGE: the new values are not in the feed
            return Change(Op.UPDATE, key, before, None, position, time, origin=origin)
        written = self._columns(value[kind], kind, origin, fill=None if kind == "reset" else
                                UNCHANGED)
        return Change(Op.UPSERT, key, None, {**key, **written}, position, time, origin=origin)

    def _key(self, raw: Any, origin: Location) -> dict[str, Any]:
        names = self.schema.primary_key
        if not isinstance(raw, list):
            raise ChangefeedError(f"key must be an array of the primary-key values, got "
                                  f"{short(raw)}", origin)
        if len(raw) != len(names):
            raise ChangefeedError(f"key has {len(raw)} values, the table's primary key "
                                  f"{list(names)} has {len(names)}", origin)
        return {name: self._decode(name, v, origin) for name, v in zip(names, raw, strict=True)}

    def _image(self, raw: Any, what: str, origin: Location) -> dict[str, Any] | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ChangefeedError(f"{what} must be an object", origin)
        return self._columns(raw, what, origin, fill=None)

    def _columns(self, raw: dict[str, Any], what: str, origin: Location,
                 fill: Any) -> dict[str, Any]:
        """Non-key columns in schema order; the ones `raw` does not name get `fill`."""
        extra = [n for n in raw if n not in self._types or n in self.schema.primary_key]
        if extra:
            raise ChangefeedError(f"{what} has columns {extra} that are not non-key columns of "
                                  f"the table schema {list(self.schema.names)}", origin)
        return {n: self._decode(n, raw[n], origin) if n in raw else fill for n in self._non_key}

    def _decode(self, name: str, value: Any, origin: Location) -> Any:
        try:
            return decode_value(value, self._types.get(name))
        except (ValueError, TypeError, ArithmeticError) as error:  # dates, decimals
            raise ChangefeedError(f"column {name}: {error}", origin) from None

    # ---------------------------------------------------------------------- DEBEZIUM_JSON

    def _debezium_json(self, value: dict[str, Any], origin: Location) -> Item:
        item = self._debezium.parse(value, origin)
        if not isinstance(item, Change):
            return item

        def typed(image: Mapping[str, Any] | None) -> dict[str, Any] | None:
            if image is None:
                return None
            unknown = [n for n in image if n not in self._types]
            if unknown:
                raise ChangefeedError(f"columns {unknown} are not in the table schema "
                                      f"{list(self.schema.names)}", origin)
            return {n: self._decode(n, image[n], origin) if n in image else None
                    for n in self.schema.names}

        before, after = typed(item.before), typed(item.after)
        key = item.key
        if key is None:
            image = after if after is not None else before
            if image is not None:
                key = {k: image[k] for k in self.schema.primary_key}
        else:
            key = {k: self._decode(k, key.get(k), origin) for k in self.schema.primary_key}
        op = item.op
        if op is Op.UPDATE and before is None and after is not None:
            op = Op.UPSERT  # NEW_IMAGE: "u" even for inserts (SPEC §3)
        return replace(item, op=op, key=key, before=before, after=after)


# ------------------------------------------------------------------------------- values


def _base_type(kind: str | None) -> str | None:
    if kind is None:
        return None
    kind = kind.strip()
    m = _OPTIONAL.match(kind)
    while m:
        kind = m.group(1).strip()
        m = _OPTIONAL.match(kind)
    return kind.rstrip("?")


def decode_value(value: Any, kind: str | None) -> Any:
    """One YDB JSON value by its YDB type name; plain JSON out (see the module docstring)."""
    if value is None or kind is None:
        return value
    if kind == "Bool":
        if not isinstance(value, bool):
            raise ValueError(f"Bool expected, got {short(value)}")
        return value
    if kind in _INTS:
        low, high = _INTS[kind]
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"{kind} expected an integer in [{low}, {high}], "
                             f"got {short(value)}")
        return value
    if kind in ("Float", "Double"):
        if isinstance(value, str):
            if value not in _FLOATS:
                raise ValueError(f"{kind} expected a number, got {short(value)}")
            return _FLOATS[value]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{kind} expected a number, got {short(value)}")
        return float(value)
    if kind.startswith("Decimal") or kind == "DyNumber":
        if not isinstance(value, str):
            raise ValueError(f"{kind} expected a decimal string, got {short(value)}")
        decimal.Decimal(value)  # validates
        return value
    if kind == "String":
        if not isinstance(value, str):
            raise ValueError(f"String expected base64 text, got {short(value)}")
        return base64.b64decode(value, validate=True).decode("latin-1")
    if kind in ("Json", "JsonDocument", "Yson"):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    if kind == "Date":
        return _iso(value, kind)[:10]
    if kind in ("Datetime", "Timestamp", "TzDate", "TzDatetime", "TzTimestamp"):
        return _iso(value, kind)
    if kind == "Date32":
        return (dt.date(1970, 1, 1) + dt.timedelta(days=_int(value, kind))).isoformat()
    if kind == "Datetime64":
        return (_EPOCH + dt.timedelta(seconds=_int(value, kind))).isoformat() + "Z"
    if kind == "Timestamp64":
        return (_EPOCH + dt.timedelta(microseconds=_int(value, kind))).isoformat() + "Z"
    if kind in ("Utf8", "Uuid"):
        if not isinstance(value, str):
            raise ValueError(f"{kind} expected a string, got {short(value)}")
        return value
    return value


def _iso(value: Any, kind: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{kind} expected an ISO-8601 string, got {short(value)}")
    try:
        dt.datetime.fromisoformat(value.replace("Z", "+00:00") if len(value) > 10 else value)
    except ValueError:
        raise ValueError(f"{kind} expected an ISO-8601 string, got {short(value)}") from None
    return value


def _int(value: Any, kind: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{kind} expected an integer, got {short(value)}")
    return value


def _pair(raw: Any, what: str, origin: Location) -> tuple[int, int]:
    """`[step, txId]`: two unsigned 64-bit integers."""
    if (not isinstance(raw, list) or len(raw) != 2
            or not all(type(v) is int and 0 <= v < 1 << 64 for v in raw)):
        raise ChangefeedError(f"{what} must be [step, txId] (two unsigned 64-bit integers), "
                              f"got {short(raw)}", origin)
    return raw[0], raw[1]

