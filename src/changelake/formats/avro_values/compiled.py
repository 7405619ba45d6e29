"""Compiled converters: the schema walked once into a tree of closures that go straight to the
frozen form the protocol deduplicates on, accepting exactly what the generic functions accept
(a refusal is `Invalid`; the caller asks the generic function why)."""

from __future__ import annotations

import math
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from changelake.formats.avro_logical import logical
from changelake.formats.avro_values.generic import (
    _READ_ERRORS,
    INT_RANGE,
    LONG_RANGE,
    Converter,
    Named,
    Schema,
    _resolve,
    python_to_plain,
    type_name,
)
from changelake.values import NAN, NONFINITE_TEXT, float32_value, nonfinite_text

# The generic functions (`generic.py`) re-interpret the schema for every value: fine for error
# messages but slow for millions of rows. `compile_*` walk the schema once and return a tree of
# closures that go straight to the frozen form (`Record` for records and maps, tuples for
# arrays) that the protocol deduplicates on. A compiled converter only says *that* a value is
# invalid (it raises `Invalid`); the caller re-runs the generic function to say *why*, so both
# paths accept exactly the same values.


class Invalid(Exception):
    """A compiled converter met a value it does not accept (the generic path explains)."""




def _primitive_checker(kind: str) -> Converter:
    if kind == "null":
        def null(v: Any) -> None:
            if v is not None:
                raise Invalid
        return null
    if kind == "boolean":
        def boolean(v: Any) -> bool:
            if type(v) is not bool:
                raise Invalid
            return v
        return boolean
    if kind in ("int", "long"):
        lo, hi = INT_RANGE if kind == "int" else LONG_RANGE

        def integer(v: Any) -> int:
            if type(v) is not int or not lo <= v <= hi:
                raise Invalid
            return v
        return integer
    if kind in ("float", "double"):
        def real(v: Any) -> float:
            if type(v) is float:
                return NAN if v != v else v
            if type(v) is int:
                return float(v)
            if type(v) is str and v in NONFINITE_TEXT:
                return NONFINITE_TEXT[v]
            raise Invalid
        return real
    if kind == "string":
        def string(v: Any) -> str:
            if type(v) is not str:
                raise Invalid
            return v
        return string
    if kind == "bytes":
        def octets(v: Any) -> str:
            if type(v) is not str or (v and not v.isascii() and max(v) > "\xff"):
                raise Invalid
            return v
        return octets
    raise ValueError(f"unsupported Avro type {kind!r}")


def compile_avro_json(schema: Schema, named: Named) -> Converter:
    """Avro JSON -> frozen plain JSON, validating; raises `Invalid` on any mismatch."""
    from changelake.values import Record

    annotated = logical(schema, named)
    if annotated is not None:
        base = compile_avro_json(annotated.underlying, named)
        to_plain = annotated.to_plain

        def logical_value(v: Any) -> Any:
            raw = base(v)
            if raw is None:
                return None
            try:
                return to_plain(raw)
            except _READ_ERRORS:
                raise Invalid from None
        return logical_value
    s = _resolve(schema, named)
    if isinstance(s, list):
        has_null = any(_resolve(b, named) == "null" for b in s)
        branches: dict[str, Converter] = {}
        for b in s:
            name = type_name(b, named)
            branches[name] = branches[name.rsplit(".", 1)[-1]] = compile_avro_json(b, named)

        def union(v: Any) -> Any:
            if v is None:
                if has_null:
                    return None
                raise Invalid
            if type(v) is not dict or len(v) != 1:
                raise Invalid
            for key, inner in v.items():
                branch = branches.get(key)
                if branch is None:
                    raise Invalid
                return branch(inner)
            raise Invalid
        return union
    if isinstance(s, str):
        return _primitive_checker(s)
    kind = s["type"]
    if kind in ("record", "error"):
        fields = [(f["name"], compile_avro_json(f["type"], named)) for f in s["fields"]]
        size = len(fields)

        def record(v: Any) -> Record:
            if type(v) is not dict or len(v) != size:
                raise Invalid  # missing fields with defaults also take the generic path
            try:
                return Record([(name, convert(v[name])) for name, convert in fields])
            except KeyError:
                raise Invalid from None
        return record
    if kind == "array":
        item = compile_avro_json(s["items"], named)

        def array(v: Any) -> tuple:
            if type(v) is not list:
                raise Invalid
            return tuple(map(item, v))
        return array
    if kind == "map":
        value = compile_avro_json(s["values"], named)

        def mapping(v: Any) -> Record:
            if type(v) is not dict:
                raise Invalid
            return Record([(k, value(x)) for k, x in v.items()])
        return mapping
    if kind == "enum":
        symbols = frozenset(s["symbols"])

        def enum(v: Any) -> str:
            if v not in symbols:
                raise Invalid
            return v
        return enum
    if kind == "fixed":
        octets, size = _primitive_checker("bytes"), s["size"]

        def fixed(v: Any) -> str:
            if len(octets(v)) != size:
                raise Invalid
            return v
        return fixed
    raise ValueError(f"unsupported Avro type {kind!r}")


