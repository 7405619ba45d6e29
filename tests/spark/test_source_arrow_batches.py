"""The `materialize-cdc` reader hands Spark Arrow batches made by pyarrow
(`source.arrow_batches`): they must hold exactly what PySpark's own conversion of the same
rows (yielded as tuples, the read before) makes, for every type the source maps, in batches of
any size. Checked without a JVM, on the rows of one file, against PySpark's converter."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.conversion import LocalDataToArrowConversion
from pyspark.sql.pandas.types import to_arrow_schema

from changelake.formats.materialize import CdcSchema, cdc_schema_around, write_ocf
from changelake.protocol import Writer
from changelake.spark import source
from changelake.values import freeze

RECORD = {"type": "record", "name": "row", "fields": [
    {"name": "k", "type": "long"},
    {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                        "precision": 10, "scale": 2}]},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
    {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "local", "type": ["null", {"type": "long",
                                        "logicalType": "local-timestamp-micros"}]},
    {"name": "tags", "type": ["null", {"type": "map", "values": ["null", "long"]}]},
    {"name": "items", "type": ["null", {"type": "array", "items": {
        "type": "record", "name": "item", "fields": [
            {"name": "x", "type": "long"}, {"name": "y", "type": ["null", "string"]}]}}]},
    {"name": "either", "type": ["null", "long", "string"]},
    {"name": "raw", "type": ["null", "bytes"]},
    {"name": "ratio", "type": ["null", "double"]},
]}
FIELDS = tuple(f["name"] for f in RECORD["fields"])
ROWS = [
    {"k": 1, "price": "12.50", "day": "2024-02-29", "at": "2024-11-03T05:30:00.000001+00:00",
     "local": "2024-11-03T01:30:00.250000", "tags": {"a": 1, "b": None},
     "items": [{"x": 1, "y": "one"}, {"x": 2, "y": None}], "either": 7, "raw": "\u00ff\u0000",
     "ratio": math.nan},
    {"k": 2, "price": "-0.01", "day": "0001-01-01", "at": "0001-01-01T00:00:00+00:00",
     "local": "9999-12-31T23:59:59.999999", "tags": {}, "items": [], "either": "seven",
     "raw": "", "ratio": -0.0},
    {"k": 3, "price": None, "day": None, "at": None, "local": None, "tags": None,
     "items": None, "either": None, "raw": None, "ratio": None},
]


def reference(rows: list[tuple], schema) -> pa.Table:
    """PySpark's conversion of rows yielded as tuples (its data source worker's)."""
    target = to_arrow_schema(schema, timezone="UTC")
    converters = [LocalDataToArrowConversion._create_converter(f.dataType)
                  for f in schema.fields]
    columns = [[convert(row[i]) for row in rows] for i, convert in enumerate(converters)]
    return pa.Table.from_batches([pa.RecordBatch.from_arrays(columns, schema=target)])


DEFAULT = source.BATCH_UPDATES


@pytest.mark.parametrize("batch_updates", [1, 4, DEFAULT])
def test_arrow_batches_hold_what_pysparks_conversion_makes(tmp_path: Path, monkeypatch,
                                                           batch_updates: int) -> None:
    writer = Writer(batch_size=2)
    for time, row in enumerate(ROWS * 3):
        writer.push(freeze(row, FIELDS), time, 1 + time % 2)
    log = tmp_path / "log.avro"
    with open(log, "wb") as fo:
        write_ocf(fo, writer.finish_through(len(ROWS) * 3),
                  CdcSchema.from_json(cdc_schema_around(RECORD)))
    options = source.Options.parse({"path": str(log)})
    options, data_type = source._data_type(options, [str(log)])
    schema = source.message_type(data_type)
    rows = list(source.read_file(options, str(log)))
    assert any(r[0] for r in rows) and any(r[1] for r in rows)  # updates and statements

    monkeypatch.setattr(source, "BATCH_UPDATES", batch_updates)
    batches = list(source.arrow_batches(iter(rows), schema))
    got, expected = pa.Table.from_batches(batches), reference(rows, schema)
    assert got.schema.equals(expected.schema)
    # Compared as Python values (NaN is never equal to itself in Arrow's comparison); their
    # reprs tell -0.0 from 0.0 and a decimal's scale.
    assert repr(got.to_pylist()) == repr(expected.to_pylist())
    assert got.num_rows == len(rows)
    if batch_updates == 1:
        assert len(batches) == len(rows)  # every message fills a batch
    if batch_updates == DEFAULT:
        assert len(batches) == 1


def test_a_record_becomes_the_rows_tuple_by_name() -> None:
    from changelake.values import Record

    convert = source._record_converter(["a", "b"], [source._same, source._same])
    assert convert(Record((("b", 2), ("a", 1)))) == (1, 2)  # by name, not position
    assert convert(Record((("a", 1),))) == (1, None)  # a field it lacks is null
    assert convert(None) is None
    assert source._record_converter(["a"], [source._same])(Record((("a", 5),))) == (5,)
    assert source._record_converter([], [])(Record(())) == ()
    doubled = source._record_converter(["a", "b"], [lambda x: x * 2, source._same])
    assert doubled(Record((("a", 3), ("b", "x")))) == (6, "x")
