"""Step 3, types: the one place where a changefeed column gets its Spark type and its decoder.

A column's *output* type (what the lake table holds) is, as in the Python path
(`spark/changefeed/python_path/`, `parse.batch_columns`): the table schema's YDB type name
(`spark_type`), else the state's (the lake table's) type, else what the feed's values say: the
Kafka Connect field schema of the Debezium `schema` field or of the table schema's `debezium`
entry (`connect_type`), else Spark's JSON inference over every image on the executors
(`infer_images`).

A column's *raw* type is what `from_json` reads from the image before decoding: the output type,
except for Connect `bytes` (base64) and `Decimal` (base64 two's complement with the schema's
scale), read as strings, and Debezium's dates, times and timestamps (`_TEMPORAL`), read as
bigint; each is decoded by expressions that give exactly the text
`formats.debezium.decode_value` gives (`temporal.py` for the temporal ones). Other logical
types are read by their Connect type, as `decode_value` reads them (real Debezium's jsonb,
timestamptz, uuid and enum columns are strings); those this path cannot yet decode in the JVM
(`VariableScaleDecimal`'s struct, nested structs, arrays) raise `Unsupported`: the Python path
converts those.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from changelake.formats.debezium import PLACEHOLDER, PLACEHOLDER_B64
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.changefeed.temporal import date_text, time_text, timestamp_text
from changelake.spark.json_schema import infer_json_schema

#: Output types this path handles (what the Python path's Arrow conversion handles too).
SUPPORTED = frozenset({"bigint", "double", "boolean", "string", "decimal(20,0)"})
_YDB_TYPES = {"Bool": "boolean", "Float": "double", "Double": "double", "Uint64": "decimal(20,0)"}
_YDB_LONGS = frozenset({"Int8", "Int16", "Int32", "Int64", "Uint8", "Uint16", "Uint32",
                        "Interval", "Interval64"})
_CONNECT = {"int8": "bigint", "int16": "bigint", "int32": "bigint", "int64": "bigint",
            "float": "double", "float32": "double", "float64": "double", "double": "double",
            "boolean": "boolean", "string": "string"}
DECIMAL = "org.apache.kafka.connect.data.Decimal"
FLOATS = frozenset({"float", "float32", "float64", "double"})
FLOAT_WORDS = ("NaN", "Infinity", "-Infinity")
"""JsonConverter's text for a double it cannot write as a JSON number."""
BITS = "io.debezium.data.Bits"
_STRUCTURED = frozenset({"io.debezium.data.VariableScaleDecimal"})
"""Logical types `decode_value` decodes from a structure this path does not read."""


def decimal_literal(n: int) -> Column:
    """`n` as a decimal(20,0) literal: Uint64 values and the bounds of what the encoder reads
    as an integer, beyond a long."""
    return F.lit(str(n)).cast("decimal(20,0)")


def state_column(present: Collection[str], name: str, kind: str) -> Column:
    """Column `name` of the table's current rows at type `kind`; null where the table has no
    such column yet. `present`: the rows' column names in lower case (Spark's resolver finds
    a column in any case, and so does this). A column the source added reads as null in the
    rows written before it (`lake/schema.py`), and a state row without a field is a row whose
    field is null to the encoder (`MemoryState`, `values.freeze`): so a batch that brings a
    new column retracts a key's previous row with the column null."""
    return F.col(name).cast(kind) if name.lower() in present else F.lit(None).cast(kind)


def spark_type(kind: str | None) -> str:
    """The Spark SQL type of a column by its YDB type name (plain JSON: strings otherwise)."""
    if kind is None:
        return "string"
    base = kind.removeprefix("Optional<").removesuffix(">").rstrip("?")
    if base in _YDB_LONGS:
        return "bigint"
    return _YDB_TYPES.get(base, "string")


#: Debezium's temporal Connect types: (decoder kind, units per second), see `temporal.py`.
_TEMPORAL = {
    "io.debezium.time.Date": ("date", 1), "org.apache.kafka.connect.data.Date": ("date", 1),
    "io.debezium.time.Time": ("time", 1000), "org.apache.kafka.connect.data.Time": ("time", 1000),
    "io.debezium.time.MicroTime": ("time", 1_000_000),
    "io.debezium.time.NanoTime": ("time", 1_000_000_000),
    "io.debezium.time.Timestamp": ("timestamp", 1000),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp", 1000),
    "io.debezium.time.MicroTimestamp": ("timestamp", 1_000_000),
    "io.debezium.time.NanoTimestamp": ("timestamp", 1_000_000_000),
}


@dataclass(frozen=True)
class Decoder:
    """How one column's raw JSON value becomes its plain-JSON value: `kind` is "plain" (as
    read), "bytes" (base64 to a string of code points 0-255), "decimal" (with `scale`),
    "date", "time", "timestamp" (an integer count of `per_second` units, to ISO text), or
    "float" (a Connect float or double: a number, or the strings "NaN", "Infinity" and
    "-Infinity" that Kafka's JsonConverter writes for those values, read as text, then as a
    double; `keyed._refused` refuses other strings, as `decode_value` does)."""

    kind: str = "plain"
    scale: int = 0
    per_second: int = 1

    @property
    def raw_type(self) -> str | None:
        """The type `from_json` reads the value as (None: the column's own type)."""
        if self.kind == "plain":
            return None
        return "bigint" if self.kind in ("date", "time", "timestamp") else "string"


