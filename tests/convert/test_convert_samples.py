"""Every shared sample parses into the items its .source.txt describes, or fails deliberately.

The expectations below are read off each sample's `.source.txt` (ops, shapes, what is
special). A sample added to the shared directory without an entry here fails the coverage test.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from changelake.convert import encode_changefeed
from changelake.errors import ChangefeedError, Location
from changelake.formats.change import NAN, UNCHANGED, Change, Resolved, Skipped, TxBoundary
from changelake.formats.debezium import DebeziumParser
from changelake.formats.tableschema import TableSchema
from changelake.formats.ydb import YdbParser
from changelake.protocol import collect
from changelake.values import thaw
from tests.support.paths import SAMPLES

KV = {"columns": [{"name": "key", "type": "Uint64"}, {"name": "value", "type": "Uint64"}],
      "primary_key": ["key"]}
KV_DOUBLE = {"columns": [{"name": "key", "type": "Uint32"}, {"name": "value", "type": "Double"}],
             "primary_key": ["key"]}
KV_EXTRA = {"columns": [{"name": "key", "type": "Uint32"}, {"name": "value", "type": "Uint32"},
                        {"name": "extra", "type": "Uint32"}], "primary_key": ["key"]}
UUID_KEY = {"columns": [{"name": "key", "type": "Uuid"}, {"name": "value", "type": "Uint32"}],
            "primary_key": ["key"]}
ORDERS = {"columns": [{"name": "id", "type": "Uint64"}, {"name": "created", "type": "Timestamp"},
                      {"name": "customer", "type": "Utf8"}], "primary_key": ["id"]}
ISSUE = {"columns": [{"name": "k", "type": "Uint64"}, {"name": "v", "type": "String"}],
         "primary_key": ["k"]}
SCD1 = {"columns": [{"name": "id", "type": "Utf8"}, {"name": "attribute1", "type": "Utf8"},
                    {"name": "attribute2", "type": "Utf8"}], "primary_key": ["id"]}
SCD2 = {"columns": [{"name": "id", "type": "Utf8"}, {"name": "attribute1", "type": "Utf8"},
                    {"name": "attribute2", "type": "Utf8"},
                    {"name": "change_time", "type": "Timestamp"}], "primary_key": ["id"]}
KEY_VALUE = {"columns": [{"name": "key", "type": "Uint32"}, {"name": "value", "type": "Uint32"}],
             "primary_key": ["key"]}

# name -> (parser: "debezium" or a YDB table schema, expected kind per line)
# kinds: an Op value for changes, "BEGIN"/"END", "resolved", "skip:<kind>", "error:<text>"
EXPECTED: dict[str, tuple[Any, list[str]]] = {
    "dbz-doc-mysql-create-with-schema.jsonl": ("debezium", ["c"]),
    "dbz-doc-mysql-key-with-schema.jsonl": ("debezium", ["skip:key"]),
    "dbz-doc-mysql-schema-change-topic.jsonl": ("debezium", ["skip:schema-change"]),
    "dbz-doc-mysql-transaction-metadata.jsonl": ("debezium", ["BEGIN", "END"]),
    # The doc example says snapshot=true on a "c": treated as a snapshot read (PITFALLS P11).
    "dbz-doc-pg-create-with-schema.jsonl": ("debezium", ["r"]),
    "dbz-doc-pg-transaction-metadata.jsonl": ("debezium", ["BEGIN", "END"]),
    "dbz-doc-tutorial-mysql-key-read-tombstone.jsonl": (
        "debezium", ["skip:key", "skip:key", "r", "tombstone"]),
    "dbz-test-serde-with-schema.jsonl": ("debezium", ["c"]),
    "dbz-test-serde-without-schema.jsonl": ("debezium", ["c", "u", "u"]),
    "derived-dbz-doc-mysql-payloads-schemaless.jsonl": ("debezium", ["u", "d", "t"]),
    "derived-dbz-doc-pg-payloads-schemaless.jsonl": ("debezium", ["u", "d", "t", "m", "m"]),
    "derived-dbz-doc-tutorial-mysql-update-delete-payloads.jsonl": ("debezium", ["u", "d"]),
    "derived-rw-debezium-postgres-values.jsonl": ("debezium", ["r", "r", "r", "u"]),
    # Patterns: "***" stands for a real value; it is rejected by name (see the substituted test).
    **{f"pattern-ydb-test-debezium-{mode}.jsonl": (KEY_VALUE, ["error:source.step"] * n)
       for mode, n in [("initial-scan", 7), ("keys-only", 4), ("new-and-old-images", 7),
                       ("new-image", 7), ("old-image", 7)]},
    "pattern-ydb-test-json-resolved-timestamps.jsonl": (
        KV_DOUBLE, ["error:resolved must be", "upsert", "upsert", "upsert",
                    "error:resolved must be", "error:resolved must be"]),
    "pattern-ydb-test-json-resolved-volatile-out-of-order.jsonl": (
        KV_DOUBLE, ["error:resolved must be", "upsert", "error:resolved must be", "upsert",
                    "upsert", "error:resolved must be"]),
    "ydb-doc-cli-topic-read-updates.jsonl": (ORDERS, ["upsert"] * 3),
    "ydb-doc-debezium-json-scd1.jsonl": (SCD1, ["c", "u", "d"]),
    "ydb-doc-debezium-json-scd2.jsonl": (SCD2, ["c", "u", "d"]),
    # Doc snippets of four different tables: with the 1-column-key schema only the last two fit.
    "ydb-doc-json-records.jsonl": (ORDERS, ["error:key has 2 values", "error:key has 2 values",
                                            "error:key has 3 values", "upsert", "resolved"]),
    "ydb-issue6985-resolved-and-ts-records.jsonl": (
        ISSUE, ["resolved"] * 3 + ["upsert"] * 2 + ["resolved"] * 3 + ["upsert"]),
    "ydb-test-json-initial-scan-updated-rows.jsonl": (
        KEY_VALUE, ["upsert", "upsert", "upsert", "upsert", "d", "upsert"]),
    "ydb-test-json-initial-scan.jsonl": (KEY_VALUE, ["upsert"] * 6),
    "ydb-test-json-keys-only-uuid-key.jsonl": (UUID_KEY, ["upsert", "upsert", "upsert", "d"]),
    "ydb-test-json-keys-only.jsonl": (KEY_VALUE, ["upsert", "upsert", "upsert", "d"]),
    "ydb-test-json-nan-inf.jsonl": (KV_DOUBLE, ["upsert"] * 3),
    "ydb-test-json-new-and-old-images.jsonl": (
        KEY_VALUE, ["upsert", "upsert", "upsert", "u", "u", "u", "d"]),
    "ydb-test-json-updates-add-drop-column.jsonl": (KV_EXTRA, ["upsert"] * 4),
    "ydb-test-json-updates.jsonl": (KEY_VALUE, ["upsert", "upsert", "upsert", "d"]),
}


def _parser(spec: Any) -> Any:
    return DebeziumParser() if spec == "debezium" else YdbParser(TableSchema.from_json(spec))


def _kind(item: Any) -> str:
    if isinstance(item, Change):
        return item.op.value
    if isinstance(item, TxBoundary):
        return item.status
    if isinstance(item, Resolved):
        return "resolved"
    assert isinstance(item, Skipped)
    return f"skip:{item.kind}"


def _parse_all(path: Path, spec: Any) -> list[str]:
    parser = _parser(spec)
    kinds = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            kinds.append(_kind(parser.parse_line(line, Location(path.name, number))))
        except ChangefeedError as error:
            # A deliberate error names the file and the line, and says what is wrong.
            assert str(error).startswith(f"{path.name}, line {number}: ")
            kinds.append(f"error:{error.reason}")
    return kinds


def test_every_sample_has_an_expectation() -> None:
    assert sorted(p.name for p in SAMPLES.glob("*.jsonl")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_parses_as_described(name: str) -> None:
    spec, expected = EXPECTED[name]
    kinds = _parse_all(SAMPLES / name, spec)
    assert len(kinds) == len(expected)
    for got, want in zip(kinds, expected, strict=True):
        if want.startswith("error:"):
            assert got.startswith("error:") and want[6:] in got, (got, want)
        else:
            assert got == want


# ------------------------------------------------------------------- what the samples say


def _items(name: str, spec: Any = "debezium") -> list[Any]:
    parser = _parser(spec)
    path = SAMPLES / name
    return [parser.parse_line(line, Location(name, i))
            for i, line in enumerate(path.read_bytes().splitlines(), start=1)]


def test_pg_transaction_ids_match_on_the_txid_prefix() -> None:
    begin, end = _items("dbz-doc-pg-transaction-metadata.jsonl")
    assert begin.id == end.id == "571"
    assert end.event_count == 2 and end.per_collection == (("s1.a", 1), ("s2.a", 1))
    _, mysql_end = _items("dbz-doc-mysql-transaction-metadata.jsonl")
    assert mysql_end.id == "0e4d5dcd-a33b-11ea-80f1-02010a22a99e:10"  # a GTID stays whole


def test_pg_positions_and_times() -> None:
    reads = _items("derived-rw-debezium-postgres-values.jsonl")
    assert [c.position for c in reads[:3]] == [(0, 23911624, 23911624)] * 3
    assert [c.time for c in reads[:3]] == [None, None, None]  # snapshot: the stream's "now"
    assert reads[3].before is None and reads[3].time == 23911952
    pg = _items("dbz-doc-pg-create-with-schema.jsonl")[0]
    assert pg.position == (24023119, 24023128, 24023128)
    assert pg.transaction == "555" and pg.table == "public.customers"


def test_mysql_positions() -> None:
    change = _items("dbz-test-serde-with-schema.jsonl")[0]
    assert change.position == (3, 154, 0)
    assert change.time == 3 << 32 | 154
    assert change.snapshot is False  # 0.10's boolean snapshot


def test_a_column_schemaless_debezium_adds_mid_feed_grows_the_columns() -> None:
    """Line 3 adds `middle_name` (an ALTER TABLE ... ADD COLUMN while streaming): the columns
    grow (issue 69); only a table schema that does not list it refuses it (schema drift)."""
    path = SAMPLES / "dbz-test-serde-without-schema.jsonl"
    final = collect(encode_changefeed([path], source="debezium", keys=["id"],
                                      table_schema=None, close=True, lenient=False)).updates
    # One position for all three lines: a tie the row without `middle_name` wins.
    assert [list(thaw(data)) for data, _, _ in final] == [
        ["id", "first_name", "last_name", "email", "middle_name"]]
    table = {"columns": [{"name": c} for c in ("id", "first_name", "last_name", "email")],
             "primary_key": ["id"]}
    with pytest.raises(ChangefeedError, match=r"line 3: columns \['middle_name'\]"):
        list(encode_changefeed([path], source="debezium", keys=["id"], table_schema=table,
                               close=True, lenient=False))


def test_ydb_values_nan_inf_and_big_uint64() -> None:
    nan, inf, minus = _items("ydb-test-json-nan-inf.jsonl", KV_DOUBLE)
    assert nan.after["value"] is NAN
    assert inf.after["value"] == float("inf") and minus.after["value"] == float("-inf")
    first = _items("ydb-doc-cli-topic-read-updates.jsonl", ORDERS)[0]
    assert first.key == {"id": 13195699997286404932}
    assert first.after == {"id": 13195699997286404932,
                           "created": "2022-06-24T11:35:00.000000Z", "customer": "Name366"}


def test_ydb_keys_only_leaves_values_unchanged() -> None:
    first = _items("ydb-test-json-keys-only.jsonl", KEY_VALUE)[0]
    assert first.after == {"key": 1, "value": UNCHANGED}


def test_ydb_images_rebuild_rows_with_the_key() -> None:
    items = _items("ydb-test-json-new-and-old-images.jsonl", KEY_VALUE)
    assert items[3].before == {"key": 1, "value": 10} and items[3].after == {"key": 1,
                                                                             "value": 100}
    assert items[6].before == {"key": 1, "value": 100} and items[6].after is None


def test_ydb_debezium_json_keeps_uint64_txid() -> None:
    c = _items("ydb-doc-debezium-json-scd1.jsonl", SCD1)[0]
    assert c.position == (1755868513260, 18446744073709551615)
    assert c.time == 1755868513260 and c.key == {"id": "CUSTOMER_1001"}


def test_issue6985_violation_is_reported_at_its_line() -> None:
    with pytest.raises(ChangefeedError, match=r"line 4: record at ts .* after resolved"):
        list(encode_changefeed([SAMPLES / "ydb-issue6985-resolved-and-ts-records.jsonl"],
                               source="ydb", keys=None, table_schema=ISSUE, close=True,
                               lenient=False))


def test_issue6985_lenient_sets_the_violations_aside() -> None:
    aside: list[Any] = []
    messages = list(encode_changefeed(
        [SAMPLES / "ydb-issue6985-resolved-and-ts-records.jsonl"], source="ydb", keys=None,
        table_schema=ISSUE, close=True, lenient=True, set_aside=aside.append))
    # Line 9 (ts step 1721744215418) is below line 8's barrier (1721744218000) too.
    assert [a.location.line for a in aside] == [4, 5, 9]
    assert all("resolved" in a.reason for a in aside)
    assert collect(messages).updates == []
    assert collect(messages).frontier.is_closed


# ----------------------------------------------- patterns with "***" replaced by real values


def _substituted(name: str) -> list[bytes]:
    """Replace each "***" by increasing integers ([step, txId] where a pair is meant)."""
    out = []
    for i, line in enumerate((SAMPLES / name).read_text().splitlines(), start=1):
        text = line.replace('{"resolved":"***"}', f'{{"resolved":[{1000 * i},0]}}')
        text = text.replace('"step":"***"', f'"step":{1000 * i}')
        text = text.replace('"txId":"***"', '"txId":18446744073709551615')
        text = text.replace('"ts_ms":"***"', f'"ts_ms":{i}')
        out.append(text.encode())
    return out


@pytest.mark.parametrize(("mode", "ops"), [
    ("initial-scan", ["r", "r", "r", "u", "u", "u", "c"]),
    ("keys-only", ["u", "u", "u", "d"]),
    ("new-and-old-images", ["c", "c", "c", "u", "u", "u", "d"]),
    ("new-image", ["upsert"] * 6 + ["d"]),
    ("old-image", ["u"] * 6 + ["d"]),
])
def test_ydb_debezium_patterns_with_values(mode: str, ops: list[str]) -> None:
    parser = YdbParser(TableSchema.from_json(KEY_VALUE))
    lines = _substituted(f"pattern-ydb-test-debezium-{mode}.jsonl")
    items = [parser.parse_line(line, Location(mode, i)) for i, line in enumerate(lines, 1)]
    assert [c.op.value for c in items] == ops
    assert all(c.key is not None and set(c.key) == {"key"} for c in items)
    assert all(c.position is not None and c.position[1] == 2**64 - 1 for c in items)


def test_ydb_new_and_old_images_pattern_encodes_the_final_state(tmp_path: Path) -> None:
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join(_substituted("pattern-ydb-test-debezium-new-and-old-images.jsonl")))
    for keys in (None, ["key"]):
        got = collect(encode_changefeed([path], source="ydb", keys=keys, table_schema=KEY_VALUE,
                                        close=True, lenient=False))
        state: dict[Any, int] = {}
        for d, _, r in got.updates:
            state[d] = state.get(d, 0) + r
        assert {tuple(thaw(d).values()) for d, n in state.items() if n} == {(2, 200), (3, 300)}
        assert all(n in (0, 1) for n in state.values())


def test_old_image_feed_cannot_be_converted_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "feed.jsonl"
    path.write_bytes(b"\n".join(_substituted("pattern-ydb-test-debezium-old-image.jsonl")))
    with pytest.raises(ChangefeedError, match=r"line 1: op u has no after-image"):
        list(encode_changefeed([path], source="ydb", keys=None, table_schema=KEY_VALUE,
                               close=True, lenient=False))


def test_resolved_pattern_gives_progress_across_the_window(tmp_path: Path) -> None:
    """Records without ts sit at the stream's time; barriers finish the steps below them."""
    path = tmp_path / "p.jsonl"
    lines = [re.sub(rb'"\*\*\*"', b"[%d,0]" % (1000 * i), line)
             for i, line in enumerate(
                 (SAMPLES / "pattern-ydb-test-json-resolved-volatile-out-of-order.jsonl")
                 .read_bytes().splitlines(), start=1)]
    path.write_bytes(b"\n".join(lines))
    messages = list(encode_changefeed([path], source="ydb", keys=None, table_schema=KV_DOUBLE,
                                      close=False, lenient=False))
    got = collect(messages)
    assert got.frontier.elements == (6000,)
    assert sorted(thaw(d)["key"] for d, _, _ in got.updates) == [1, 3, 5]
