"""The JVM changefeed path on YDB JSON agrees with `encode_changefeed`: the same updates and
frontier, or the encoder's error (the batch then goes to the Python path, which names the line).
Every YDB sample, and generated two-partition histories with barriers, replays after a consumer
restart and late records below a barrier."""

from __future__ import annotations

import json
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.convert import MemoryState, encode_changefeed
from changelake.errors import ChangefeedError, SchemaError
from changelake.formats.lines import MAX_LINE_BYTES
from changelake.protocol import collect
from changelake.spark.changefeed import barriers, conversion, times, ydb_path
from changelake.spark.changefeed.keyed import TIED
from changelake.spark.changefeed.pipeline import Converted, convert_frames
from tests.convert.test_convert_history import YDB_TABLE, write_ydb, ydb_histories
from tests.convert.test_convert_samples import EXPECTED
from tests.support.changefeed_cases import python_updates, spark_updates
from tests.support.paths import SAMPLES
from tests.support.seeding import seeded

pytestmark = pytest.mark.spark

#: The samples the Spark path converts; the others go to the Python path (types it does not read,
#: DEBEZIUM_JSON, bad lines).
JVM_SAMPLES = {
    "ydb-test-json-initial-scan-updated-rows.jsonl", "ydb-test-json-initial-scan.jsonl",
    "ydb-test-json-keys-only-uuid-key.jsonl", "ydb-test-json-keys-only.jsonl",
    "ydb-test-json-nan-inf.jsonl", "ydb-test-json-new-and-old-images.jsonl",
    "ydb-test-json-updates-add-drop-column.jsonl", "ydb-test-json-updates.jsonl",
}
YDB_SAMPLES = sorted([*SAMPLES.glob("ydb-*.jsonl"), *SAMPLES.glob("pattern-ydb-test-json-*.jsonl")])
#: The Python path names the first bad line as the encoder does, and counts the others.
_MORE = re.compile(r" \(and \d+ more bad lines? found\)$")


def compare(spark: Any, paths: list[Path], tmp_path: Path, table: dict[str, Any], *,
            close: bool, rows: list[dict[str, Any]] | None = None,
            since: int | None = None) -> tuple[Converted | None, str | None]:
    """Both sides on the same files: (what the Spark path returned, the encoder's error)."""
    schema_file = tmp_path / "table.json"
    schema_file.write_text(json.dumps(table))
    names = [c["name"] for c in table["columns"]]
    keys = list(table["primary_key"])
    try:
        memory = MemoryState.from_rows(rows, keys, names) if rows is not None else None
        messages = list(encode_changefeed(paths, source="ydb", keys=None, table_schema=table,
                                          close=close, lenient=False, state=memory))
        error = None
    except ChangefeedError as failure:
        error = str(failure)
    state = None
    if rows is not None:
        state = spark.createDataFrame([{**r, "id": Decimal(r["id"])} for r in rows],
                                      "id decimal(20,0), name string, score double")
    try:
        got = convert_frames(spark, paths, "ydb", [], schema_file, close=close, state=state,
                             since=since)
    except ChangefeedError as failure:
        assert _MORE.sub("", str(failure)) == error
        return None, error
    assert error is None, f"the encoder refused: {error}"
    expected = collect(messages)
    assert got.frontier == (None if close else expected.frontier.elements[0])
    want = python_updates(messages)
    if since is not None:  # the encoder's, from `since` on
        want = Counter({k: v for k, v in want.items() if k[1] >= since})
    assert spark_updates(got.changes) == want
    return got, None


@pytest.mark.slow  # ~19 conversions
@pytest.mark.parametrize("path", YDB_SAMPLES, ids=lambda p: p.name)
def test_sample_agrees_with_the_encoder(spark: Any, tmp_path: Path, path: Path) -> None:
    got, _ = compare(spark, [path], tmp_path, EXPECTED[path.name][0], close=True)
    if path.name in JVM_SAMPLES:
        assert got is not None and got.path == "jvm", got and got.reason


@pytest.mark.parametrize("name", ["ydb-test-json-new-and-old-images.jsonl",
                                  "ydb-test-json-keys-only-uuid-key.jsonl"])
