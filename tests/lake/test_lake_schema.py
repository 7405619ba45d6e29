"""Schema evolution: added, removed and widened columns over a feed's life; anything else is a
clear error that leaves the table as it was."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from pyspark.sql.types import (
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from changelake.errors import SchemaError
from changelake.lake import Lake
from changelake.lake.compact import compact
from changelake.protocol import Antichain

pytestmark = pytest.mark.spark


def schema(*cols: tuple[str, object]) -> StructType:
    return StructType([StructField(n, t, True) for n, t in cols]
                      + [StructField("_time", LongType()), StructField("_diff", LongType())])


def df(spark, struct: StructType, rows: list[tuple]):
    return spark.createDataFrame(rows, struct)


def rows(frame) -> Counter:
    return Counter(tuple(r) for r in frame.collect())


def commit(table, spark, struct, data, lo, hi):
    return table.commit(df(spark, struct, data), Antichain([lo]), Antichain([hi]))


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


def name() -> str:
    return f"sc_{uuid.uuid4().hex[:10]}.t"


V1 = schema(("id", LongType()), ("name", StringType()))
V2 = schema(("id", LongType()), ("name", StringType()), ("email", StringType()))
V3 = schema(("id", LongType()), ("email", StringType()))  # `name` removed


def test_added_and_removed_columns_keyed(spark, lake):
    n = name()
    table = lake.create_table(n, StructType(V1.fields[:2]), key=["id"])
    commit(table, spark, V1, [(1, "ann", 0, 1), (2, "bob", 0, 1)], 0, 1)
    # a column is added: old rows read it as null
    changed = commit(table, spark, V2, [(2, "bob", None, 1, -1), (2, "bob", "b@x", 1, 1),
                                        (3, "cy", "c@x", 1, 1)], 1, 2)
    assert changed.schema_changed
    assert spark.table(n).columns == ["id", "name", "email"]
    assert rows(spark.table(n)) == Counter({(1, "ann", None): 1, (2, "bob", "b@x"): 1,
                                            (3, "cy", "c@x"): 1})
    compact(table, 0)  # history before the removal folded into the buckets
    # a column is removed: it stays in the table; rows written since hold null
    commit(table, spark, V3, [(3, "c@x", 2, -1), (3, "cy@x", 2, 1)], 2, 3)
    assert rows(spark.table(n)) == Counter({(1, "ann", None): 1, (2, "bob", "b@x"): 1,
                                            (3, None, "cy@x"): 1})
    # ... and history before the removal still shows it
    assert rows(table.as_of(1)) == Counter({(1, "ann", None): 1, (2, "bob", "b@x"): 1,
                                            (3, "cy", "c@x"): 1})
    assert rows(table.as_of(0)) == Counter({(1, "ann", None): 1, (2, "bob", None): 1})
    compact(table)
    assert rows(spark.table(n)) == Counter({(1, "ann", None): 1, (2, "bob", "b@x"): 1,
                                            (3, None, "cy@x"): 1})
    assert [v.from_time for v in table.state().versions] == [0, 1, 2]


def test_removed_column_unkeyed_matches_on_live_columns(spark, lake):
    n = name()
    table = lake.create_table(n, StructType(V1.fields[:2]))
    commit(table, spark, V1, [(1, "ann", 0, 2), (2, "bob", 0, 1)], 0, 1)
    only_id = schema(("id", LongType()))
    # after `name` is removed, a retraction can only name the live columns
    commit(table, spark, only_id, [(1, 1, -1)], 1, 2)
    assert rows(spark.table(n)) == Counter({(1, None): 1, (2, None): 1})
    assert rows(table.as_of(0)) == Counter({(1, "ann"): 2, (2, "bob"): 1})
    compact(table)
    assert rows(spark.table(n)) == Counter({(1, None): 1, (2, None): 1})


def test_widening_is_accepted(spark, lake):
    n = name()
    narrow = schema(("id", IntegerType()), ("score", FloatType()))
    wide = schema(("id", LongType()), ("score", DoubleType()))
    table = lake.create_table(n, StructType(narrow.fields[:2]), key=["id"], buckets=2)
    commit(table, spark, narrow, [(1, 0.5, 0, 1), (2, 1.5, 0, 1)], 0, 1)
    compact(table)
    commit(table, spark, wide, [(2, 1.5, 1, -1), (2, 2.25, 1, 1), (2**40, 3.0, 1, 1)], 1, 2)
    frame = spark.table(n)
    assert [f.dataType for f in frame.schema.fields] == [LongType(), DoubleType()]
    assert rows(frame) == Counter({(1, 0.5): 1, (2, 2.25): 1, (2**40, 3.0): 1})
    if table.state().storage == "delta":  # delta-rs reads the widened `current` too
        from deltalake import DeltaTable

        from changelake.lake.files import delta_uri, storage_options
        from changelake.lake.layout import current_path

        path = current_path(table.directory)
        data = DeltaTable(delta_uri(path), storage_options=storage_options(path)
                          ).to_pyarrow_table()
        pairs = zip(data["id"].to_pylist(), data["score"].to_pylist(), strict=True)
        assert Counter(pairs) == rows(frame)
    # narrower input than the table is cast up, with no new schema version
    versions = len(table.state().versions)
    commit(table, spark, narrow, [(1, 0.5, 2, -1)], 2, 3)
    assert len(table.state().versions) == versions
    compact(table)
    assert rows(spark.table(n)) == Counter({(2, 2.25): 1, (2**40, 3.0): 1})


def files_of(directory) -> set[str]:
    """The data and log files under a table's directory (not its lock or manifests)."""
    found = {p.relative_to(directory) for p in directory.rglob("*") if p.is_file()}
    return {str(p) for p in found if "_state" not in p.parts and p.name != "_lock"}


