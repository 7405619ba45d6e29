"""Ingest jobs end to end: Materialize CDC files decoded on Spark, and a Debezium changefeed
converted on Spark, committed exactly once; snapshot and status as the CLI prints them."""

from __future__ import annotations

import base64
import json
import random
import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from changelake.convert import encode_changefeed
from changelake.errors import ChangefeedError, LakeError, SchemaError
from changelake.formats.materialize import CdcSchema, write_json_lines
from changelake.lake import Lake, api, ingest
from changelake.values import freeze
from tests.kafka.test_kafka_changefeed import Feed, pg_feed
from tests.support.changefeed_cases import python_updates
from tests.support.lake_history import keyed_history, messages, state_at
from tests.support.paths import SAMPLES

pytestmark = pytest.mark.spark

FIELDS = ("id", "name", "amount")
CDC = CdcSchema.for_fields([
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"]},
    {"name": "amount", "type": "long"},
])


def write_cdc(path: Path, history: list, rng: random.Random, last_time: int) -> Path:
    frozen = [(freeze(dict(zip(FIELDS, row, strict=True)), FIELDS), t, d)
              for row, t, d in history]
    with open(path, "wb") as fo:
        write_json_lines(fo, messages(frozen, 3, rng, last_time), CDC)
    return path


@pytest.fixture
def lake(spark, lake_root) -> Lake:
    return Lake(spark, lake_root)


@pytest.fixture
def hive_lake(spark, lake_at) -> Lake:
    """A lake of Hive-format tables, for the tests that look at its files (a Delta table's
    files and their clean-up on a failed write are `test_lake_delta.py`'s); on S3 too."""
    return Lake(spark, lake_at("hive-lake"), storage="hive")


def test_ingest_materialize_exactly_once(spark, lake, tmp_path):
    rng = random.Random(11)
    history = keyed_history(rng, 12, 15, 4)
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(CDC.avro))
    early = write_cdc(tmp_path / "early.jsonl", [u for u in history if u[1] < 6], rng, 5)
    full = write_cdc(tmp_path / "full.jsonl", history, rng, 11)
    name = f"in_{uuid.uuid4().hex[:8]}.t"

    def persisted() -> set[int]:
        """The cached RDDs but Delta's own (a Delta table's snapshot state, which Delta
        caches for its next commit: `Delta Table State #N - path`)."""
        cached = spark.sparkContext._jsc.getPersistentRDDs()
        return {k for k in cached.keySet()
                if not str(cached.get(k).name() or "").startswith("Delta Table State")}

    cached = persisted()
    first = ingest.ingest(lake, name, [early], key=["id"], schema=schema_file)
    assert first.created and first.frontier == [6]
    # The decoder's cached aggregate is released once the commit has read it. (Compared as
    # sets: the context's cleaner may drop an earlier test's checkpoints meanwhile.)
    assert not persisted() - cached
    table = lake.table(name)
    assert Counter(tuple(r) for r in spark.table(name).collect()) == state_at(history, 5,
                                                                              keyed=True)
    # the early part again, then everything (overlapping): nothing doubled
    again = ingest.ingest(lake, name, [early], key=["id"], schema=schema_file)
    assert again.commit.skipped
    rest = ingest.ingest(lake, name, [early, full], key=["id"], schema=schema_file)
    assert rest.commit.lower == 6 and rest.frontier == [12]
    assert Counter(tuple(r) for r in spark.table(name).collect()) == state_at(history, 11,
                                                                              keyed=True)
    snap = list(api.snapshot(lake, name, as_of=5))
    assert Counter((r["id"], r["name"], r["amount"]) for r in snap) == state_at(history, 5,
                                                                               keyed=True)
    result = api.compact(lake, name)
    assert result.since == 11 and table.state().since == 11
    [status] = [s for s in api.status(lake) if s.name == name]
    assert (status.frontier, status.since, status.segments) == ([12], 11, 0)
    assert status.rows == len(state_at(history, 11, keyed=True)) and status.files > 0