def test_samples_on_the_spark_path(spark: Any, tmp_path: Path, name: str) -> None:
    """New and old images, erases; a Uuid key and UNCHANGED columns (KEYS_ONLY)."""
    got, _ = compare(spark, [SAMPLES / name], tmp_path, EXPECTED[name][0], close=True)
    assert got is not None and got.path == "jvm", got and got.reason


def restarted(paths: list[Path], seed: int) -> None:
    """A consumer restart in each partition: a tail of it, from some line on, read again."""
    rng = seeded(seed)
    for path in paths:
        lines = path.read_bytes().splitlines()
        start = rng.randrange(len(lines)) if lines else 0
        path.write_bytes(b"\n".join(lines + lines[start:]) + b"\n")


def late_record(paths: list[Path], seed: int) -> bool:
    """A record below its partition's last barrier (ydb#6985), at the end of a partition that
    has a barrier: False when no partition has one. Its key is new: the encoder skips a late
    record of a key that has a newer event applied (`is_replay`), the Spark paths skip only
    repeats of an earlier record of the partition (see `spark/changefeed/barriers.py`)."""
    rng = seeded(seed)
    for path in paths:
        lines = path.read_bytes().splitlines()
        barriers = [orjson.loads(line)["resolved"] for line in lines if b"resolved" in line]
        if barriers:
            step = max(barriers)[0] - 1
            record = {"update": {"name": "late"}, "key": [rng.choice([6, 7, 8])],
                      "ts": [step, 1]}
            path.write_bytes(b"\n".join([*lines, orjson.dumps(record)]) + b"\n")
            return True
    return False


HISTORY = {"scan": {1: ("a", 0.5), 2**63 + 1: ("b", "nan")},
           "txs": [(1, [("update", 1, {"name": "c"}), ("reset", 2**64 - 1, {"score": "inf"})],
                    True),
                   (1, [("erase", 1, {}), ("update", 2**63 + 1, {"score": 2.0})], False),
                   (0, [("update", 3, {"name": None}), ("update", 1, {"score": -1.5})], True),
                   (2, [("update", 2**64 - 1, {"name": "z"})], False)],
           "seed": 11}


@pytest.mark.parametrize("close, broadcast, chunk_bits", [
    (False, True, 16), (True, True, 1),
    pytest.param(False, False, 16, marks=pytest.mark.slow)])
def test_two_partitions_with_barriers_and_a_restart(spark: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    close: bool, broadcast: bool,
                                                    chunk_bits: int) -> None:
    """The replays below a barrier are looked up among the earlier records, broadcast or (as
    when there are many) joined by a shuffle; the running highest barrier is found in chunks
    of lines (of two lines with `chunk_bits` 1, so that it crosses chunks)."""
    monkeypatch.setattr(times, "CHUNK_BITS", chunk_bits)
    if not broadcast:
        monkeypatch.setattr(barriers, "BROADCAST_BELOW", 0)
    paths, _, last = write_ydb(HISTORY, tmp_path)
    restarted(paths, 5)
    got, _ = compare(spark, paths, tmp_path, YDB_TABLE, close=close)
    assert got is not None and got.path == "jvm", got and got.reason
    assert last is not None and (close or got.frontier == last)


def test_a_late_record_is_named_by_the_python_path(spark: Any, tmp_path: Path) -> None:
    paths, _, _ = write_ydb(HISTORY, tmp_path)
    assert late_record(paths, 3)
    _, error = compare(spark, paths, tmp_path, YDB_TABLE, close=True)
    assert error is not None and "after resolved" in error and "partition-" in error


@pytest.mark.parametrize("bad", [b'{"update": {"name": "caf\xc3"}, "key": [9], "ts": [9, 1]}',
                                 b" " * MAX_LINE_BYTES], ids=["utf8", "long"])