def compile_avro_json_rows(schema: Schema, named: Named) -> Converter:
    """`list(map(compile_avro_json(schema, named), rows))` for the rows of one message, a
    column at a time where it can: a record's fields are taken out as columns, and a column
    of primitives (or of a `["null", T]` union's values) is checked with a few C-level passes
    (`set(map(type, column))`, `min`, `max`) instead of a call per value. Anything else goes
    value by value through the compiled converter, so the result is that converter's; raises
    `Invalid` where it would (or where the whole message is not a list of records of the
    schema's size, for the generic path to explain)."""
    from changelake.values import Record

    row = compile_avro_json(schema, named)
    s = _resolve(schema, named)
    if logical(schema, named) is not None or not isinstance(s, dict) \
            or s["type"] not in ("record", "error") or not s["fields"]:
        return lambda rows: list(map(row, rows))
    names = [f["name"] for f in s["fields"]]
    getters = [itemgetter(name) for name in names]
    columns = [_compile_column(f["type"], named) for f in s["fields"]]
    size = len(names)

    def records(rows: list) -> list:
        if not rows:
            return []
        if set(map(type, rows)) != {dict} or set(map(len, rows)) != {size}:
            raise Invalid
        try:
            values = [convert(list(map(get, rows))) for get, convert in zip(getters, columns,
                                                                              strict=True)]
        except KeyError:
            raise Invalid from None
        pairs = [zip(repeat(name), column) for name, column in zip(names, values, strict=True)]
        return list(map(Record, zip(*pairs, strict=True)))
    return records


def _compile_column(schema: Schema, named: Named) -> Converter:
    """A column's values (a list) converted as `compile_avro_json` converts each; see
    `compile_avro_json_rows`."""
    each = compile_avro_json(schema, named)

    def value_by_value(column: list) -> list:
        return list(map(each, column))

    if logical(schema, named) is not None:
        return value_by_value
    s = _resolve(schema, named)
    if isinstance(s, str) and s in ("int", "long"):
        lo, hi = INT_RANGE if s == "int" else LONG_RANGE

        def integers(column: list) -> list:
            if set(map(type, column)) == {int} and lo <= min(column) and max(column) <= hi:
                return column
            return value_by_value(column)
        return integers
    if isinstance(s, str) and s in ("string", "boolean"):
        kind = str if s == "string" else bool

        def same_type(column: list) -> list:
            return column if set(map(type, column)) == {kind} else value_by_value(column)
        return same_type
    if isinstance(s, str) and s in ("float", "double"):
        def reals(column: list) -> list:
            # float(x) is x for a float; a NaN (or an infinity, whose sum may be NaN) goes
            # value by value, for the one shared NaN
            if set(map(type, column)) <= {float, int}:
                total = sum(column)
                if total == total:
                    return list(map(float, column))
            return value_by_value(column)
        return reals
    if isinstance(s, list):
        branches: dict[str, Converter] = {}
        for b in s:
            name = type_name(b, named)
            branches[name] = branches[name.rsplit(".", 1)[-1]] = _compile_column(b, named)
        has_null = any(_resolve(b, named) == "null" for b in s)

        def union(column: list) -> list:
            nulls = column.count(None) if has_null else 0
            wrapped = list(filter(None, column)) if nulls else column
            if len(wrapped) + nulls != len(column) or set(map(type, wrapped)) != {dict} \
                    or set(map(len, wrapped)) != {1}:
                return value_by_value(column)
            keys = set(chain.from_iterable(wrapped))
            branch = branches.get(keys.pop()) if len(keys) == 1 else None
            if branch is None:
                return value_by_value(column)
            inner = branch(list(chain.from_iterable(map(dict.values, wrapped))))
            if not nulls:
                return inner
            values = iter(inner)
            return [None if v is None else next(values) for v in column]
        return union
    return value_by_value