def debezium_line(op: str, before: dict | None, after: dict | None, lsn: int, tx: int) -> str:
    source = {"version": "2.7", "connector": "postgresql", "name": "pg", "ts_ms": 1,
              "snapshot": False, "db": "postgres", "schema": "public", "table": "items",
              "txId": tx, "lsn": lsn, "xmin": None}
    return json.dumps({"before": before, "after": after, "source": source, "op": op,
                       "ts_ms": 1})


def test_ingest_debezium(spark, lake, tmp_path):
    lines = [
        debezium_line("c", None, {"id": 1, "name": "ann"}, 100, 1),
        debezium_line("c", None, {"id": 2, "name": "bob"}, 200, 2),
        debezium_line("u", {"id": 1, "name": "ann"}, {"id": 1, "name": "anne"}, 300, 3),
        debezium_line("d", {"id": 2, "name": "bob"}, None, 400, 4),
        debezium_line("c", None, {"id": 3, "name": "cy"}, 500, 5),
    ]
    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n".join(lines) + "\n")
    name = f"dbz_{uuid.uuid4().hex[:8]}.t"
    report = ingest.ingest(lake, name, [feed], key=["id"], source="debezium")
    # without transaction metadata the last position seen (500) is not known to be finished
    assert report.frontier == [500]
    assert {tuple(r) for r in spark.table(name).collect()} == {(1, "anne")}
    again = ingest.ingest(lake, name, [feed], key=["id"], source="debezium")
    assert again.commit.skipped
    # the feed goes on (delivered again from the start): position 500 is now finished
    more = tmp_path / "more.jsonl"
    more.write_text("\n".join([*lines, debezium_line("u", {"id": 3, "name": "cy"},
                                                      {"id": 3, "name": "cyd"}, 600, 6),
                               debezium_line("c", None, {"id": 4, "name": "di"}, 700, 7)])
                    + "\n")
    later = ingest.ingest(lake, name, [more], key=["id"], source="debezium")
    assert later.frontier == [700] and later.commit.lower == 500
    assert {tuple(r) for r in spark.table(name).collect()} == {(1, "anne"), (3, "cyd")}


def assert_the_encoders(table, feed: Path | list[Path], columns: list[str]) -> None:
    """The table's updates are those the encoder makes of the closed Debezium `feed` (its
    files, in reading order)."""
    got: Counter = Counter()
    for row in table.updates().collect():
        got[tuple((c, row[c]) for c in columns), row["_time"]] += row["_diff"]
    files = feed if isinstance(feed, list) else [feed]
    assert got == python_updates(encode_changefeed(files, source="debezium", keys=["id"],
                                                   table_schema=None, close=True,
                                                   lenient=False))


def test_a_changefeed_batch_is_written_in_files_of_many_keys(spark, hive_lake, tmp_path):
    """The keyed conversion's partitions are many and small (at least the session's), and the
    commit writes the updates as they come: coalesced (`conversion.files_for`), a batch this
    small is as many files as the session's default parallelism, not a file per key
    partition."""
    lake = hive_lake
    from changelake.spark.changefeed.conversion import files_for
    from changelake.spark.settings import settings

    lines = [debezium_line("c", None, {"id": k, "name": f"n{k}"}, 100 + k, k)
             for k in range(1, 65)]
    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n".join(lines) + "\n")
    name = f"files_{uuid.uuid4().hex[:8]}.t"
    partitions = 4 * spark.sparkContext.defaultParallelism
    with settings(spark, {"spark.sql.shuffle.partitions": str(partitions)}):
        report = ingest.ingest(lake, name, [feed], key=["id"], source="debezium",
                                 close=True)
    assert report.commit.written == 64
    table = lake.table(name)
    written = [p for f in table.state().files for p in (table.directory / f.path).rglob(
        "*.parquet")]
    assert len(written) == files_for(spark, 64, partitions) == \
        spark.sparkContext.defaultParallelism
    assert_the_encoders(table, feed, ["id", "name"])