def test_a_line_out_of_bounds_is_named_as_the_encoder_names_it(spark: Any, tmp_path: Path,
                                                                bad: bytes) -> None:
    """The YDB parse holds the lines to the bounds in its own job: a line that is not UTF-8,
    or is over the bound, is never parsed, and the check names its file and line as the
    encoder does (the second line of the second partition; the first file is good). The
    words for a line that is not UTF-8 are the check's own, more exact than orjson's, as for
    Debezium (`test_spark_changefeed_read.py`)."""
    paths, _, _ = write_ydb(HISTORY, tmp_path)
    lines = paths[-1].read_bytes().splitlines(keepends=True)
    paths[-1].write_bytes(lines[0] + bad + b"\n" + b"".join(lines[1:]))
    table = tmp_path / "table.json"
    table.write_text(json.dumps(YDB_TABLE))
    with pytest.raises(ChangefeedError) as encoder:
        list(encode_changefeed(paths, source="ydb", keys=None, table_schema=YDB_TABLE,
                               close=True, lenient=False))
    with pytest.raises(ChangefeedError) as on_spark:
        convert_frames(spark, paths, "ydb", [], table, close=True)
    place = f"{paths[-1]}, line 2: "
    assert str(encoder.value).startswith(place) and str(on_spark.value).startswith(place)
    if bad.strip():
        assert str(on_spark.value).startswith(place + "not UTF-8 text: ")
    else:
        assert str(on_spark.value) == str(encoder.value)


@pytest.mark.parametrize("source", ["ydb", "debezium"])
def test_a_key_the_table_schema_lacks_is_the_encoders_error(spark: Any, tmp_path: Path,
                                                            source: str) -> None:
    """`--key` against a table schema is checked before a line is read, by the same rule and
    words as the encoder's: names are exact (`ID` is not `id`), where Spark would find a
    struct field in any case, and no line is blamed for the user's key."""
    paths, _, _ = write_ydb(HISTORY, tmp_path)
    table = tmp_path / "table.json"
    table.write_text(json.dumps(YDB_TABLE))
    (key,) = YDB_TABLE["primary_key"]
    for keys in ([key.upper()], [key, "nope"]):
        with pytest.raises(SchemaError) as encoder:
            list(encode_changefeed(paths, source=source, keys=keys, table_schema=YDB_TABLE,
                                   close=True, lenient=False))
        with pytest.raises(SchemaError) as on_spark:
            convert_frames(spark, paths, source, keys, table, close=True)
        assert str(on_spark.value) == str(encoder.value)
        assert str(encoder.value).startswith(f"key columns {keys[-1:]} are not in the table")


@pytest.mark.parametrize("again, repeat, chunk_bits", [
    ({"update": {"name": "a"}}, True, 16), ({"erase": {}}, False, 16),
    ({"erase": {}}, False, 0), ({"update": {"name": "a"}}, True, 0),
    pytest.param({"update": {"name": "b"}}, False, 16, marks=pytest.mark.slow)])
def test_a_record_below_a_barrier_is_a_replay_only_if_it_repeats_one(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, again: dict[str, Any],
        repeat: bool, chunk_bits: int) -> None:
    """A record of the key and position of an earlier one of its file, below the barrier
    between them: a replay (converted on the Spark path) when its op and images are the earlier
    one's, otherwise a bad line (the Python path names it). The encoder skips the latter too, as
    no newer than what its key has applied: the Spark paths' known difference
    (`spark/changefeed/ydb_path.py`). Two writes of other images are two rows at one position,
    which the Spark path leaves to the old one as well. With chunks of one line
    (`times.CHUNK_BITS` 0), the barrier reaches the records after it only through the
    earlier chunks' highest (`times.highest_before`)."""
    monkeypatch.setattr(times, "CHUNK_BITS", chunk_bits)
    first = {"update": {"name": "a"}, "key": [1], "ts": [10, 1]}
    lines = [first, {"update": {"name": "c"}, "key": [2], "ts": [11, 1]}, {"resolved": [20, 0]},
             {**again, "key": [1], "ts": [10, 1]}]
    paths = [tmp_path / "partition-0.jsonl", tmp_path / "partition-1.jsonl"]
    paths[0].write_bytes(b"\n".join(map(orjson.dumps, lines)) + b"\n")
    paths[1].write_bytes(orjson.dumps({"resolved": [20, 0]}) + b"\n")
    if repeat:
        got, _ = compare(spark, paths, tmp_path, YDB_TABLE, close=True)
        assert got is not None and got.path == "jvm", got and got.reason
        return
    schema_file = tmp_path / "table.json"
    schema_file.write_text(json.dumps(YDB_TABLE))
    with pytest.raises(ChangefeedError, match=r"partition-0.jsonl, line 4: record at ts "
                                              r"\[10, 1\] arrives after resolved \[20, 0\]"):
        convert_frames(spark, paths, "ydb", [], schema_file, close=True)