@pytest.mark.parametrize("bad, match", [
    (schema(("id", LongType()), ("name", LongType())), "changes type from string to bigint"),
    (schema(("id", IntegerType()), ("name", StringType())), None),  # narrowing: accepted
    (schema(("name", StringType()),), "key column"),
    (schema(("id", LongType()), ("Name", StringType())), "differs only in case"),
    (schema(("id", LongType()), ("_bucket", StringType())), "reserved"),
])
def test_incompatible_changes_are_errors_that_lose_nothing(spark, lake, bad, match):
    n = name()
    table = lake.create_table(n, StructType(V1.fields[:2]), key=["id"])
    commit(table, spark, V1, [(1, "ann", 0, 1)], 0, 1)
    before = table.state()
    files_before = files_of(table.directory)
    row = (*(1 if f.dataType != StringType() else "x" for f in bad.fields[:-2]), 1, 1)
    if match is None:
        commit(table, spark, bad, [row], 1, 2)
        assert table.state().version == before.version + 1
        return
    with pytest.raises(SchemaError, match=match):
        commit(table, spark, bad, [row], 1, 2)
    assert table.state() == before
    assert rows(spark.table(n)) == Counter({(1, "ann"): 1})
    # No file of the refused commit is left: a Hive table's segment, a Delta table's staged
    # one (`_staging/seg/`), or a file in either Delta table.
    assert not [p for seg in table.directory.rglob("seg") for p in seg.iterdir()
                if p.name.startswith("1-")]
    assert not [f for f in files_of(table.directory) if "/seg/1-" in f"/{f}"]  # on a store too
    assert files_of(table.directory) == files_before