def test_a_check_the_commit_settles_undoes_its_write_for_the_python_path(spark, hive_lake, tmp_path,
                                                                    caplog):
    """The keyed conversion is checked by the commit's own write (`DeferredChecks`), not by
    a checkpoint before it. Where the check fails (a key written twice at one position with
    other rows: a tie the Spark path leaves to the old one), what that write made is not
    committed, and the Python path's updates are (the encoder's), in a table of the columns the
    Python path decides (the first attempt created it). The same feed again (nothing new to
    write) has its check settled by a job of its own, and still goes to the Python path."""
    lake = hive_lake
    from changelake.spark.changefeed import dispatch, pipeline
    from changelake.spark.changefeed.keyed import TIED

    lines = [debezium_line("c", None, {"id": 1, "name": "ann"}, 100, 1),
             debezium_line("c", None, {"id": 2, "name": "bob"}, 200, 2),
             debezium_line("c", None, {"id": 2, "name": "bo"}, 200, 2),
             debezium_line("u", None, {"id": 1, "name": "anne"}, 300, 3)]
    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n".join(lines) + "\n")
    name = f"tie_{uuid.uuid4().hex[:8]}.t"
    with caplog.at_level("INFO", logger=dispatch.__name__):
        report = ingest.ingest(lake, name, [feed], key=["id"], source="debezium",
                                 close=True)
    assert f"on the Python path: {TIED}" in caplog.text
    table = lake.table(name)
    assert report.commit.version == table.state().version
    assert [f.rows for f in table.state().files if f.rows] == [report.commit.written]
    assert_the_encoders(table, feed, ["id", "name"])
    old = pipeline.convert_frames(spark, [feed], "debezium", ["id"], None, close=True,
                                  python_path=True)
    assert table.schema == old.changes.schema["data"].dataType
    caplog.clear()
    with caplog.at_level("INFO", logger=dispatch.__name__):
        again = ingest.ingest(lake, name, [feed], key=["id"], source="debezium",
                                close=True)
    assert again.commit.skipped and f"on the Python path: {TIED}" in caplog.text


def _spaced(value: bytes | None) -> bytes | None:
    """A Debezium value with its `source.sequence` written with spaces (`[null, "5000"]`, as a
    JSON writer other than Debezium's may write it): the encoder reads it, the Spark path reads
    only Debezium's own shape and hands such a batch to the Python path."""
    if value is None:
        return None
    event = json.loads(value)
    source = (event.get("payload") or event)["source"]
    source["sequence"] = json.dumps(json.loads(source["sequence"]))
    return json.dumps(event).encode()


def _xid_of(value: bytes | None) -> int | None:
    if value is None:
        return None
    event = json.loads(value)
    return (event.get("payload") or event)["source"]["txId"]


def _inside_a_transaction(feed: Feed, start: int) -> int:
    """The first index from `start` on whose event continues the transaction of the event
    before it: a cut there leaves that transaction half read."""
    for i in range(max(start, 1), len(feed.events)):
        before, value = _xid_of(feed.events[i - 1][1]), _xid_of(feed.events[i][1])
        if before is not None and before == value != 90:
            return i
    raise AssertionError("no transaction of two events after the start")


def _feed_files(feed: Feed, directory: Path, events: list[int], ends_of: list[int]) -> list[Path]:
    """The transaction file (the BEGIN and END of each transaction whose last event is among
    `ends_of`, indexes of `feed.events`), then the table's file (the events of `events`, in
    that order), as a connector's topics of them would be written out."""
    directory.mkdir()
    last = {_xid_of(v): i for i, (_, v) in enumerate(feed.events) if v is not None}
    chosen = set(ends_of)
    tx = [v for v in feed.transactions
          if last.get(int(json.loads(v)["id"].split(":")[0])) in chosen]
    items = [feed.events[i][1] or b"null" for i in events]
    (directory / "transactions.jsonl").write_bytes(b"".join(v + b"\n" for v in tx))
    (directory / "items.jsonl").write_bytes(b"".join(v + b"\n" for v in items))
    return [directory / "transactions.jsonl", directory / "items.jsonl"]


