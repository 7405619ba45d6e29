"""Spark's column types and Arrow's: the one mapping, and the widenings a lake column allows.

Three places turn a Spark type into an Arrow one: the JVM-free reads (`lake.arrow`), the
exports (`lake.export.arrow`) and the changefeed's Python path's Arrow-vectorized UDFs
(`spark.changefeed.python_path`). They must agree, or a value read one way would come back
another: so they all ask `arrow_of`. The schema evolution (`lake.schema`) and the reads'
projection of old files onto today's schema (`lake.arrow`) must agree on which type changes are
widenings: so both ask `WIDENINGS`.

Types are taken in their JSON form (as `StructType.json()` writes them: `long`, `integer`,
`decimal(20,0)`, nested types as objects), and this module imports no pyspark: the JVM-free
reads import it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

SPARK_DECIMAL_DIGITS = 38
"""The most digits a Spark decimal holds (Scala's `DecimalType.MAX_PRECISION`). A wider
decimal has no Spark type: PostgreSQL's `numeric` (the capture) and an Avro `decimal` (the
`materialize-cdc` source) beyond it are kept as their exact text."""

_SIMPLE: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "byte": pa.int8(), "short": pa.int16(), "integer": pa.int32(),
    "long": pa.int64(), "float": pa.float32(), "double": pa.float64(), "string": pa.string(),
    "binary": pa.binary(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(-?\d+)\)")

#: Spark's SQL names (`DataType.simpleString()`) of the types whose JSON name differs.
_JSON_NAMES = {"tinyint": "byte", "smallint": "short", "int": "integer", "bigint": "long"}

_RANK = {"byte": 0, "short": 1, "integer": 2, "long": 3}
WIDENINGS: frozenset[tuple[str, str]] = frozenset({("float", "double")} | {
    (a, b) for a, ra in _RANK.items() for b, rb in _RANK.items() if ra < rb})
"""(old, new) JSON type names where every value of `old` is one of `new`, exactly."""


class NoArrowType(Exception):
    """A Spark type with no Arrow type here, at `where` (the column, or the field in it)."""

    def __init__(self, where: str, spark_type: Any) -> None:
        super().__init__(f"{where}: {json.dumps(spark_type)}")
        self.where = where
        self.spark_type = spark_type


def arrow_of(spark_type: Any, where: str) -> pa.DataType:
    """The Arrow type of a Spark type in its JSON form (a simple type may also be given by its
    SQL name, `bigint`). `NoArrowType` names the field at fault below `where`."""
    if isinstance(spark_type, str):
        name = _JSON_NAMES.get(spark_type, spark_type)
        if name in _SIMPLE:
            return _SIMPLE[name]
        if name == "decimal":
            return pa.decimal128(10, 0)
        match = _DECIMAL.fullmatch(name)
        if match:
            return pa.decimal128(int(match.group(1)), int(match.group(2)))
    elif isinstance(spark_type, dict):
        kind = spark_type.get("type")
        if kind == "struct":
            return pa.struct([pa.field(f["name"], arrow_of(f["type"], f"{where}.{f['name']}"))
                              for f in spark_type["fields"]])
        if kind == "array":
            return pa.list_(arrow_of(spark_type["elementType"], where))
        if kind == "map":
            return pa.map_(arrow_of(spark_type["keyType"], where),
                           arrow_of(spark_type["valueType"], where))
    raise NoArrowType(where, spark_type)