def test_a_late_record_read_twice_is_no_replay(spark: Any, tmp_path: Path) -> None:
    """A record below its barrier, then the same record again: the second repeats the
    first, but the first repeats nothing (`KeyedConversion.java`: every record of that
    identity lies below). The Python path names the first."""
    lines = [{"update": {"name": "c"}, "key": [2], "ts": [11, 1]}, {"resolved": [20, 0]},
             {"update": {"name": "a"}, "key": [1], "ts": [10, 1]},
             {"update": {"name": "a"}, "key": [1], "ts": [10, 1]}]
    paths = [tmp_path / "partition-0.jsonl", tmp_path / "partition-1.jsonl"]
    paths[0].write_bytes(b"\n".join(map(orjson.dumps, lines)) + b"\n")
    paths[1].write_bytes(orjson.dumps({"resolved": [20, 0]}) + b"\n")
    got, error = compare(spark, paths, tmp_path, YDB_TABLE, close=True)
    assert got is None and error is not None and error.startswith(
        f"{paths[0]}, line 3: record at ts [10, 1] arrives after resolved [20, 0]")


@pytest.mark.parametrize("repeat", [True, False], ids=["replay", "late"])
@pytest.mark.parametrize("outside", ["frontier", "since"])
def test_a_record_below_a_barrier_outside_the_converted_times(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repeat: bool,
        outside: str) -> None:
    """A record below its file's barrier at a time the batch does not convert (at or past
    the frontier, which another partition holds back; or before `since`, committed already)
    never reaches the conversion that checks the others: the conversion counts it, and it is
    looked up among its file's earlier records after (`barriers.unrepeated_outside`). A
    replay is converted on the Spark path; a record that repeats none goes to the Python path,
    which names it."""
    looked_up: list[bool] = []

    def lookup(*args: Any) -> bool:
        looked_up.append(unrepeated_outside(*args))
        return looked_up[-1]

    unrepeated_outside = ydb_path.unrepeated_outside
    monkeypatch.setattr(ydb_path, "unrepeated_outside", lookup)
    again = {"update": {"name": "a" if repeat else "b"}}
    lines = [{"update": {"name": "a"}, "key": [1], "ts": [10, 1]},
             {"update": {"name": "c"}, "key": [2], "ts": [31, 1]}, {"resolved": [30, 0]},
             {**again, "key": [1], "ts": [10, 1]}, {"update": {"name": "d"}, "key": [3],
                                                    "ts": [32, 1]}]
    paths = [tmp_path / "partition-0.jsonl", tmp_path / "partition-1.jsonl"]
    paths[0].write_bytes(b"\n".join(map(orjson.dumps, lines)) + b"\n")
    other = [5, 0] if outside == "frontier" else [40, 0]
    paths[1].write_bytes(orjson.dumps({"resolved": other}) + b"\n")
    since = 20 if outside == "since" else None
    if repeat and outside == "frontier":
        # The encoder refuses a repeat of a record it has not applied yet (one past the
        # frontier: `ydb_path.py`'s known differences); the Spark path gives what the barrier
        # rule on its own gives (`barrier_rule`, as where the parse's tasks cannot tell it).
        schema_file = tmp_path / "table.json"
        schema_file.write_text(json.dumps(YDB_TABLE))
        got = convert_frames(spark, paths, "ydb", [], schema_file)
        with monkeypatch.context() as alone:
            alone.setattr(barriers.Blocks, "of", staticmethod(lambda tasks: None))
            by_rule = convert_frames(spark, paths, "ydb", [], schema_file)
        assert (got.path, got.frontier, by_rule.path) == ("jvm", 5, "jvm")
        assert spark_updates(got.changes) == spark_updates(by_rule.changes)
        assert looked_up == [False]
        return
    got, error = compare(spark, paths, tmp_path, YDB_TABLE, close=False, since=since)
    if repeat:
        assert got is not None and got.path == "jvm", got and got.reason
        assert got.frontier == 30
        assert looked_up == [False]
    else:
        assert got is None and error is not None and error.startswith(
            f"{paths[0]}, line 4: record at ts [10, 1] arrives after resolved [30, 0]")
        assert looked_up == [True]


