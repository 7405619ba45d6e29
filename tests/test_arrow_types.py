"""One mapping of Spark types to Arrow (`spark_arrow.arrow_of`) serves the JVM-free reads, the
exports and the old changefeed path's UDFs: each names the field with no Arrow type in its own
error. No Spark session: the
types are pyspark's objects and their JSON form."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from changelake.errors import SchemaError
from changelake.lake.arrow import ArrowUnavailable, arrow_type
from changelake.lake.export.arrow import arrow_type as export_type
from changelake.spark.changefeed.python_path.values import ARROW_TYPES
from changelake.spark.changefeed.python_path.values import arrow_type as udf_type

MAPPED = [
    (T.BooleanType(), pa.bool_()), (T.ByteType(), pa.int8()), (T.ShortType(), pa.int16()),
    (T.IntegerType(), pa.int32()), (T.LongType(), pa.int64()), (T.FloatType(), pa.float32()),
    (T.DoubleType(), pa.float64()), (T.StringType(), pa.string()),
    (T.BinaryType(), pa.binary()), (T.DateType(), pa.date32()),
    (T.TimestampType(), pa.timestamp("us", tz="UTC")),
    (T.TimestampNTZType(), pa.timestamp("us")),
    (T.DecimalType(20, 0), pa.decimal128(20, 0)), (T.DecimalType(7, 3), pa.decimal128(7, 3)),
    (T.ArrayType(T.LongType()), pa.list_(pa.int64())),
    (T.MapType(T.StringType(), T.DoubleType()), pa.map_(pa.string(), pa.float64())),
    (T.StructType([T.StructField("a", T.LongType()),
                   T.StructField("b", T.ArrayType(T.DateType()))]),
     pa.struct([pa.field("a", pa.int64()), pa.field("b", pa.list_(pa.date32()))])),
]


@pytest.mark.parametrize(("kind", "arrow"), MAPPED, ids=lambda v: str(v))
def test_a_read_and_an_export_map_every_type_alike(kind: T.DataType, arrow: pa.DataType):
    assert arrow_type(json.loads(kind.json()), "t") == arrow
    assert export_type(kind, "table t, column c") == arrow


UNMAPPED = T.StructType([T.StructField("ok", T.LongType()),
                         T.StructField("span", T.DayTimeIntervalType())])


def test_a_type_without_arrow_is_named_by_its_field():
    with pytest.raises(SchemaError, match=r"^table t, column c\.span: type .*day.*no Arrow"):
        export_type(UNMAPPED, "table t, column c")
    with pytest.raises(ArrowUnavailable, match=r"table t: column type .* is read on Spark only"):
        arrow_type(json.loads(UNMAPPED.json()), "t")


UDF_KINDS = {"bigint": T.LongType(), "double": T.DoubleType(), "boolean": T.BooleanType(),
             "string": T.StringType(), "decimal(20,0)": T.DecimalType(20, 0)}


@pytest.mark.parametrize("kind", sorted(ARROW_TYPES))
def test_the_python_paths_udfs_map_their_kinds_as_a_read_does(kind: str):
    """The UDFs name a column's type by its SQL name (`bigint`), the reads by its JSON name
    (`long`): both reach the same Arrow type."""
    spark_type = UDF_KINDS[kind]
    assert spark_type.simpleString() == kind
    assert udf_type(kind) == arrow_type(json.loads(spark_type.json()), "t")
