"""Avro values in three forms, and the schema-directed conversions between them.

* **Avro JSON**: the JSON encoding of the Avro spec, which the Materialize docs use: a union value
  that is not null is wrapped as `{"<branch type name>": value}`, bytes are strings of code
  points 0-255.
* **Python Avro**: what fastavro reads and writes (bytes as `bytes`, logical types as Decimal,
  datetime, UUID ...).
* **Plain JSON**: what changelake hands to users and stores in rows: unions unwrapped, bytes as
  the same 0-255 strings as Avro JSON (so the plain form is lossless and printable), logical
  types as their ISO/decimal strings, from any carrier (`avro_logical.py`).

Conversions validate as they go and raise `ValueError` with a path such as `data.price`, so the
caller can name file, line and field.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
import uuid
from collections.abc import Mapping
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from changelake.formats.avro_logical import Logical, logical
from changelake.values import NAN, NONFINITE_TEXT, float32_value, nonfinite_text

PRIMITIVES = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)
INT_RANGE = (-(2**31), 2**31 - 1)
LONG_RANGE = (-(2**63), 2**63 - 1)

Schema = Any  # a parsed (fastavro.parse_schema) or plain Avro schema: str, dict or list
Named = Mapping[str, Any]


def named_types(schema: Schema, namespace: str = "", out: dict[str, Any] | None = None) -> dict:
    """Every named type (record, enum, fixed) in `schema`, by full name and by short name."""
    out = {} if out is None else out
    if isinstance(schema, list):
        for branch in schema:
            named_types(branch, namespace, out)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            name = schema["name"]
            ns = schema.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
            full = name if "." in name else (f"{ns}.{name}" if ns else name)
            out[full] = schema
            out.setdefault(full.rsplit(".", 1)[-1], schema)
            if kind in ("record", "error"):
                for field in schema["fields"]:
                    named_types(field["type"], ns, out)
        elif kind == "array":
            named_types(schema["items"], namespace, out)
        elif kind == "map":
            named_types(schema["values"], namespace, out)
        elif isinstance(kind, dict | list):
            named_types(kind, namespace, out)
    return out


def _resolve(schema: Schema, named: Named) -> Schema:
    while isinstance(schema, str) and schema not in PRIMITIVES:
        if schema not in named:
            raise ValueError(f"unknown Avro type name {schema!r}")
        schema = named[schema]
    if isinstance(schema, dict) and isinstance(schema.get("type"), str | dict | list) \
            and schema["type"] not in ("record", "error", "enum", "fixed", "array", "map"):
        return _resolve(schema["type"], named)  # {"type": "long", "logicalType": ...}
    return schema


def type_name(schema: Schema, named: Named) -> str:
    """The name a union branch is known by in Avro JSON."""
    schema = _resolve(schema, named)
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        raise ValueError("a union may not directly contain another union")
    kind = schema["type"]
    if kind in ("record", "error", "enum", "fixed"):
        name = schema["name"]
        ns = schema.get("namespace")
        return name if "." in name or not ns else f"{ns}.{name}"
    return kind


def _fail(path: str, expected: str, value: Any) -> ValueError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ValueError(f"{path or 'value'}: expected {expected}, got {shown}")


def _check_int(value: Any, path: str, kind: str) -> int:
    if type(value) is not int:
        raise _fail(path, kind, value)
    lo, hi = INT_RANGE if kind == "int" else LONG_RANGE
    if not lo <= value <= hi:
        raise ValueError(f"{path or 'value'}: {value} does not fit an Avro {kind}")
    return value


def _check_bytes_str(value: Any, path: str, kind: str) -> str:
    if not isinstance(value, str) or any(ord(c) > 255 for c in value):
        raise _fail(path, f"{kind} (a string of code points 0-255)", value)
    return value


def from_avro_json(value: Any, schema: Schema, named: Named, path: str = "") -> Any:
    """Avro JSON -> plain JSON: validate against `schema`, unwrap unions."""
    return _convert(value, schema, named, path, wrap=False)


def to_avro_json(value: Any, schema: Schema, named: Named, path: str = "") -> Any:
    """Plain JSON -> Avro JSON: wrap union values in their branch name, validate the rest."""
    return _convert(value, schema, named, path, wrap=True)


def _unwrap_union(value: Any, union: list, named: Named, path: str) -> Any:
    if value is None:
        if any(_resolve(b, named) == "null" for b in union):
            return None
        raise _fail(path, "a union value (null is not a branch)", value)
    if not isinstance(value, dict) or len(value) != 1:
        raise _fail(path, 'a union value written as {"<type>": value}', value)
    ((branch_name, inner),) = value.items()
    for branch in union:
        if type_name(branch, named) in (branch_name, branch_name.rsplit(".", 1)[-1]):
            return _convert(inner, branch, named, path, wrap=False)
    names = ", ".join(type_name(b, named) for b in union)
    raise ValueError(f"{path or 'value'}: union branch {branch_name!r} is not one of {names}")


def _wrap_union(value: Any, union: list, named: Named, path: str) -> Any:
    if value is None:
        if any(_resolve(b, named) == "null" for b in union):
            return None
        raise _fail(path, "a non-null value", value)
    branches = [b for b in union if _resolve(b, named) != "null"]
    # one branch besides null: the value is that branch's, and its own error says why not
    branch = branches[0] if len(branches) == 1 else _branch_for(value, branches, named, path)
    return {type_name(branch, named): _convert(value, branch, named, path, wrap=True)}


def _convert(value: Any, schema: Schema, named: Named, path: str, *, wrap: bool) -> Any:
    """The one schema walk behind both directions; only unions and logical types differ
    between them."""
    annotated = logical(schema, named)
    if annotated is not None:
        return _convert_logical(value, annotated, named, path, wrap=wrap)
    schema = _resolve(schema, named)
    if isinstance(schema, list):
        return (_wrap_union if wrap else _unwrap_union)(value, schema, named, path)
    if isinstance(schema, str):
        result = _primitive(value, schema, path)
        if wrap and type(result) is float and not math.isfinite(result):
            return nonfinite_text(result)  # JSON has no NaN: write its string
        return result
    kind = schema["type"]
    if kind in ("record", "error"):
        if not isinstance(value, dict):
            raise _fail(path, f"record {schema['name']}", value)
        out: dict[str, Any] = {}
        for field in schema["fields"]:
            name = field["name"]
            sub = f"{path}.{name}" if path else name
            if name in value:
                out[name] = _convert(value[name], field["type"], named, sub, wrap=wrap)
            elif "default" in field:
                out[name] = field["default"]
            else:
                raise ValueError(f"{sub}: missing field")
        extra = [k for k in value if k not in out]
        if extra:
            raise ValueError(f"{path or 'value'}: unknown field {extra[0]!r}")
        return out
    if kind == "array":
        if not isinstance(value, list):
            raise _fail(path, "array", value)
        return [_convert(v, schema["items"], named, f"{path}[{i}]", wrap=wrap)
                for i, v in enumerate(value)]
    if kind == "map":
        if not isinstance(value, dict):
            raise _fail(path, "map", value)
        return {k: _convert(v, schema["values"], named, f"{path}[{k!r}]", wrap=wrap)
                for k, v in value.items()}
    if kind == "enum":
        if value not in schema["symbols"]:
            raise _fail(path, f"one of {schema['symbols']}", value)
        return value
    if kind == "fixed":
        text = _check_bytes_str(value, path, "fixed")
        if len(text) != schema["size"]:
            raise ValueError(f"{path or 'value'}: fixed of size {schema['size']}, got {len(text)}")
        return text
    raise ValueError(f"{path or 'value'}: unsupported Avro type {kind!r}")


def _convert_logical(value: Any, kind: Logical, named: Named, path: str, *, wrap: bool) -> Any:
    """A logical value: plain text <-> the underlying value of the JSON encoding."""
    if value is None:  # not a value of any logical type: the underlying type says so
        return _convert(value, kind.underlying, named, path, wrap=wrap)
    if wrap:
        try:
            raw = kind.to_underlying(value)
        except ValueError as error:
            raise ValueError(f"{path or 'value'}: {error}") from None
        return _convert(raw, kind.underlying, named, path, wrap=True)
    raw = _convert(value, kind.underlying, named, path, wrap=False)
    try:
        return kind.to_plain(raw)
    except _READ_ERRORS:
        raise _fail(path, kind.name, value) from None


_READ_ERRORS = (ValueError, OverflowError, ArithmeticError, TypeError, KeyError)
"""What fastavro's logical readers raise for an underlying value that is no such value (a
day count beyond year 9999, say)."""


def _primitive(value: Any, kind: str, path: str) -> Any:
    if kind == "null":
        if value is not None:
            raise _fail(path, "null", value)
        return None
    if kind == "boolean":
        if type(value) is not bool:
            raise _fail(path, "boolean", value)
        return value
    if kind in ("int", "long"):
        return _check_int(value, path, kind)
    if kind in ("float", "double"):
        if type(value) is str and value in NONFINITE_TEXT:
            return NONFINITE_TEXT[value]
        if type(value) not in (int, float):
            raise _fail(path, kind, value)
        return NAN if value != value else float(value)
    if kind == "string":
        if not isinstance(value, str):
            raise _fail(path, "string", value)
        return value
    if kind == "bytes":
        return _check_bytes_str(value, path, "bytes")
    raise ValueError(f"{path or 'value'}: unsupported Avro type {kind!r}")


def _matches(value: Any, schema: Schema, named: Named) -> bool:
    try:
        from_avro_json(value, schema, named)
    except ValueError:
        return False
    return True


def _branch_for(value: Any, union: list, named: Named, path: str) -> Schema:
    for branch in union:
        annotated = logical(branch, named)
        if annotated is not None:  # a plain value is its text: does the type take it?
            if annotated.takes(value):
                return branch
        elif _matches(_wrap_all(value, branch, named), branch, named):
            return branch
    names = ", ".join(type_name(b, named) for b in union)
    raise _fail(path, f"a value of one of {names}", value)


def _wrap_all(value: Any, schema: Schema, named: Named) -> Any:
    """Best-effort plain -> Avro JSON for branch matching (no errors raised here)."""
    try:
        return to_avro_json(value, schema, named)
    except ValueError:
        return value


def plain_to_python(value: Any, schema: Schema, named: Named) -> Any:
    """Plain JSON -> fastavro's Python values (bytes and fixed become `bytes`, logical types'
    text their Python values). Raises ValueError for text no logical value has."""
    if value is None:
        return None
    annotated = logical(schema, named)
    if annotated is not None:
        return annotated.to_python(value)
    schema = _resolve(schema, named)
    if isinstance(schema, list):
        branch = _branch_for(value, [b for b in schema if _resolve(b, named) != "null"],
                             named, "")
        return plain_to_python(value, branch, named)
    if isinstance(schema, str):
        if schema in ("float", "double"):
            return _float(value)
        return value.encode("latin-1") if schema == "bytes" else value
    kind = schema["type"]
    if kind in ("record", "error"):
        return {f["name"]: plain_to_python(value.get(f["name"]), f["type"], named)
                for f in schema["fields"]}
    if kind == "array":
        return [plain_to_python(v, schema["items"], named) for v in value]
    if kind == "map":
        return {k: plain_to_python(v, schema["values"], named) for k, v in value.items()}
    if kind == "fixed":
        return value.encode("latin-1")
    return value


def _float(value: Any) -> Any:
    """A float's plain value for fastavro: NaN and the infinities from their text."""
    return NONFINITE_TEXT.get(value, value) if type(value) is str else value