@pytest.mark.parametrize("copies", [[True], [False, True], [True, False, False]],
                         ids=["other", "same-then-other", "other-then-same"])
def test_two_rows_for_one_key_at_one_position_go_to_the_python_path(
        spark: Any, tmp_path: Path, copies: list[bool]) -> None:
    """A record repeated at its position, once with another row (`copies`: after the record,
    each copy with its own row or another; the repeats of its own row are replays): the JVM
    path hands the batch to the Python path (the tie check of `keyed.java_convert`),
    which gives the encoder's updates."""
    paths, _, _ = write_ydb(HISTORY, tmp_path)
    path, lines, at = next((path, lines, i) for path in paths
                           for lines in [path.read_bytes().splitlines()]
                           for i, line in enumerate(lines) if b'"update":{"name"' in line)
    record = orjson.loads(lines[at])
    other = dict(record, update={**record["update"], "name": "another row"})
    for n, differs in enumerate(copies):
        lines.insert(at + 1 + n, orjson.dumps(other if differs else record))
    path.write_bytes(b"\n".join(lines) + b"\n")
    got, _ = compare(spark, paths, tmp_path, YDB_TABLE, close=True)
    assert got is not None and (got.path, got.reason) == ("python-udf", TIED)


def test_the_tables_rows_stand_in_for_earlier_events(spark: Any, tmp_path: Path) -> None:
    """Keys the batch updates without creating them take the table's rows (the encoder gets
    the same rows as its `State`)."""
    paths, _, _ = write_ydb(HISTORY, tmp_path)
    rows = [{"id": 3, "name": "old", "score": 1.0}, {"id": 2**64 - 1, "name": "x", "score": None}]
    got, _ = compare(spark, paths, tmp_path, YDB_TABLE, close=False, rows=rows)
    assert got is not None and got.path == "jvm", got and got.reason


@pytest.mark.slow
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=ydb_histories(), close=st.booleans(), replay=st.booleans(),
       late=st.booleans())
def test_generated_histories_match_the_encoder(spark: Any, tmp_path_factory: Any,
                                               history: dict[str, Any], close: bool,
                                               replay: bool, late: bool) -> None:
    """Two partitions, barriers, out-of-order records between them, Uint64 keys beyond a long,
    NaN and infinities; a restart replaying a tail; a record below a barrier."""
    directory = tmp_path_factory.mktemp("ydb")
    paths, _, _ = write_ydb(history, directory)
    if replay:
        restarted(paths, history["seed"])
    bad = late and late_record(paths, history["seed"])
    got, error = compare(spark, paths, directory, YDB_TABLE, close=close)
    if bad:
        assert error is not None
    else:
        assert got is not None and got.path == "jvm", got and got.reason


LINE_TABLE = {"columns": [{"name": "k", "type": "Uint64"}, {"name": "v", "type": "Uint32"},
                          {"name": "s", "type": "Utf8"}, {"name": "d", "type": "Double"},
                          {"name": "f", "type": "Bool"}], "primary_key": ["k"]}
