"""A source's `ALTER TABLE ... ADD COLUMN` / `DROP COLUMN` while Debezium streams (issue 69):
the columns grow with the images (`WindowedConverter._check_columns`), on the Python
specification, the Spark path and the Python path alike, and the lake table follows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.convert import encode_changefeed
from changelake.errors import ChangefeedError
from changelake.spark.changefeed.pipeline import convert_frames
from tests.support.changefeed_cases import python_updates, spark_updates

pytestmark = pytest.mark.spark

_TYPES = {"id": "int32", "s": "string", "n": "int32", "f": "float32"}


def _struct(columns: list[str], types: dict[str, str], field: str) -> dict[str, Any]:
    return {"type": "struct", "optional": True, "field": field, "name": "db.public.t.Value",
            "fields": [{"type": types[c], "optional": c != "id", "field": c}
                       for c in columns]}


def _line(columns: list[str], op: str, lsn: int, before: dict[str, Any] | None,
          after: dict[str, Any] | None, types: dict[str, str] | None = None,
          schema: bool = True) -> bytes:
    types = {**_TYPES, **(types or {})}
    payload = {"op": op, "before": before, "after": after,
               "source": {"connector": "postgresql", "lsn": lsn, "txId": lsn,
                          "snapshot": "false", "schema": "public", "table": "t",
                          "sequence": f'["{lsn - 5}","{lsn}"]'}}
    if not schema:
        return orjson.dumps(payload)
    envelope = {"type": "struct", "name": "db.public.t.Envelope", "optional": False,
                "fields": [_struct(columns, types, "before"), _struct(columns, types, "after"),
                           {"type": "string", "optional": False, "field": "op"}]}
    return orjson.dumps({"schema": envelope, "payload": payload})


def _row(columns: list[str], **values: Any) -> dict[str, Any]:
    return {c: values.get(c) for c in columns}


def alter_feed(schema: bool = True, widen: bool = False) -> list[bytes]:
    """Inserts and updates of (id, s); `ADD COLUMN n` (nullable, then a DEFAULT 7 that later
    images carry); `DROP COLUMN s`. With `widen`, `id` changes from int32 to int64 at the
    drop."""
    a, b, c = ["id", "s"], ["id", "s", "n"], ["id", "n"]
    late = {"id": "int64"} if widen else None
    return [
        _line(a, "c", 110, None, _row(a, id=1, s="x"), schema=schema),
        _line(a, "c", 120, None, _row(a, id=2, s="y"), schema=schema),
        _line(b, "u", 130, _row(b, id=1, s="x"), _row(b, id=1, s="x2", n=7), schema=schema),
        _line(b, "c", 140, None, _row(b, id=3, s="z", n=None), schema=schema),
        _line(b, "u", 150, _row(b, id=2, s="y"), _row(b, id=2, s="y", n=7), schema=schema),
        _line(c, "u", 160, _row(c, id=1, n=7), _row(c, id=1, n=8), late, schema=schema),
        _line(c, "c", 170, None, _row(c, id=4, n=9), late, schema=schema),
        _line(c, "d", 180, _row(c, id=3, n=None), None, late, schema=schema),
    ]


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def padded(updates: Counter[Any], columns: list[str]) -> Counter[Any]:
    """The encoder's rows with every column: a row frozen before a column appeared lacks it
    and reads null there, as in a table whose columns grew."""
    out: Counter[Any] = Counter()
    for (data, time), diff in updates.items():
        values = dict(data)
        out[(tuple((c, values.get(c)) for c in columns), time)] += diff
    return out


def _final(updates: Counter[Any]) -> Counter[Any]:
    rows: Counter[Any] = Counter()
    for (data, _), diff in updates.items():
        rows[data] += diff
    return Counter({k: v for k, v in rows.items() if v})


@pytest.mark.parametrize("keys", [["id"], []], ids=["keyed", "images"])
@pytest.mark.parametrize("schema", [True, False], ids=["schema", "schemaless"])
def test_the_spec_grows_the_columns_with_the_images(tmp_path: Path, keys: list[str],
                                                    schema: bool) -> None:
    """Keyed: the table after ADD and DROP. Without keys only the ADD: a before-image after
    a DROP COLUMN lacks the dropped value, so it retracts the row with null there, which is
    not the row written before (the limitation the guide states: give the key columns)."""
    lines = alter_feed(schema=schema)
    path = _write(tmp_path / "feed.jsonl", lines if keys else lines[:5])
    messages = list(encode_changefeed([path], source="debezium", keys=keys or None,
                                      table_schema=None, close=True, lenient=False))
    final = _final(padded(python_updates(messages), ["id", "s", "n"]))
    assert final == (Counter({(("id", 1), ("s", None), ("n", 8)): 1,
                              (("id", 2), ("s", "y"), ("n", 7)): 1,
                              (("id", 4), ("s", None), ("n", 9)): 1}) if keys else
                     Counter({(("id", 1), ("s", "x2"), ("n", 7)): 1,
                              (("id", 2), ("s", "y"), ("n", 7)): 1,
                              (("id", 3), ("s", "z"), ("n", None)): 1}))


def test_a_table_schema_still_refuses_a_column_beyond_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "feed.jsonl", alter_feed())
    table = {"columns": [{"name": "id", "type": "Int64"}, {"name": "s"}],
             "primary_key": ["id"]}
    with pytest.raises(ChangefeedError, match=r"feed.jsonl, line 3: columns \['n'\] are not "
                                              r"among the table's columns"):
        list(encode_changefeed([path], source="debezium", keys=["id"], table_schema=table,
                               close=True, lenient=False))


@pytest.mark.parametrize("close", [True, False])
@pytest.mark.parametrize("variant", ["keyed", "images", "widen", "schemaless"])
def test_both_paths_convert_a_batch_spanning_the_alter_as_the_spec(
        spark: Any, tmp_path: Path, variant: str, close: bool) -> None:
    """Old and new shapes mixed in one batch: the Spark path (no Python path fallback) and
    the Python path give the specification's updates, every row with the union's columns."""
    keys = [] if variant == "images" else ["id"]
    path = _write(tmp_path / "feed.jsonl", alter_feed(schema=variant != "schemaless",
                                                      widen=variant == "widen"))
    messages = list(encode_changefeed([path], source="debezium", keys=keys or None,
                                      table_schema=None, close=close, lenient=False))
    expected = padded(python_updates(messages), ["id", "s", "n"])
    assert expected
    for python_path in (False, True):
        got = convert_frames(spark, [path], "debezium", keys, None, close=close,
                             python_path=python_path)
        assert got.path == ("python-udf" if python_path else "jvm"), got.reason
        assert got.changes.schema["data"].dataType.fieldNames() == ["id", "s", "n"]
        assert spark_updates(got.changes) == expected, python_path


def test_a_kind_change_mid_batch_is_refused_at_its_line(spark: Any, tmp_path: Path) -> None:
    """`ALTER COLUMN n TYPE text` while streaming: not a widening; the batch is refused at the
    first line whose value does not fit the column, nothing converted."""
    b = ["id", "s", "n"]
    lines = [*alter_feed()[:5],
             _line(b, "c", 160, None, _row(b, id=5, s="q", n="seven"), {"n": "string"})]
    path = _write(tmp_path / "feed.jsonl", lines)
    with pytest.raises(ChangefeedError, match=r"feed.jsonl, line 6: "):
        convert_frames(spark, [path], "debezium", ["id"], None, close=True)


def test_ingest_follows_add_and_drop_column_with_as_of(spark: Any, tmp_path: Path) -> None:
    """Two ingests of the feed (the second re-delivered from the start, as Debezium does
    after a restart): the first's batch spans the ADD COLUMN, the second's the DROP. The
    table gains `n` (null in the rows before), keeps `s` (null in the rows after), and AS OF
    a time before the ALTER shows the old rows."""
    import uuid

    from changelake.lake import Lake, ingest

    lake = Lake(spark, tmp_path / "lake")
    name = f"alter_{uuid.uuid4().hex[:8]}.t"
    lines = alter_feed()
    first = ingest.ingest(lake, name, [_write(tmp_path / "a.jsonl", lines[:4])], key=["id"],
                          source="debezium")
    assert first.frontier == [135]  # times are the sequence's first LSN: lsn - 5
    table = lake.table(name)
    assert {tuple(r) for r in spark.table(name).collect()} == {
        (1, "x2", 7), (2, "y", None)}
    last = ingest.ingest(lake, name, [_write(tmp_path / "b.jsonl", lines)], key=["id"],
                         source="debezium", close=True)
    assert last.commit.lower == 135
    assert [f.name for f in spark.table(name).schema.fields] == ["id", "s", "n"]
    assert {tuple(r) for r in spark.table(name).collect()} == {
        (1, None, 8), (2, "y", 7), (4, None, 9)}
    assert {tuple(r) for r in table.as_of(120).collect()} == {(1, "x", None), (2, "y", None)}
    assert {tuple(r) for r in table.as_of(140).collect()} == {
        (1, "x2", 7), (2, "y", None), (3, "z", None)}
    # The table equals the specification's rows of the whole feed.
    messages = list(encode_changefeed([tmp_path / "b.jsonl"], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    final = _final(padded(python_updates(messages), ["id", "s", "n"]))
    assert Counter(tuple(v for _, v in row) for row in final.elements()) == Counter(
        tuple(r) for r in spark.table(name).collect())


def test_kafka_ingest_follows_the_alter_then_refuses_a_kind_change(spark: Any,
                                                                   tmp_path: Path) -> None:
    """`ingest --kafka --from debezium` (the Spark path alone) over a topic that grows: a run
    whose records span the ADD COLUMN, one spanning the DROP; the table equals the file
    ingest's. Then a record whose `n` is text (`ALTER COLUMN n TYPE text`): refused,
    named by topic, partition and offset, nothing committed."""
    import uuid

    from changelake.kafka import MockCluster
    from changelake.lake import Lake, ingest
    from changelake.lake.kafka_changefeed import ingest_changefeed_topics
    from tests.kafka.test_kafka_changefeed import producer
    from tests.support.kafka_helpers import new_topic

    lake = Lake(spark, tmp_path / "lake")
    lines = alter_feed()
    name, ref = (f"{p}_{uuid.uuid4().hex[:8]}.t" for p in ("k", "ref"))
    ingest.ingest(lake, ref, [_write(tmp_path / "all.jsonl", lines)], key=["id"],
                  source="debezium", close=True)
    with MockCluster(brokers=1) as cluster:
        topic = new_topic(cluster, 1)

        def produce(chosen: list[bytes]) -> None:
            out = producer(cluster)
            for value in chosen:
                out.produce(topic, value=value, partition=0)
            assert out.flush(30) == 0

        produce(lines[:4])
        ingest_changefeed_topics(lake, name, cluster.bootstrap, topic, source="debezium",
                                 key=["id"])
        assert [f.name for f in spark.table(name).schema.fields] == ["id", "s", "n"]
        produce(lines[4:])
        ingest_changefeed_topics(lake, name, cluster.bootstrap, topic, source="debezium",
                                 key=["id"])
        # Without transaction metadata the last position (175, the delete) waits.
        assert {tuple(r) for r in spark.table(name).collect()} == {
            (1, None, 8), (2, "y", 7), (3, "z", None), (4, None, 9)}
        commits = lake.table(name).history().count()
        b = ["id", "s", "n"]
        produce([_line(b, "c", 190, None, _row(b, id=5, s="q", n="seven"), {"n": "string"})])
        with pytest.raises(ChangefeedError, match=f"topic {topic} partition 0, offset 8: "):
            ingest_changefeed_topics(lake, name, cluster.bootstrap, topic, source="debezium",
                                     key=["id"], close=True)
        assert lake.table(name).history().count() == commits
        got, want = ({tuple(r) for r in lake.table(t).as_of(170).collect()}
                     for t in (name, ref))
        assert got == want


def test_a_float_widened_and_a_column_made_not_null_stay_on_the_spark_path(
        spark: Any, tmp_path: Path) -> None:
    """`ALTER COLUMN f TYPE double precision` (float32 to float64) and `SET NOT NULL` on `s`
    (its field's `optional` changes) mid-batch: read alike, so the Spark path converts the
    batch, to the specification's updates."""
    a = ["id", "s", "f"]
    narrow, wide = {"f": "float32"}, {"f": "float64"}
    lines = [_line(a, "c", 110, None, _row(a, id=1, s="x", f=0.5), narrow),
             _line(a, "c", 120, None, _row(a, id=2, s="y", f=1.5), narrow)]
    late = orjson.loads(_line(a, "u", 130, _row(a, id=1, s="x", f=0.5),
                              _row(a, id=1, s="x", f=2.25), wide))
    for image in late["schema"]["fields"][:2]:
        image["fields"][1]["optional"] = False
    path = _write(tmp_path / "feed.jsonl", [*lines, orjson.dumps(late)])
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False))
    got = convert_frames(spark, [path], "debezium", ["id"], None, close=True)
    assert got.path == "jvm", got.reason
    assert spark_updates(got.changes) == python_updates(messages)