@pytest.mark.parametrize("resend_metadata", [False, True])
def test_a_replayed_tail_lets_the_frontier_advance_on_the_python_path(
        spark, lake, tmp_path, caplog, resend_metadata: bool) -> None:
    """The file path's twin of the Kafka test
    (`test_a_replayed_tail_after_a_cut_transaction_lets_the_frontier_advance`), through the
    Python path (every `sequence` written with spaces): the first ingest is cut inside a
    transaction; the next input resumes at that transaction's first event and goes to the end,
    and a connector restart has re-sent the tail from inside an earlier transaction (with or
    without its BEGIN and END). That transaction is behind the committed frontier, its first
    events (and, re-sent, its END) incomplete: it must hold no frontier back, or every later
    ingest stays below the committed frontier and commits nothing. The next ingest reaches the
    end of the feed, and the table holds the encoder's updates of the whole feed."""
    from changelake.spark.changefeed import dispatch

    feed = pg_feed(random.Random(88).randrange(1 << 30), transactions=12)
    feed.events = [(key, _spaced(value)) for key, value in feed.events]
    n = len(feed.events)
    replay_from = _inside_a_transaction(feed, n // 3)
    cut = _inside_a_transaction(feed, 2 * n // 3)
    cut_xid = _xid_of(feed.events[cut][1])
    assert _xid_of(feed.events[replay_from][1]) != cut_xid
    resume = min(i for i, (_, v) in enumerate(feed.events) if _xid_of(v) == cut_xid)
    whole = _feed_files(feed, tmp_path / "whole", list(range(n)), list(range(n)))
    first_input = _feed_files(feed, tmp_path / "first", list(range(cut)), list(range(cut)))
    replayed = list(range(replay_from, n))
    rest = _feed_files(feed, tmp_path / "rest", list(range(resume, n)) + replayed,
                       list(range(resume, n)) + (replayed if resend_metadata else []))
    name = f"replay_{uuid.uuid4().hex[:8]}.t"
    end = feed.times[-1] + 1

    with caplog.at_level("INFO", logger=dispatch.__name__):
        first = ingest.ingest(lake, name, first_input, key=["id"], source="debezium")
        assert first.frontier[0] < end
        second = ingest.ingest(lake, name, rest, key=["id"], source="debezium")
        assert second.frontier == [end]  # every transaction is complete
        assert lake.table(name).state().upper == end
        # The same input again: all of it before the committed frontier, nothing to commit
        # (its frontier is its high water, as on the Spark path: no transaction counts).
        again = ingest.ingest(lake, name, rest, key=["id"], source="debezium")
        assert again.commit.written == 0 and again.frontier[0] <= end
    # every change's source.sequence is not in Debezium's shape: Java leaves it
    assert len(re.findall(r"on the Python path: unsupported: [0-9]+ line\(s\) the Java line "
                          r"reader leaves", caplog.text)) == 3
    table = lake.table(name)
    assert table.state().upper == end
    assert_the_encoders(table, whole, ["id", "name", "v"])


def test_a_write_that_raises_leaves_no_files_and_commits_nothing(spark, hive_lake, tmp_path):
    """`TableWriter.commit`'s `write` runs the write; where it raises (a deferred check that
    failed), the files it made are removed and no version is committed."""
    lake = hive_lake
    name = f"undo_{uuid.uuid4().hex[:8]}.t"
    rows = spark.createDataFrame([(1, "a", 0, 1)], "id long, name string, _time long, "
                                                   "_diff long")
    lake.create_table(name, rows.drop("_time", "_diff").schema, key=["id"])
    table = lake.table(name)
    before = table.state()
    written: list[Path] = []

    def failing(action):
        action()
        written.extend(p for p in table.directory.rglob("*.parquet"))
        raise RuntimeError("the check failed")

    with table.writer() as writer, pytest.raises(RuntimeError, match="the check failed"):
        writer.commit(rows, [0], [1], write=failing)
    assert written and not any(p.exists() for p in written)
    assert table.state().version == before.version
    assert spark.table(name).count() == 0


PRICE = {"field": "price", "type": "bytes", "optional": True,
         "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}


def priced_line(op: str, key: int, price: str, lsn: int) -> str:
    """A Debezium event with its Connect schema: `price` a Decimal, base64 two's complement."""
    image = {"type": "struct", "optional": True,
             "fields": [{"field": "id", "type": "int64"}, PRICE]}
    line = json.loads(debezium_line(op, None, {"id": key, "price": price}, lsn, lsn))
    schema = {"type": "struct", "fields": [{**image, "field": "before"},
                                            {**image, "field": "after"}]}
    return json.dumps({"schema": schema, "payload": line})


def _cents(unscaled: int, width: int) -> str:
    return base64.b64encode(unscaled.to_bytes(width, "big", signed=True)).decode()


@pytest.mark.parametrize("bad", ["wide", "not base64"])
def test_a_value_spark_refuses_in_the_commits_write_goes_to_the_python_path(
        spark, hive_lake, tmp_path, caplog, bad):
    """A value the deferred conversion's own job refuses (read against the columns' types in
    the commit's write): a decimal wider than 8 bytes, which the Python path reads exactly, or
    text that is no base64, which it refuses naming the line. Either way no file of the
    refused write remains, and the Python path commits its updates (the encoder's) or nothing."""
    lake = hive_lake
    from changelake.spark.changefeed import dispatch

    odd = _cents(10**20 + 7, 9) if bad == "wide" else "not base64!"
    lines = [priced_line("c", 1, _cents(499, 2), 100), priced_line("c", 2, odd, 200),
             priced_line("u", 1, _cents(2499, 2), 300)]
    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n".join(lines) + "\n")
    name = f"refused_{uuid.uuid4().hex[:8]}.t"
    files_before = set(lake.root.rglob("*.parquet"))
    with caplog.at_level("INFO", logger=dispatch.__name__):
        if bad == "wide":
            report = ingest.ingest(lake, name, [feed], key=["id"], source="debezium",
                                     close=True)
        else:
            with pytest.raises(ChangefeedError, match=r"feed\.jsonl, line 2: after\.price: "):
                ingest.ingest(lake, name, [feed], key=["id"], source="debezium", close=True)
    assert "on the Python path: bad: a value Spark refuses" in caplog.text
    if bad == "not base64":
        assert set(lake.root.rglob("*.parquet")) == files_before
        assert not lake.exists(name) or not lake.table(name).state().files
        return
    table = lake.table(name)
    assert [f.rows for f in table.state().files if f.rows] == [report.commit.written]
    committed = {p for f in table.state().files for p in (table.directory / f.path).rglob("*")}
    assert set(table.directory.rglob("*.parquet")) <= committed  # the refused write's: gone
    assert_the_encoders(table, feed, ["id", "price"])


def test_a_changefeed_without_row_images_creates_no_table_and_changes_none(spark, lake,
                                                                           tmp_path):
    """Heartbeats, tombstones and transaction boundaries carry no row: into a new table they
    are refused in one line (nothing says its columns), into an existing one they commit
    nothing, as the encoder converts them to nothing."""
    from changelake.errors import InputError

    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"ts_ms": 5}\nnull\n{"status": "BEGIN", "id": "9", "event_count": null}\n')
    name = f"dbz_{uuid.uuid4().hex[:8]}.t"
    with pytest.raises(InputError, match=rf"no row images in {re.escape(str(empty))} \(.*"
                                         r"or nothing\), and no --schema"):
        ingest.ingest(lake, name, [empty], key=["id"], source="debezium")
    assert not spark.catalog.tableExists(name)
    feed = tmp_path / "feed.jsonl"
    feed.write_text(debezium_line("c", None, {"id": 1, "name": "ann"}, 100, 1) + "\n")
    ingest.ingest(lake, name, [feed], key=["id"], source="debezium", close=True)
    report = ingest.ingest(lake, name, [empty], key=["id"], source="debezium", close=True)
    assert report.commit.written == 0
    assert {tuple(r) for r in spark.table(name).collect()} == {(1, "ann")}


def test_a_column_the_source_adds_joins_a_keyed_table(spark, lake, tmp_path):
    """A Debezium feed whose rows gain a column (`ALTER TABLE ... ADD COLUMN` at the source):
    the batch that brings it retracts a key's previous row with the column null, as the
    table reads its rows written before the column (the schema evolves at that commit); the
    rows it does not touch read null. It was refused (the state has no such column)."""
    from changelake.lake.report import ingest_line

    feed = tmp_path / "feed.jsonl"
    feed.write_text("\n".join([
        debezium_line("c", None, {"id": 1, "name": "ann"}, 100, 1),
        debezium_line("c", None, {"id": 2, "name": "bob"}, 200, 2),
        debezium_line("c", None, {"id": 3, "name": "cy"}, 250, 3)]) + "\n")
    name = f"dbz_{uuid.uuid4().hex[:8]}.t"
    first = ingest.ingest(lake, name, [feed], key=["id"], source="debezium")
    assert first.frontier == [250]  # 250 is not known complete: the next batch brings it
    later = tmp_path / "later.jsonl"  # from 250 on, the rows have the new column
    later.write_text("\n".join([
        debezium_line("c", None, {"id": 3, "name": "cy", "vip": False}, 250, 3),
        debezium_line("u", None, {"id": 1, "name": "anne", "vip": True}, 300, 4)]) + "\n")
    report = ingest.ingest(lake, name, [later], key=["id"], source="debezium", close=True)
    assert report.commit.schema_changed
    assert {tuple(r) for r in spark.table(name).collect()} == {
        (1, "anne", True), (2, "bob", None), (3, "cy", False)}
    assert {tuple(r) for r in lake.table(name).as_of(200).collect()} == {
        (1, "ann", None), (2, "bob", None)}
    again = ingest.ingest(lake, name, [later], key=["id"], source="debezium", close=True)
    assert again.commit.skipped
    assert "nothing new (committed through the end: the table is closed" in ingest_line(again)


def test_a_key_or_columns_a_table_cannot_have_are_refused_in_one_line(spark, lake, tmp_path):
    """A `--key` that no image has, and columns whose names differ only in case (one column
    to Spark and the metastore), are each refused in one line: the encoder's for the key, the
    lake's for the names; no table is made of either."""
    feed = tmp_path / "feed.jsonl"
    feed.write_text(debezium_line("c", None, {"id": 1, "name": "ann"}, 100, 1) + "\n")
    name = f"dbz_{uuid.uuid4().hex[:8]}.t"
    with pytest.raises(ChangefeedError, match=r"feed.jsonl, line 1: cannot tell the key "
                                              r"\['ident'\]"):
        ingest.ingest(lake, name, [feed], key=["ident"], source="debezium")
    # A key named in another case than the feed's says so (a new table's key is the feed's).
    with pytest.raises(ChangefeedError, match=r"cannot tell the key \['ID'\] .* \(key columns "
                       r"are matched in the feed's spelling: 'ID' is 'id' there\)"):
        ingest.ingest(lake, name, [feed], key=["ID"], source="debezium")
    cased = tmp_path / "cased.jsonl"
    cased.write_text(debezium_line("c", None, {"id": 1, "ID": 2, "name": "ann"}, 100, 1)
                     + "\n")
    with pytest.raises(SchemaError, match=r"column names differ only in case: "
                                          r"\['id', 'ID', 'name'\]"):
        ingest.ingest(lake, name, [cased], key=["id"], source="debezium", close=True)
    assert not spark.catalog.tableExists(name)


def test_ingest_says_what_it_holds_back_and_close_commits_it(spark, lake):
    """A Debezium file's last transaction cannot be known complete: ingest leaves it out and
    says why; with close (the input is the whole feed) it is committed, exactly once."""
    from changelake.lake import report

    sample = SAMPLES / "derived-rw-debezium-postgres-values.jsonl"
    name = f"hold_{uuid.uuid4().hex[:8]}.orders"
    first = ingest.ingest(lake, name, [sample], key=["order_id"], source="debezium")
    (held,) = first.frontier
    assert held > 0 and first.waiting_for is not None
    assert f"time {held} complete" in first.waiting_for and "--close" in first.waiting_for
    assert report.waiting_line(first) == (
        f"note: frontier stopped at [{held}]: {first.waiting_for}")
    # The snapshot rows are committed; the update of order 1 (the last transaction) is not.
    rows = {r["order_id"]: r["product_id"] for r in spark.table(name).collect()}
    assert rows == {1: 1, 2: 2, 3: 2}

    closed = ingest.ingest(lake, name, [sample], key=["order_id"], source="debezium",
                         close=True)
    assert closed.frontier == [] and closed.waiting_for is None
    assert report.waiting_line(closed) is None
    assert closed.commit.written == 2  # order 1's old row retracted, its new row inserted
    rows = {r["order_id"]: r["product_id"] for r in spark.table(name).collect()}
    assert rows == {1: 3, 2: 2, 3: 2}
    # The same input again without close: nothing new, and no note that its last transaction
    # waits (the closed table holds it).
    again = ingest.ingest(lake, name, [sample], key=["order_id"], source="debezium")
    assert again.commit.skipped and again.waiting_for is not None
    assert report.waiting_line(again) is None


def test_close_is_refused_for_a_materialize_log(lake, tmp_path):
    with pytest.raises(LakeError, match="closes itself"):
        ingest.ingest(lake, f"c_{uuid.uuid4().hex[:8]}.t", [tmp_path], close=True)


YDB_TABLE = {"columns": [{"name": "id", "type": "Uint64"}, {"name": "name", "type": "Utf8"},
                         {"name": "amount", "type": "Int64"}],
             "primary_key": ["id"]}


def _ydb(body: dict, step: int) -> str:
    return json.dumps({**body, "ts": [step, 0]})


def test_a_ydb_changefeed_without_key_is_keyed_by_its_primary_key(spark, lake, tmp_path):
    """A YDB update has no before-image: it retracts its key's previous row, which the ingest
    takes from the table by the table's key. Ingested without --key, the table is keyed by
    the table schema's primary key, so a second batch updating the first batch's keys
    replaces their rows (an unkeyed table kept the old row beside the new one); a table
    made unkeyed is refused rather than duplicated into."""
    schema = tmp_path / "table.json"
    schema.write_text(json.dumps(YDB_TABLE))
    first = [_ydb({"key": [1], "update": {"name": "a", "amount": 1}}, 10),
             _ydb({"key": [2], "update": {"name": "b", "amount": 2}}, 10),
             json.dumps({"resolved": [11, 0]})]
    second = [_ydb({"key": [1], "update": {"amount": 5}}, 12),  # name left UNCHANGED
              _ydb({"key": [2], "erase": {}}, 12),
              _ydb({"key": [3], "update": {"name": "c", "amount": 3}}, 13),
              json.dumps({"resolved": [14, 0]})]
    (tmp_path / "a.jsonl").write_text("\n".join(first) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(first + second) + "\n")  # re-delivered
    name = f"ydbkey_{uuid.uuid4().hex[:8]}.items"
    ingest.ingest(lake, name, [tmp_path / "a.jsonl"], source="ydb", schema=schema)
    assert lake.table(name).state().key == ("id",)
    ingest.ingest(lake, name, [tmp_path / "b.jsonl"], source="ydb", schema=schema)
    rows = sorted(tuple(r) for r in spark.table(name).collect())
    assert rows == [(1, "a", 5), (3, "c", 3)]

    unkeyed = f"ydbkey_{uuid.uuid4().hex[:8]}.items"
    lake.create_table(unkeyed, spark.table(name).schema)
    with pytest.raises(LakeError, match=r"has no key, but the changefeed is converted by its "
                                        r"table schema's primary key \(id\)"):
        ingest.ingest(lake, unkeyed, [tmp_path / "b.jsonl"], source="ydb", schema=schema)


def test_a_log_typed_now_into_a_table_of_its_text_is_refused_writing_nothing(spark, lake,
                                                                            tmp_path):
    """Logical types used to land as text. A table made so, fed more of its log (now typed),
    refuses the type change in one line and keeps what it held."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from changelake.formats.materialize import cdc_schema_around, write_ocf
    from changelake.protocol import Progress, Updates

    record = {"type": "record", "name": "row", "fields": [
        {"name": "k", "type": "long"},
        {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                            "precision": 10, "scale": 2}]}]}
    old = StructType([StructField("k", LongType()), StructField("price", StringType())])
    table = lake.create_table("shop.priced", old, key=["k"])
    table.commit(spark.createDataFrame([(1, "12.50", 0, 1)],
                                       "k long, price string, _time long, _diff long"), 0, 5)
    log = tmp_path / "more.avro"
    with log.open("wb") as fo:
        write_ocf(fo, [Updates([(freeze({"k": 2, "price": "1.25"}, ("k", "price")), 5, 1)]),
                       Progress.make([5], [6], [(5, 1)])],
                  CdcSchema.from_json(cdc_schema_around(record)))
    with pytest.raises(SchemaError, match=r"column 'price' changes type from string to "
                                        r"decimal\(10,2\).*nothing was written \(the "
                                        r"input's columns are those of its first Avro file's "
                                        r"own schema: .*more\.avro\)$"):
        ingest.ingest(lake, "shop.priced", [log])
    assert lake.table("shop.priced").state().upper == 5
    assert [tuple(r) for r in lake.table("shop.priced").current().collect()] == [(1, "12.50")]


def test_json_lines_without_a_schema_into_a_table_of_other_types_say_to_give_one(
        spark, lake, tmp_path):
    """A JSON-lines log carries no schema, so without --schema its columns are inferred from
    the values (a decimal's text as a string). Into a table whose columns are typed, the
    refusal says so, and how to give the schema."""
    from changelake.formats.materialize import cdc_schema_around
    from changelake.protocol import Progress, Updates

    record = {"type": "record", "name": "row", "fields": [
        {"name": "k", "type": "long"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal",
                                   "precision": 10, "scale": 2}}]}
    cdc = CdcSchema.from_json(cdc_schema_around(record))
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(json.dumps(cdc.avro))
    logs = []
    for n, lower in enumerate((0, 5)):
        logs.append(tmp_path / f"log{n}.jsonl")
        with logs[-1].open("wb") as fo:
            write_json_lines(fo, [
                Updates([(freeze({"k": n, "price": "1.25"}, ("k", "price")), lower, 1)]),
                Progress.make([lower], [lower + 5], [(lower, 1)])], cdc)
    ingest.ingest(lake, "shop.typed", [logs[0]], key=["k"], schema=schema_file)
    with pytest.raises(SchemaError, match=r"column 'price' changes type from decimal\(10,2\) "
                       r"to string.* \(the input's columns were inferred from its JSON values, "
                       r"which carry no schema: give the log's Avro schema with --schema"):
        ingest.ingest(lake, "shop.typed", [logs[1]])
    assert lake.table("shop.typed").state().upper == 5
    ingest.ingest(lake, "shop.typed", [logs[1]], schema=schema_file)
    assert lake.table("shop.typed").state().upper == 10