REFUSED = [
    b'[1]', b'{"key":[1],"update":{}} x', b'{"key":[1],"update":{"d":NaN}}',
    b"{'key':[1],'update':{}}", b'{"key":[1],"update":{"v":1.0}}',
    b'{"key":[1],"update":{"v":"1"}}',
    b'{"key":[1],"update":{"v":4294967296}}', b'{"key":[1],"update":{"v":-1}}',
    b'{"key":[true],"update":{}}', b'{"key":[1.0],"update":{}}', b'{"key":[-1],"update":{}}',
    b'{"key":[18446744073709551616],"update":{}}', b'{"key":[1,2],"update":{}}',
    b'{"key":1,"update":{}}', b'{"update":{}}', b'{"key":[1],"update":{"x":1}}',
    b'{"key":[1],"update":{"k":1}}', b'{"key":[1],"reset":{},"erase":{}}', b'{"key":[1]}',
    b'{"key":[1],"update":null}', b'{"key":[1],"update":[]}',
    b'{"key":[1],"update":{},"ts":[1,-1]}',
    b'{"key":[1],"update":{},"ts":[1.0,1]}', b'{"key":[1],"update":{},"ts":[1]}',
    b'{"key":[1],"update":{},"ts":null}', b'{"key":[1],"update":{},"ts":[9223372036854775808,0]}',
    b'{"resolved":[1,2],"x":1}', b'{"resolved":[1,"2"]}', b'{"resolved":null}',
    b'{"key":[1],"update":{},"foo":1}', b'{"key":[1],"erase":{},"newImage":{"v":1}}',
    b'{"key":[1],"update":{"s":1}}', b'{"key":[1],"update":{"d":"NaN"}}',
    b'{"key":[1],"update":{"d":true}}', b'{"key":[1],"update":{"f":1}}',
    b'{"key":[1],"update":{"d":1e400}}', b'{"key":[1],"update":{"s":"\\ud800"}}',
    b'{"key":[1],"update":{},"newImage":{"v":1.5}}', b'{"key":[1],"update":{},"newImage":[]}',
    b'{"key":[1],"erase":{},"oldImage":{"k":1}}',
    b'\xef\xbb\xbf{"key":[1],"update":{}}', b'{"key":[1],"update":{"s":"\xff"}}',
    b'{"key":[9223372036854775808.0],"update":{}}',
]
#: Lines the VARIANT reads otherwise (a repeated name, `-0.0`, a float beside a Uint64 beyond a
#: long) and the typed parse reads as orjson does.
TYPED_AS_ORJSON = [b'{"key":[1],"update":{},"key":[2]}', b'{"key":[5],"update":{"d":-0.0}}',
                   b'{"key":[18446744073709551615],"reset":{"d":1e2}}']
ACCEPTED = [
    b' {"key" : [1], "update" : {"v":1, "s":"a\\"b}", "d":"-inf", "f":false}} ',
    b'{"key":[18446744073709551615],"reset":{"d":1.5},"ts":[9223372036854775807,0]}',
    b'{"key":[2],"erase":{"ignored":1},"oldImage":{"v":null}}',
    b'{"key":[3],"update":{"ignored":1},"newImage":{"d":12345678901234567890123}}',
    b'{"resolved":[9223372036854775807,18446744073709551615]}',
    b'{"key":[4],"update":{"s":"' + b'\\"' * 20000 + b'"}}',
    *TYPED_AS_ORJSON,
]


#: Lines of YDB's shapes that an expression-built parse once left to a parse of its own:
#: nulls in `update`, values of another kind, "nan", `-0`, escapes, what follows the object.
CAREFUL = [b'{"key":[1],"update":{"s":null}}', b'{"key":[1],"update":{"s":1}}',
           b'{"key":[1],"update":{"d":"nan"}}', b'{"key":["1"],"update":{}}',
           b'{"key":[-0],"update":{}}', b'{"key":[1],"update":{"v":01}}',
           b'{"key":[1],"update":{}}{}', b'{"key":[1],"update":{"\\u0073":"a"}}']


def test_lines_read_as_orjson_reads_them(spark: Any, tmp_path: Path) -> None:
    """A repeated name (the last counts: the Python path, as Java leaves it), `-0.0`, a float
    beside a Uint64 beyond a long: converted as the encoder does."""
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"\n".join(TYPED_AS_ORJSON) + b"\n")
    got, _ = compare(spark, [path], tmp_path, LINE_TABLE, close=True)
    assert got is not None


#: A key of two columns, not in the table's order, of two YDB types with different ranges.
TWO_KEY_TABLE = {"columns": [{"name": "a", "type": "Int32"}, {"name": "v", "type": "Utf8"},
                             {"name": "b", "type": "Uint32"}], "primary_key": ["b", "a"]}