def connect_decoder(field: Mapping[str, Any] | None) -> tuple[Decoder, str | None]:
    """A Connect field schema's decoder and output type (None: the field says nothing)."""
    if not field:
        return Decoder(), None
    name, kind = field.get("name"), field.get("type")
    if name == DECIMAL:
        raw = (field.get("parameters") or {}).get("scale", 0)
        try:
            return Decoder("decimal", int(raw)), "string"
        except (TypeError, ValueError):
            raise Unsupported(f"decimal scale {raw!r}") from None
    if name in _TEMPORAL:
        kind_, per_second = _TEMPORAL[name]
        return Decoder(kind_, per_second=per_second), "string"
    if name == BITS:
        return Decoder("bytes"), "string"
    if name in _STRUCTURED:
        raise Unsupported(f"Connect logical type {name}")
    # Any other logical type is read by its Connect type, as `decode_value` reads a name it
    # does not know: real Debezium's `io.debezium.data.Json` (jsonb), `...time.ZonedTimestamp`
    # (timestamptz), `...data.Uuid`, `...data.Enum` are strings; `...time.MicroDuration`
    # (interval) an int64.
    if kind == "bytes":
        return Decoder("bytes"), "string"
    if kind in FLOATS:
        return Decoder("float"), "double"
    if kind in _CONNECT:
        return Decoder(), _CONNECT[kind]
    raise Unsupported(f"Connect type {kind}")


def image_fields(schema_text: str | None) -> dict[str, Mapping[str, Any]] | None:
    """The `after` (else `before`) struct's field schemas of a Debezium `schema` field."""
    if schema_text is None:
        return None
    schema = json.loads(schema_text)
    if not isinstance(schema, dict) or not isinstance(schema.get("fields"), list):
        return None
    for image in ("after", "before"):
        for f in schema["fields"]:
            if isinstance(f, dict) and f.get("field") == image and \
                    isinstance(f.get("fields"), list):
                return {g["field"]: g for g in f["fields"]
                        if isinstance(g, dict) and isinstance(g.get("field"), str)}
    return None


def infer_images(spark: SparkSession, texts: DataFrame) -> StructType:
    """Spark's JSON schema inference over every image text (column `value`), on the executors:
    the names of every column any image has, each with the type that holds all its values."""
    return infer_json_schema(texts.select("value"), failfast=True)


def inferred_from_shapes(shapes: Sequence[str | None]) -> dict[str, str] | None:
    """What `infer_images` finds, from the images' shapes (`DebeziumLine.java`: per change,
    its images' field names, each with the kind of JSON value Spark's inference reads it as),
    as names and simple type names; None where the shapes cannot say it and the inference
    must run: a shape Java gave up on (`*`: too many shapes in a task), a value inference
    reads as neither null nor a string, long, double or boolean (`x`), a name given twice in
    one image, or two names that differ in case only.

    Spark's rules for these kinds (`JsonInferSchema`): null and the empty string are no type;
    a column of only those is a string; longs and doubles widen to a double; any other mix is a
    string."""
    kinds: dict[str, set[str]] = {}
    for shape in shapes:
        if shape is None or shape == "*":
            return None
        for image in orjson.loads(shape):
            names = image[0::2]
            if len(set(names)) != len(names):
                return None
            for name, kind in zip(names, image[1::2], strict=True):
                kinds.setdefault(name, set()).add(kind)
    if len({n.lower() for n in kinds}) != len(kinds):
        return None
    out = {}
    for name, seen in kinds.items():
        if "x" in seen:
            return None
        seen = seen - {"n"}
        out[name] = ("bigint" if seen == {"i"} else "double" if seen <= {"i", "f"} and seen
                     else "boolean" if seen == {"b"} else "string")
    return out


def unchanged(raw: Column) -> Column:
    """Debezium's `__debezium_unavailable_value` (as text or as base64): the UNCHANGED marker."""
    return raw.isin(PLACEHOLDER, PLACEHOLDER_B64)


def decode(raw: Column, decoder: Decoder) -> Column:
    """The plain-JSON value of a raw column, as `formats.debezium.decode_value` gives it."""
    if decoder.kind == "bytes":
        return F.decode(F.unbase64(raw), "ISO-8859-1")
    if decoder.kind == "float":
        return raw.cast("double")
    if decoder.kind == "date":
        return date_text(raw)
    if decoder.kind == "time":
        return time_text(raw, decoder.per_second)
    if decoder.kind == "timestamp":
        return timestamp_text(raw, decoder.per_second)
    if decoder.kind == "decimal":
        data = F.unbase64(raw)
        n = F.octet_length(data)
        digits = F.hex(data)
        negative = (n > 0) & (F.conv(F.substring(digits, 1, 2), 16, 10).cast("int") >= 128)
        # Sign-extended to 64 bits, then read as a signed long: exact two's complement.
        padded = F.when(negative, F.lpad(digits, 16, "F")).otherwise(F.lpad(digits, 16, "0"))
        signed = F.conv(padded, 16, -10).cast("decimal(38,0)")
        scaled = (signed / F.lit(10 ** decoder.scale).cast("decimal(38,0)")) \
            .cast(f"decimal(38,{decoder.scale})").cast("string")
        too_long = F.raise_error(F.lit("decimal wider than 8 bytes"))
        return F.when(raw.isNull(), F.lit(None).cast("string")) \
            .when(n > 8, too_long).otherwise(scaled)
    return raw