def test_cli_ingest_takes_the_alter_and_refuses_a_kind_change_in_one_line(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`changelake ingest --from debezium` (in process, on the test's session): the feed with
    ADD and DROP COLUMN is ingested; a later file whose `n` is text (`ALTER COLUMN n TYPE
    text`) exits 2 with one line naming its file, line and the rule; nothing committed."""
    from click.testing import CliRunner

    from changelake.cli import ingest as cli_ingest
    from changelake.cli import main
    from changelake.lake import Lake

    def shared_lake(lake_dir: Any, metastore_uri: Any, master: Any, conf: Any,
                    table_format: Any = None, *, existing: bool = False) -> Lake:
        return Lake(spark, lake_dir, storage=table_format)

    monkeypatch.setattr(cli_ingest, "open_lake", shared_lake)
    monkeypatch.setattr(type(spark), "stop", lambda self: None)
    lake_dir = tmp_path / "lake"
    name = "alter_cli.t"

    def ingest(path: Path) -> Any:
        return CliRunner().invoke(main, ["ingest", "--lake", str(lake_dir), "--table", name,
                                         "--key", "id", "--from", "debezium", str(path)],
                                  catch_exceptions=False)

    done = ingest(_write(tmp_path / "feed.jsonl", alter_feed()))
    assert done.exit_code == 0, done.output
    rows = {tuple(r) for r in spark.table(name).collect()}
    assert rows == {(1, None, 8), (2, "y", 7), (3, "z", None), (4, None, 9)}
    b = ["id", "n"]
    bad = _write(tmp_path / "bad.jsonl", [
        *alter_feed(), _line(b, "c", 190, None, _row(b, id=5, n="seven"), {"n": "string"}),
        _line(b, "c", 200, None, _row(b, id=6, n="six"), {"n": "string"})])
    refused = ingest(bad)
    assert refused.exit_code == 2, refused.output
    err = refused.output.strip()
    assert "\n" not in err and "bad.jsonl, line 9: column n of the after image is 'seven', " \
        "not a bigint" in err, err
    assert {tuple(r) for r in spark.table(name).collect()} == rows