TWO_KEY_LINES = [b'{"key":[5,-1],"update":{"v":"x"},"ts":[3,1]}',
                 b'{"key":[-1,5],"update":{"v":"x"},"ts":[3,1]}',
                 b'{"key":[4294967295,-2147483648],"erase":{},"oldImage":{"v":"y"}}',
                 b'{"key":[1,2147483648],"reset":{}}', b'{"key":[1,2],"newImage":null,'
                 b'"reset":{"v":null},"oldImage":{"v":"z"}}', b'{"resolved":[7,0]}']


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("table, lines, partitions", [
    (LINE_TABLE, "all", 3), (TWO_KEY_TABLE, TWO_KEY_LINES, 1)],
    ids=["three-tasks", "two-column-key-one-task"])
def test_the_tasks_facts_count_their_lines(spark: Any, tmp_path: Path, table: Any,
                                           lines: Any, partitions: int) -> None:
    """`YdbLines.java`'s facts: one row a task, whose counts are those of the lines it read
    and left (the rows themselves are held to the parser in
    `test_spark_changefeed_ydb_jvm.py`), a flawed line counted as such and left."""
    from changelake.formats.tableschema import TableSchema
    from changelake.spark.changefeed import ydb
    from changelake.spark.changefeed.read import read_lines

    if lines == "all":
        lines = REFUSED + ACCEPTED + CAREFUL + [b'{"key":[1],"update":{"s":"\xff"}}']
    schema = TableSchema.from_json(table)
    columns = ydb.ydb_columns(schema, list(schema.primary_key))
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    bounded = read_lines(spark, [str(path)]).bounded.repartition(partitions)
    got = ydb.java_items(bounded, schema, columns).collect()
    assert len(got) == len(lines)
    tasks = [r["_facts"] for r in got if r["_facts"] is not None]
    assert len(tasks) == min(partitions, len(lines))
    read = [r for r in got if not r["_deferred"]]
    assert all(r["kind"] == "left" for r in got if r["_deferred"])
    assert all(r["file"] is None for r in got)  # the caller names files by `file_index`
    facts = {n: sum(t[n] for t in tasks) for n in ydb.TASK_COUNTS}
    assert facts == {
        "flawed": sum(not _is_utf8(line) for line in lines), "deferred": len(lines) - len(read),
        "timed": sum(r["kind"] == "change" and r["has_ts"] for r in read),
        "untimed": sum(r["kind"] == "change" and not r["has_ts"] for r in read),
        "barriers": sum(r["kind"] == "resolved" for r in read)}
    assert read and len(read) < len(lines)
    assert facts["barriers"] and (facts["untimed"] or table is TWO_KEY_TABLE)


#: Samples of each kind of record the Spark path converts (NaN written as a string too).
WHOLE = ["ydb-test-json-new-and-old-images.jsonl", "ydb-test-json-keys-only-uuid-key.jsonl",
         "ydb-test-json-updates.jsonl", "ydb-test-json-nan-inf.jsonl"]