def test_segments_of_one_schema_are_read_as_one_source(spark, lake):
    """`sql.group_sources`: the committed view reads the segments of one physical schema as
    one `parquet.` source (a glob of their names), so Spark's per-source schema inference
    runs once per schema, not once per segment; a schema change starts another source, and
    every row is read, now and as of each time. (The Hive format's view: a Delta table has
    no segments.)"""
    from changelake.lake.commit import view_text
    from changelake.lake.identifier import TableIdentifier
    from changelake.lake.sql import SEGMENT_GLOB

    n = name()
    table = lake.create_table(n, StructType(V1.fields[:2]), key=["id"], storage="hive")
    for t in range(3):
        commit(table, spark, V1, [(t, f"v{t}", t, 1)], t, t + 1)
    commit(table, spark, V2, [(0, "v0", None, 3, -1), (0, "v0", "e", 3, 1)], 3, 4)
    commit(table, spark, V2, [(9, "v9", "f", 4, 1)], 4, 5)

    def sources() -> list[str]:
        text = view_text(spark, TableIdentifier.parse(n))
        assert text is not None
        return [part.split("`", 1)[0] for part in text.split("FROM parquet.`")[1:]]

    paths = sources()
    assert [p.rsplit("/seg/", 1)[1] for p in paths] == ["{0-1,1-2,2-3}", "{3-4,4-5}"]
    assert all(SEGMENT_GLOB.fullmatch("seg/" + p.rsplit("/seg/", 1)[1]) for p in paths)
    assert rows(spark.table(n)) == Counter({
        (0, "v0", "e"): 1, (1, "v1", None): 1, (2, "v2", None): 1, (9, "v9", "f"): 1})
    assert rows(table.as_of(2)) == Counter({(t, f"v{t}", None): 1 for t in range(3)})
    # compaction splits a segment at `since`: its later part joins the glob of its schema
    commit(table, spark, V2, [(7, "v7", "g", 5, 1), (7, "v7", "g", 7, -1)], 5, 8)
    compact(table, 6)
    commit(table, spark, V2, [(8, "v8", "h", 8, 1)], 8, 9)
    segments = [p.rsplit("/seg/", 1)[1] for p in sources() if "/seg/" in p]
    version = table.state().version - 1
    assert segments == [f"{{7-8.v{version},8-9}}"]
    assert rows(spark.table(n)) == Counter({
        (0, "v0", "e"): 1, (1, "v1", None): 1, (2, "v2", None): 1, (9, "v9", "f"): 1,
        (8, "v8", "h"): 1})
    assert rows(table.as_of(6))[(7, "v7", "g")] == 1


def test_a_glob_reaches_the_sql_only_as_the_segments_make_it(tmp_path):
    from changelake.errors import LakeError
    from changelake.lake.layout import segment_path
    from changelake.lake.sql import SEGMENT_PATH, source_literal

    for made in (segment_path(0, 5), segment_path(5, None), segment_path(7, 9, 12)):
        assert SEGMENT_PATH.fullmatch(made), made  # every name the layout makes is grouped
    assert source_literal(tmp_path, "seg/{0-1,1-inf.v2}") == f"{tmp_path}/seg/{{0-1,1-inf.v2}}"
    for hostile in ("seg/{0-1}", "seg/{0-1,*}", "seg/{0-1,../x}", "base/{v1,v2}", "seg/*"):
        with pytest.raises(LakeError, match="glob characters"):
            source_literal(tmp_path, hostile)


def test_a_segment_removed_from_under_the_manifest_is_named_not_skipped(spark, lake):
    """A glob of segments would skip a directory that is gone (`sql.group_sources`), so the
    SQL is made only when every segment is there: a read whose SQL the table makes (`as_of`,
    `updates`) and the next commit name the missing one, and the commit leaves the table as
    it was. (The committed view, read by `current()` and plain Spark, stays as it was made.)
    The Hive format's segments: a Delta table has none."""
    from changelake.errors import LakeError
    from changelake.lake.files import remove_tree

    n = name()
    table = lake.create_table(n, StructType(V1.fields[:2]), key=["id"], storage="hive")
    for t in range(3):
        commit(table, spark, V1, [(t, f"v{t}", t, 1)], t, t + 1)
    version = table.state().version
    remove_tree(table.directory / "seg" / "1-2")
    for read in (lambda: table.as_of(2), table.updates):
        with pytest.raises(LakeError, match=r"missing seg/1-2, which the manifest names"):
            read()
    with pytest.raises(LakeError, match=r"missing seg/1-2, which the manifest names"):
        commit(table, spark, V1, [(3, "v3", 3, 1)], 3, 4)
    assert table.state().version == version and table.state().frontier == (3,)
