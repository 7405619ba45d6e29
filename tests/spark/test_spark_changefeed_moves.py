"""Key moves with an unchanged TOAST column on the Spark path (`spark/changefeed/moves.py`),
held to the encoder (`convert.upsert.key_moves`).

PostgreSQL's `UPDATE t SET id = 10 WHERE id = 3` with `big` unchanged reaches Debezium as one
WAL record: a delete of 3 and a create of 10 at its LSN, 10's `big` the placeholder. The create
takes the row the delete removed: from the batch's earlier events of 3, from the table's row
(`state`), through a chain of moves, or not at all where 3 had no row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from changelake.convert import MemoryState, encode_changefeed
from changelake.formats.debezium import PLACEHOLDER
from changelake.spark.changefeed.pipeline import convert_lines
from changelake.spark.changefeed.read import read_lines
from tests.spark.test_spark_changefeeds import python_workers  # noqa: F401 - autouse
from tests.support.changefeed_cases import final_rows, python_updates, spark_updates

pytestmark = pytest.mark.spark

TABLE = {"columns": [{"name": "id", "type": "Int64"}, {"name": "name", "type": "Utf8"},
                     {"name": "big", "type": "Utf8"}], "primary_key": ["id"]}
DDL = "id bigint, name string, big string"


def _line(op: str, key: int, commit: int, lsn: int, name: str | None = None,
          big: str | None = None) -> bytes:
    row = {"id": key, "name": name, "big": big}
    before, after = ({"id": key, "name": None, "big": None}, None) if op == "d" else (None, row)
    return orjson.dumps({"op": op, "before": before, "after": after, "source": {
        "connector": "postgresql", "lsn": lsn, "txId": commit, "snapshot": "false",
        "sequence": orjson.dumps([str(commit), str(lsn)]).decode()}})


def _move(old: int, new: int, commit: int, lsn: int, name: str,
          big: str = PLACEHOLDER) -> list[bytes]:
    """An update of `old`'s key to `new`, as Debezium sends it: delete, tombstone, create."""
    return [_line("d", old, commit, lsn), b"null", _line("c", new, commit, lsn, name, big)]


def _both(spark: Any, lines: list[bytes], tmp_path: Path, python_path: bool,
          state: list[dict[str, Any]] | None = None) -> Any:
    """The lines through the Spark path (its Python path with `python_path`) and the
    encoder, closed, over `state`: the same updates. Returns the final rows by key."""
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    frame = spark.createDataFrame(state, DDL) if state is not None else None
    got = convert_lines(spark, read_lines(spark, [str(path)]), "debezium", ["id"], TABLE,
                        state=frame, close=True, python_path=python_path)
    assert got.path == ("python-udf" if python_path else "jvm"), got.reason
    memory = MemoryState.from_rows(state, ["id"], ["id", "name", "big"]) if state else None
    messages = list(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False,
                                      state=memory))
    updates = spark_updates(got.changes)
    assert updates == python_updates(messages)
    rows = [dict(data) for data, n in final_rows(updates).items() for _ in range(n)]
    assert len({r["id"] for r in rows}) == len(rows)
    return {r["id"]: (r["name"], r["big"]) for r in rows}


@pytest.mark.parametrize("python_path", [False, True])
def test_moves_in_one_batch_take_the_rows_their_deletes_removed(
        spark: Any, tmp_path: Path, python_path: bool) -> None:
    """Two moves in one transaction (3 after an update of it in the same transaction, and
    4), 10 moved again to 20 in the next, a move without a placeholder, one whose old key had
    no row, and the moves' transaction sent again (a connector restart)."""
    first = [_line("c", 3, 100, 110, "c", "three"), _line("c", 4, 100, 120, "d", "four"),
             _line("c", 5, 100, 130, "e", "five")]
    moves = [_line("u", 3, 200, 210, "x", "new three"), *_move(3, 10, 200, 220, "x"),
             *_move(4, 11, 200, 230, "d")]
    later = [*_move(10, 20, 300, 310, "x"), *_move(5, 15, 400, 410, "e", "given"),
             *_move(99, 98, 500, 510, "n")]
    final = _both(spark, first + moves + later + moves, tmp_path, python_path)
    assert final == {20: ("x", "new three"), 11: ("d", "four"), 15: ("e", "given"),
                     98: ("n", None)}


@pytest.mark.parametrize("python_path", [False, True])
def test_a_moved_key_takes_its_row_from_the_table(spark: Any, tmp_path: Path,
                                                  python_path: bool) -> None:
    """3's row was committed before the batch (the lake's state): 10 takes its `big`."""
    final = _both(spark, _move(3, 10, 200, 220, "c"), tmp_path, python_path,
                  state=[{"id": 3, "name": "c", "big": "stored"},
                         {"id": 7, "name": "g", "big": "kept"}])
    assert final == {10: ("c", "stored")}  # and 3's row retracted: the updates agree