def test_the_parse_reads_a_batch_in_one_job_shuffled_by_key(spark: Any, tmp_path: Path) -> None:
    """`ydb_path._ydb_parsed_by_java` on samples the Spark path converts (`WHOLE`): a row
    per record and barrier, shuffled by key into the partitions it foresaw, so that the
    conversion's shuffle by key is planned away; the facts count the parser's items. Then a
    batch with a flawed line is named by the check, and one with a line Java leaves is
    `Unsupported`."""
    from pyspark.sql import functions as F

    from changelake.errors import InputError, Location
    from changelake.formats.change import Resolved
    from changelake.formats.tableschema import TableSchema
    from changelake.formats.ydb import YdbParser
    from changelake.spark.changefeed.dispatch import Unsupported
    from changelake.spark.changefeed.keyed import key_names
    from changelake.spark.changefeed.read import read_lines
    from changelake.spark.changefeed.ydb import with_content, ydb_columns
    from changelake.spark.changefeed.ydb_path import _ydb_parsed_by_java
    from changelake.spark.settings import NOT_ADAPTIVE
    from changelake.spark.settings import settings as spark_settings

    assert set(WHOLE) <= JVM_SAMPLES
    for name in WHOLE:
        schema = TableSchema.from_json(EXPECTED[name][0])
        columns = ydb_columns(schema, list(schema.primary_key))
        lines = read_lines(spark, [str(SAMPLES / name)])
        items, facts, blocks, partitions = _ydb_parsed_by_java(lines, schema, columns)
        parser = YdbParser(schema)
        parsed = [parser.parse_line(line, Location(name, n)) for n, line in
                  enumerate((SAMPLES / name).read_bytes().splitlines()) if line.strip()]
        changes = [i for i in parsed if not isinstance(i, Resolved)]
        assert (facts.timed, facts.untimed, facts.barriers) == (
            sum(c.position is not None for c in changes),
            sum(c.position is None for c in changes), len(parsed) - len(changes)), name
        rows = items.collect()
        assert len(rows) == len(parsed) and not any(r["_below"] for r in rows), name
        # shuffled by key by the parse's job: each key's records in one partition of those
        keys = len(schema.primary_key)
        assert partitions is not None and items.rdd.getNumPartitions() == partitions, name
        placed = items.select(*key_names(items.columns, keys),
                              F.spark_partition_id().alias("p")).distinct().collect()
        assert len(placed) == len({tuple(r)[:-1] for r in placed}), name
        # so the conversion's shuffle by key is planned away: it reads the parse's
        events = with_content(items.where("kind = 'change'"))
        with spark_settings(spark, NOT_ADAPTIVE):
            by_key = conversion._by_key(
                events, keys, conversion._partitions(spark, 1, partitions))
            plan = by_key._jdf.queryExecution().executedPlan().toString()
        assert "Exchange" not in plan, plan
        assert blocks is not None, name
    name = WHOLE[0]
    schema = TableSchema.from_json(EXPECTED[name][0])
    columns = ydb_columns(schema, list(schema.primary_key))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes((SAMPLES / name).read_bytes() + b'{"key":[1],"update":{"s":"\xff"}}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl"):
        _ydb_parsed_by_java(read_lines(spark, [str(bad)]), schema, columns)
    left = tmp_path / "left.jsonl"
    left.write_bytes((SAMPLES / name).read_bytes() + b'{"key":[null],"update":{}}\n')
    with pytest.raises(Unsupported, match=r"1 line\(s\) the Java line reader leaves"):
        _ydb_parsed_by_java(read_lines(spark, [str(left)]), schema, columns)


def test_the_parse_shuffles_into_partitions_foreseen_from_the_files_lengths(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ydb_path._parse_partitions`: the files' lengths over `BYTES_PER_RECORD`, spread as
    `keyed.partitions_for` spreads events (here 10 a partition), not Spark's estimate of the
    lines' plan (which their columns and names inflate); where Spark has no size (lines
    stored, as Kafka's records are), the session's shuffle partitions."""
    from changelake.spark.changefeed import keyed
    from changelake.spark.changefeed.read import Lines, read_lines
    from changelake.spark.changefeed.ydb_path import BYTES_PER_RECORD, _parse_partitions
    from changelake.spark.checkpoint import stored
    from changelake.spark.settings import settings as spark_settings

    monkeypatch.setattr(keyed, "EVENTS_PER_PARTITION", 10)
    paths = []
    for i, count in enumerate((300, 180)):
        path = tmp_path / f"part{i}.jsonl"
        path.write_text("".join(f'{{"key":[{j}],"update":{{"v":"x"}},"ts":[1,{j}]}}\n'
                                for j in range(count)))
        paths.append(path)
    total = sum(p.stat().st_size for p in paths)
    with spark_settings(spark, {"spark.sql.shuffle.partitions": "3"}):
        lines = read_lines(spark, [str(p) for p in paths])
        # the files' lengths, and the few bytes of the files' names the lines are joined with
        least = -(-(total // BYTES_PER_RECORD) // 10)
        assert 3 < least <= _parse_partitions(lines) <= least + 2
        planned = lines.bounded._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()
        assert int(planned) > 2 * total  # what the leaves' sum is taken instead of
        assert _parse_partitions(Lines(spark, stored(lines.raw), lines.files)) == 3
