"""Upserts take a key's previous row from the lake table: a Debezium feed without
before-images (PostgreSQL's default replica identity) ingested in increments must still retract
rows that an earlier ingest committed."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.errors import LakeError
from changelake.lake import ingest
from changelake.lake.catalog import Lake
from changelake.simulate import ORDER_COLUMNS, debezium_orders


def rows(frame: object) -> list[tuple]:
    return sorted(tuple(r[c] for c in ORDER_COLUMNS) for r in frame.collect())  # type: ignore[attr-defined]


def test_later_ingest_retracts_rows_committed_earlier(spark, tmp_path: Path, lake_root) -> None:
    feed = debezium_orders(random.Random(4), rows=15, transactions=40, replay=0)
    cut = len(feed.events) // 2
    first, rest = tmp_path / "part-1.jsonl", tmp_path / "part-2.jsonl"
    first.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in feed.events[:cut]))
    rest.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in feed.events[cut:]))
    lake = Lake(spark, lake_root)
    table = "upserts.orders"

    one = ingest.ingest(lake, table, [first], key=["id"], source="debezium")
    committed = one.commit.upper
    assert committed is not None and committed > 0  # the open tail waits for more input
    # An existing table keeps its key: another is refused before anything is read, as it
    # would find several rows of the table per key (a customer has several orders).
    with pytest.raises(LakeError, match=r"^table upserts\.orders is keyed by id, but the "
                       r"ingest gives the key customer: leave the key out, or give the"):
        ingest.ingest(lake, table, [first, rest], key=["customer"], source="debezium")
    assert lake.table(table).state().version == one.commit.version
    # The topic is read again from the start, as a restarted consumer would: what is already
    # committed is skipped, and the rest is converted against the table's current rows, by
    # the table's key (left out here: it is the table's own).
    two = ingest.ingest(lake, table, [first, rest], source="debezium")
    upper = two.commit.upper
    assert upper is not None and upper > committed
    # An older delivery arriving late (as when two ingests race) has nothing new. (The key
    # is named in another case: names compare in any case, the table's spelling is kept.)
    late = ingest.ingest(lake, table, [first], key=["ID"], source="debezium")
    assert late.commit.skipped and late.commit.version == two.commit.version
    handle = lake.table(table)
    # Without transaction metadata or --close, the last transaction is not provably complete:
    # the truth to compare with is the state just before the committed frontier.
    (_, state) = next((t, s) for t, s in reversed(feed.states) if t < upper)
    truth = sorted(tuple(r[c] for c in ORDER_COLUMNS) for r in state.values())
    assert rows(handle.current()) == truth
    earlier = next(s for t, s in reversed(feed.states) if t < committed)
    assert set(earlier) - set(state), "some key committed by the first ingest is deleted later"
    # every retraction found its row: no key is left with a negative or doubled multiplicity
    per_key = handle.updates().groupBy("id").agg({"_diff": "sum"}).collect()
    assert all(r["sum(_diff)"] in (0, 1) for r in per_key)


def _event(table: str, key: int, value: str, lsn: int) -> dict:
    return {"before": None, "after": {"id": key, "v": value}, "op": "c",
            "source": {"connector": "postgresql", "name": "pg", "db": "shop",
                       "schema": "public", "table": table, "txId": lsn, "lsn": lsn,
                       "sequence": f'["{lsn}", "{lsn}"]'}}


def test_a_line_of_another_table_is_refused(spark, tmp_path: Path, lake_root) -> None:
    """A feed holds one table's events: a line of another (a topic shared by mistake) is
    refused as `encode --from debezium` refuses it, naming its line, with nothing committed.
    It had been converted as a row of the table, over the row of its key."""
    feed = tmp_path / "mixed.jsonl"
    feed.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in (
        _event("orders", 1, "order-1", 1000), _event("customers", 1, "customer-1", 1100),
        _event("orders", 2, "order-2", 1200))))
    lake = Lake(spark, lake_root)
    with pytest.raises(Exception, match=r"mixed\.jsonl, line 2: events of two tables, "
                       r"public\.orders and public\.customers: encode one table at a time"):
        ingest.ingest(lake, "orders", [feed], key=["id"], source="debezium", close=True)
    assert lake.handle("orders").load() is None


def test_a_key_moved_with_its_toast_value_unchanged_keeps_it_across_ingests(
        spark, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Real Debezium's `UPDATE items SET id = 10 WHERE id = 3` with `big` unchanged
    (`tests/data/debezium-real`): a delete of 3 and a create of 10 whose `big` is the
    placeholder. The first ingest's part of the table's topic ends with the delete: it
    commits 3's row and leaves the move's transaction open (its END counts two events); the
    second, given the whole topic, converts the move over the table's rows: 10's `big` is
    the one 3 has in the table."""
    from tests.support.debezium_real import SAMPLES

    def values(name: str) -> list[Any]:
        return [orjson.loads(line)["value"]
                for line in (SAMPLES / name).read_bytes().splitlines()]

    items = values("real.public.items.jsonl")
    cut = next(i for i, v in enumerate(items) if v is not None
               and v["payload"]["op"] == "d" and v["payload"]["before"]["id"] == 3) + 2
    first, rest = tmp_path / "part-1.jsonl", tmp_path / "part-2.jsonl"
    transactions = tmp_path / "transactions.jsonl"
    for path, part in ((first, items[:cut]), (rest, items[cut:]),
                       (transactions, values("real.transaction.jsonl"))):
        path.write_bytes(b"".join(orjson.dumps(v) + b"\n" for v in part))
    lake = Lake(spark, tmp_path / "lake")
    table = "real.items"
    caplog.set_level(logging.INFO, logger="changelake.spark.changefeed.dispatch")

    one = ingest.ingest(lake, table, [first, transactions], key=["id"], source="debezium")
    committed = {r["id"]: r["big"] for r in lake.table(table).current().collect()}
    assert committed[3] == "y" * 4000 and 10 not in committed  # the move is not committed
    two = ingest.ingest(lake, table, [first, rest, transactions], source="debezium",
                        close=True)
    assert two.commit.version > one.commit.version
    moved = [r["big"] for r in lake.table(table).updates().collect()
             if r["id"] == 10 and r["_diff"] > 0]
    assert moved == ["y" * 4000]
    assert sorted(r["id"] for r in lake.table(table).current().collect()) == [1, 4]
    assert "Python path" not in caplog.text  # both converted on the Spark path