def compile_plain_python(schema: Schema, named: Named) -> Converter | None:
    """`plain_to_python` compiled once per schema, with no schema walk per value (a writer
    converts every row); None where a plain value is fastavro's already. Values are not
    validated here, fastavro's writer checks them, except a logical type's text, which must
    parse (ValueError otherwise). A union of more than null and one branch picks its branch
    per value, as `plain_to_python` does."""
    annotated = logical(schema, named)
    if annotated is not None:
        to_python = annotated.to_python
        return lambda v: None if v is None else to_python(v)
    s = _resolve(schema, named)
    if isinstance(s, list):
        branches = [b for b in s if _resolve(b, named) != "null"]
        if len(branches) != 1:
            return lambda v: plain_to_python(v, s, named)
        inner = compile_plain_python(branches[0], named)
        if inner is None:
            return None
        return lambda v: None if v is None else inner(v)
    if isinstance(s, str):
        if s == "bytes":
            return lambda v: None if v is None else v.encode("latin-1")
        if s in ("float", "double"):
            return _float
        return None
    kind = s["type"]
    if kind in ("record", "error"):
        fields = [(f["name"], compile_plain_python(f["type"], named)) for f in s["fields"]]
        if all(convert is None for _, convert in fields):
            return None
        return lambda v: None if v is None else {
            name: v.get(name) if convert is None else convert(v.get(name))
            for name, convert in fields}
    if kind == "array":
        item = compile_plain_python(s["items"], named)
        return None if item is None else (lambda v: None if v is None else [item(x) for x in v])
    if kind == "map":
        value = compile_plain_python(s["values"], named)
        return None if value is None else (
            lambda v: None if v is None else {k: value(x) for k, x in v.items()})
    if kind == "fixed":
        return lambda v: None if v is None else v.encode("latin-1")
    return None  # enum