def compile_to_avro_json(schema: Schema, named: Named) -> Converter:
    """`to_avro_json` compiled once per schema (plain JSON -> Avro JSON, validating; a writer
    converts every row); raises `Invalid` on any mismatch, and the generic `to_avro_json`
    then names what is wrong. A union takes the first branch whose converter accepts the
    value, as `to_avro_json` takes the first branch that matches it."""
    annotated = logical(schema, named)
    if annotated is not None:
        underlying = compile_to_avro_json(annotated.underlying, named)
        to_underlying = annotated.to_underlying

        def logical_value(v: Any) -> Any:
            if v is None:
                raise Invalid
            try:
                raw = to_underlying(v)
            except ValueError:
                raise Invalid from None
            return underlying(raw)
        return logical_value
    s = _resolve(schema, named)
    if isinstance(s, list):
        has_null = any(_resolve(b, named) == "null" for b in s)
        branches = [(type_name(b, named), compile_to_avro_json(b, named))
                    for b in s if _resolve(b, named) != "null"]

        def union(v: Any) -> Any:
            if v is None:
                if has_null:
                    return None
                raise Invalid
            for name, convert in branches:
                try:
                    return {name: convert(v)}
                except Invalid:
                    continue
            raise Invalid
        return union
    if isinstance(s, str):
        check = _primitive_checker(s)
        if s not in ("float", "double"):
            return check

        def real(v: Any) -> Any:
            x = check(v)  # refuses a bool: its type is not int
            return x if math.isfinite(x) else nonfinite_text(x)  # JSON has no NaN
        return real
    kind = s["type"]
    if kind in ("record", "error"):
        fields = [(f["name"], compile_to_avro_json(f["type"], named), "default" in f,
                   f.get("default")) for f in s["fields"]]
        names = frozenset(name for name, _, _, _ in fields)

        def record(v: Any) -> dict[str, Any]:
            if not isinstance(v, dict) or not names.issuperset(v):
                raise Invalid
            out: dict[str, Any] = {}
            for name, convert, has_default, default in fields:
                if name in v:
                    out[name] = convert(v[name])
                elif has_default:
                    out[name] = default
                else:
                    raise Invalid
            return out
        return record
    if kind == "array":
        item = compile_to_avro_json(s["items"], named)

        def array(v: Any) -> list:
            if not isinstance(v, list):
                raise Invalid
            return [item(x) for x in v]
        return array
    if kind == "map":
        value = compile_to_avro_json(s["values"], named)

        def mapping(v: Any) -> dict[str, Any]:
            if not isinstance(v, dict):
                raise Invalid
            return {k: value(x) for k, x in v.items()}
        return mapping
    if kind == "enum":
        symbols = frozenset(s["symbols"])

        def enum(v: Any) -> str:
            if type(v) is not str or v not in symbols:
                raise Invalid
            return v
        return enum
    return compile_avro_json(s, named)  # fixed: the same check both ways


def _canonical_nan(v: Any) -> Any:
    return NAN if v != v else v


def _float32(v: Any) -> Any:
    """An Avro `float` as fastavro reads it (widened to a double) as the double of its
    shortest text (`values.float32_value`): `1.1`, not `1.100000023841858`; the same float32
    when written again. Only a float is touched (a union's other branches pass)."""
    return float32_value(v) if type(v) is float else v


def compile_python(schema: Schema, named: Named) -> Converter | None:
    """fastavro's Python values -> frozen plain JSON; None where the value is already plain.

    fastavro has validated the types while decoding, so this only converts representation.
    """
    from changelake.values import freeze

    def generic(v: Any) -> Any:
        return freeze(python_to_plain(v))

    if isinstance(schema, dict) and "logicalType" in schema:
        return generic
    s = _resolve(schema, named)
    if isinstance(s, list):
        branches = {compile_python(b, named) for b in s}
        if branches <= {None}:
            return None
        if branches <= {None, _canonical_nan}:
            return _canonical_nan  # harmless on the other branches' values (None, str, int)
        if branches <= {None, _float32}:
            return _float32  # the one branch a float can be of: harmless on the others
        return generic
    if isinstance(s, str):
        if s == "float":
            return _float32
        if s == "double":
            return _canonical_nan
        return (lambda v: v.decode("latin-1")) if s == "bytes" else None
    kind = s["type"]
    if kind in ("record", "error"):
        from changelake.values import Record

        fields = [(f["name"], compile_python(f["type"], named)) for f in s["fields"]]
        if all(convert is None for _, convert in fields):
            names = [name for name, _ in fields]
            return lambda v: Record(zip(names, map(v.__getitem__, names), strict=True))
        return lambda v: Record([(name, v[name] if convert is None else convert(v[name]))
                                 for name, convert in fields])
    if kind == "array":
        item = compile_python(s["items"], named)
        return tuple if item is None else (lambda v: tuple(map(item, v)))
    if kind in ("map", "fixed"):
        return generic
    return None  # enum
