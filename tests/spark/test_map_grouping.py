"""Rows with maps, grouped without losing a map's null values (`spark.map_grouping`).

Spark's own grouping by a map turns its null values into 0s; each test here fails with the
rows grouped the plain way (checked when the module was written)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from changelake.formats.materialize import CdcSchema, cdc_schema_around, write_ocf
from changelake.lake import Lake, api, ingest
from changelake.lake.compact import compact
from changelake.protocol import Antichain, Writer
from changelake.spark.map_grouping import grouping_sql, restored_sql
from changelake.values import freeze

pytestmark = pytest.mark.spark

_ROWS = """
    SELECT * FROM VALUES
      (1, map('x', 1L, 'y', NULL), named_struct('m', map('a', NULL, 'b', 2L), 'n', 3L),
       array(map('p', NULL), NULL), map('outer', map('inner', NULL))),
      (1, map('y', NULL, 'x', 1L), named_struct('m', map('b', 2L, 'a', NULL), 'n', 3L),
       array(map('p', NULL), NULL), map('outer', map('inner', NULL))),
      (2, NULL, NULL, NULL, map('outer', NULL))
    AS t(id, m, s, a, mm)"""


def _plain(row) -> dict:
    return row.asDict(recursive=True)


def test_rows_with_maps_group_as_they_are(spark, tmp_path):
    """Maps at the top, in a struct, in an array and in a map's values, read from Parquet:
    grouped by their sorted entries, two rows whose maps hold the same entries (in another
    order) are one group, and every map comes back as it was, null values included, in the
    type it had."""
    spark.sql(_ROWS).write.parquet(str(tmp_path / "rows"))
    frame = spark.read.parquet(str(tmp_path / "rows"))
    kinds = {f.name: f.dataType for f in frame.schema.fields}
    keyed = frame.selectExpr(*[f"{grouping_sql(k, c)} AS {c}" for c, k in kinds.items()])
    counted = keyed.groupBy(*kinds).count()
    back = counted.selectExpr(*[f"{restored_sql(k, c)} AS {c}" for c, k in kinds.items()],
                              "count")
    assert back.drop("count").schema == frame.schema
    got = sorted((_plain(r) for r in back.collect()), key=lambda r: r["id"])
    assert got == [
        {"id": 1, "m": {"x": 1, "y": None}, "s": {"m": {"a": None, "b": 2}, "n": 3},
         "a": [{"p": None}, None], "mm": {"outer": {"inner": None}}, "count": 2},
        {"id": 2, "m": None, "s": None, "a": None, "mm": {"outer": None}, "count": 1},
    ]


def test_decode_and_encode_keep_the_null_values_of_maps(spark, tmp_path):
    from changelake.spark.decoder import decode
    from changelake.spark.encoder import encode, to_messages

    spark.sql(f"SELECT named_struct('id', id, 'm', m, 's', s, 'a', a, 'mm', mm) AS data, "
              f"0L AS time, 1L AS diff FROM ({_ROWS})").write.parquet(str(tmp_path / "u"))
    updates = spark.read.parquet(str(tmp_path / "u"))
    progress = spark.sql("SELECT array(0L) AS lower, CAST(array() AS ARRAY<BIGINT>) AS upper, "
                         "array(named_struct('time', 0L, 'count', 2L)) AS counts")
    expected = {1: {"id": 1, "m": {"x": 1, "y": None}, "s": {"m": {"a": None, "b": 2}, "n": 3},
                    "a": [{"p": None}, None], "mm": {"outer": {"inner": None}}},
                2: {"id": 2, "m": None, "s": None, "a": None, "mm": {"outer": None}}}
    with decode(updates, progress) as decoded:
        assert decoded.frontier == Antichain()
        rows = {r["data"]["id"]: r for r in map(_plain, decoded.updates.collect())}
        assert {k: r["data"] for k, r in rows.items()} == expected
        # The two rows whose maps hold the same entries are one update, delivered twice.
        assert rows[1]["diff"] == rows[2]["diff"] == 1
        assert decoded.updates.schema["data"] == updates.schema["data"]
        messages = list(to_messages(encode(decoded.updates, None).collect()))
    written = {u[0].get("id"): u for m in messages if hasattr(m, "updates") for u in m.updates}
    assert {k: (u[1], u[2]) for k, u in written.items()} == {1: (0, 1), 2: (0, 1)}
    assert written[1][0].get("m").get("y") is None
    assert written[1][0].get("mm").get("outer").get("inner") is None


def _map_log(path: Path, versions: list[list[tuple[dict, int, int]]]) -> list[Path]:
    """Materialize CDC logs of rows with a map of nullable values: one file per version,
    each finishing the times up to its last."""
    record = {"type": "record", "name": "row", "fields": [
        {"name": "k", "type": "long"},
        {"name": "m", "type": ["null", {"type": "map", "values": ["null", "long"]}]}]}
    schema = CdcSchema.from_json(cdc_schema_around(record))
    writer = Writer(batch_size=2)
    files = []
    for i, updates in enumerate(versions):
        for row, time, diff in updates:
            writer.push(freeze(row, ("k", "m")), time, diff)
        files.append(path / f"log-{i}.avro")
        with files[-1].open("wb") as out:
            write_ocf(out, writer.finish_through(max(t for _, t, _ in updates)), schema)
    return files


def test_an_unkeyed_table_with_maps_exports_to_delta_incrementally(spark, tmp_path):
    """The incremental export of an unkeyed table groups and matches whole rows: with a map
    among them it failed ("`<=>` does not support ordering on type MAP"), and would have
    lost the null values."""
    import deltalake

    from changelake.lake.export.delta import export_to_delta

    one, two = {"k": 1, "m": {"x": 1, "y": None}}, {"k": 2, "m": {"y": None}}
    logs = _map_log(tmp_path, [[(one, 0, 1), (two, 1, 1)],
                               [(one, 2, -1), ({"k": 3, "m": {"z": None}}, 2, 1)]])
    lake = Lake(spark, tmp_path / "lake")
    name = f"maps_{uuid.uuid4().hex[:8]}.unkeyed"
    target = tmp_path / "delta"
    ingest.ingest(lake, name, logs[:1])
    export_to_delta(lake, name, target)
    ingest.ingest(lake, name, logs)
    result = export_to_delta(lake, name, target)
    assert (result.inserted, result.deleted) == (1, 1)
    got = sorted(deltalake.DeltaTable(str(target)).to_pyarrow_table().to_pylist(),
                 key=lambda r: r["k"])
    assert [(r["k"], dict(r["m"])) for r in got] == [(2, {"y": None}), (3, {"z": None})]


def test_lake_tables_keep_the_null_values_of_maps(spark, tmp_path):
    """A Materialize CDC log with a map of nullable values, ingested into a keyed table (its
    decode groups the rows) and an unkeyed one (its commit, view and compaction group them):
    every read gives the nulls back, before and after a compaction."""
    record = {"type": "record", "name": "row", "fields": [
        {"name": "k", "type": "long"},
        {"name": "m", "type": ["null", {"type": "map", "values": ["null", "long"]}]}]}
    schema = CdcSchema.from_json(cdc_schema_around(record))
    writer = Writer(batch_size=2)
    rows = [{"k": 1, "m": {"x": 1, "y": None}}, {"k": 2, "m": {"y": None}}, {"k": 3, "m": None}]
    for time, row in enumerate(rows):
        writer.push(freeze(row, ("k", "m")), time, 1)
    log = tmp_path / "log.avro"
    with log.open("wb") as out:
        write_ocf(out, [*writer.finish_through(len(rows)), *writer.close()], schema)
    lake = Lake(spark, tmp_path / "lake")
    prefix = f"maps_{uuid.uuid4().hex[:8]}"
    for name, key in ((f"{prefix}.keyed", ["k"]), (f"{prefix}.unkeyed", [])):
        ingest.ingest(lake, name, [Path(log)], key=key)
        assert sorted(api.snapshot(lake, name), key=lambda r: r["k"]) == rows, name
        assert sorted(api.snapshot(lake, name, as_of=1), key=lambda r: r["k"]) \
            == rows[:2], name
        compact(lake.table(name))
        assert sorted(api.snapshot(lake, name), key=lambda r: r["k"]) == rows, name