def python_to_plain(value: Any) -> Any:
    """fastavro's Python values -> plain JSON (schema-free: the Python types say enough)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {k: python_to_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [python_to_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, _dt.datetime | _dt.date | _dt.time):
        return value.isoformat()
    if isinstance(value, tuple):  # fastavro's (branch name, value) with return_record_name
        return python_to_plain(value[1])
    raise ValueError(f"cannot represent {type(value).__name__} value {value!r} as JSON")


def freeze_unwrapped(value: Any) -> Any:
    """`unwrap_unions_heuristically` and `freeze` in one pass (the schemaless fast path)."""
    from changelake.values import Record

    kind = type(value)
    if kind is float and value != value:
        return NAN
    if kind is dict:
        if len(value) == 1:
            for key, inner in value.items():
                if key in PRIMITIVES and key != "null":
                    return freeze_unwrapped(inner)
        return Record([(k, freeze_unwrapped(v)) for k, v in value.items()])
    if kind is list:
        return tuple(map(freeze_unwrapped, value))
    return value


def unwrap_unions_heuristically(value: Any) -> Any:
    """Without a schema: `{"int": 10}` -> 10 for the primitive branch names; nothing else."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key in PRIMITIVES and key != "null":
                return unwrap_unions_heuristically(inner)
        return {k: unwrap_unions_heuristically(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap_unions_heuristically(v) for v in value]
    return value


# ------------------------------------------------------------------- compiled converters
#
# The generic functions above re-interpret the schema for every value, which is fine for error
# messages but slow for millions of rows. `compile_*` walk the schema once and return a tree of
# closures that go straight to the frozen form (`Record` for records and maps, tuples for
# arrays) that the protocol deduplicates on. A compiled converter only says *that* a value is
# invalid (it raises `Invalid`); the caller re-runs the generic function to say *why*, so both
# paths accept exactly the same values.


class Invalid(Exception):
    """A compiled converter met a value it does not accept (the generic path explains)."""


Converter = Any  # Callable[[Any], Any]


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
