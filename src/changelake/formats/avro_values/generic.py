"""Avro values, one value at a time: the schema re-read for each, so that an error names the path
of the value it is about (`data.price`), and the reference the compiled converters accept
exactly as."""

from __future__ import annotations

import datetime as _dt
import decimal
import math
import uuid
from collections.abc import Mapping
from typing import Any

from changelake.formats.avro_logical import Logical, logical
from changelake.values import NAN, NONFINITE_TEXT, nonfinite_text

PRIMITIVES = frozenset(
    {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
)
INT_RANGE = (-(2**31), 2**31 - 1)
LONG_RANGE = (-(2**63), 2**63 - 1)

Schema = Any  # a parsed (fastavro.parse_schema) or plain Avro schema: str, dict or list
Named = Mapping[str, Any]
Converter = Any  # Callable[[Any], Any]


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
