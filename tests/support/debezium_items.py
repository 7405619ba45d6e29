"""The Java line reader's rows (`parse.java_items`) held to the specification.

`spec_item` is what the Python parser (`DebeziumParser`, fresh for each line, so that a time
is the line's own) makes of one line; `as_spec` puts a row of Java's into the same form, so
that the two compare with `==`; `left_as_documented` says why `DebeziumLine.java` leaves a line
the parser accepts (None: no reason it lists). `aggregated_facts` is what the tasks' facts
(`debezium_path._merged_facts`) stand for: Spark's aggregates over every parsed line.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from changelake.errors import ChangefeedError, Location
from changelake.formats.change import Change, Op, Skipped, TxBoundary
from changelake.formats.debezium import DebeziumParser, _envelope_fields

_WHERE = Location("line", 1)
_SNAPSHOT_KNOWN = ("true", "first", "last", "first_in_data_collection",
                   "last_in_data_collection", "false", "incremental")
#: `source.sequence` as Debezium writes it, the shape Java reads (`DebeziumLine.sequence`).
_SEQUENCE = re.compile(r'\[(null|"[0-9]{1,18}"),(null|"[0-9]{1,18}")\]\Z')
_TEXT = ("connector", "snapshot", "sequence", "file", "gtid", "step", "table", "schema", "db")
_NUMBER = ("lsn", "txId", "pos", "row")


def spec_item(line: bytes) -> dict[str, Any] | ChangefeedError:
    """The parser's item for `line` as `as_spec` writes Java's rows, or the error it raises."""
    try:
        item = DebeziumParser().parse_line(line, _WHERE)
    except ChangefeedError as error:
        return error
    if isinstance(item, Skipped):
        return {"kind": "skipped"}
    if isinstance(item, TxBoundary):
        return {"kind": item.status, "tx": item.id,
                **({"end_count": item.event_count, "end_collections": list(item.per_collection)}
                   if item.status == "END" else {})}
    assert isinstance(item, Change), item
    if item.op is Op.TOMBSTONE:
        return {"kind": "tombstone"}
    return {"kind": "change", "op": item.op.value, "ptime": item.time,
            "tx_min": item.tx_timed, "tx": item.transaction, "tx_order": item.tx_order,
            "pos": None if item.position is None else list(item.position),
            "table": item.table, "snapshot": item.snapshot, "before": item.before,
            "after": item.after}


def as_spec(row: Any) -> dict[str, Any]:
    """A row of `java_items` in `spec_item`'s form: its images decoded as the parser decodes
    the line's (by the Connect schema Java gives, `schema`)."""
    kind = row["kind"]
    if kind in ("skipped", "tombstone"):
        return {"kind": kind}
    if kind in ("BEGIN", "END"):
        return {"kind": kind, "tx": row["tx"],
                **({"end_count": row["end_count"], "end_collections": [
                    (c["data_collection"], c["event_count"])
                    for c in row["end_collections"] or ()]} if kind == "END" else {})}
    fields = _envelope_fields(_json_or_text(row["schema"]))
    parser = DebeziumParser()

    def image(what: str) -> Any:
        raw = row[f"{what}_raw"]
        return None if raw is None else parser._image(orjson.loads(raw), fields.get(what),
                                                     what, _WHERE)

    return {"kind": kind, "op": row["op"], "ptime": row["ptime"], "tx_min": row["tx_min"],
            "tx": row["tx"], "tx_order": row["tx_order"],
            "pos": None if row["pos"] is None else list(row["pos"]), "table": row["table"],
            "snapshot": row["snapshot"], "before": image("before"), "after": image("after")}


def _json_or_text(text: str | None) -> Any:
    """The envelope's `schema` as Java gives it: an object's text, or a string's content."""
    try:
        return None if text is None else orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _has_a_key_twice(line: bytes) -> bool:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [k for k, _ in items]
        if len(set(names)) != len(names):
            raise KeyError("twice")
        return dict(items)

    try:
        json.loads(line, object_pairs_hook=pairs)
    except KeyError:
        return True
    return False


def left_as_documented(line: bytes, item: dict[str, Any]) -> str | None:
    """Which of the lines `DebeziumLine.java` lists as left (though the parser accepts them)
    `line` is, for the parser's `item`; None where it is none of them."""
    text = line.decode("utf-8", "replace")
    if text != "null" and (not text.startswith("{") or text != text.strip()):
        return "not one JSON object opening at the line's first byte, alone on the line"
    if _has_a_key_twice(line):
        return "a key twice in an object"
    value = orjson.loads(line)
    if value is None:
        return None
    if "value" in value and set(value) <= {"key", "value", "headers", "topic", "partition",
                                           "offset", "timestamp"}:
        return "a Kafka record dump"
    body = value["payload"] if "payload" in value and not any(
        f in value for f in ("op", "before", "after", "status", "source")) else value
    if isinstance(value.get("schema"), str):
        return "a field of another JSON kind than its type (a schema as a string)"
    if not isinstance(body, dict):
        return None
    source = body.get("source")
    if item["kind"] == "skipped" and (
            any(body.get(f) is not None for f in ("op", "before", "after", "status", "source"))
            or not ("ddl" in body or "tableChanges" in body
                    or (body and set(body) <= {"ts_ms", "ts_us", "ts_ns"}))):
        return "neither a change, a boundary, a schema change without a source block nor a " \
            "heartbeat (a key record, say)"
    if item["kind"] == "change":
        if body["op"] in ("t", "m"):
            return "a truncate or a logical message"
        if not isinstance(source, dict):
            return None
        if source.get("connector") == "ydb" or "step" in source:
            return "YDB's Debezium JSON"
        for name in _TEXT:
            if name in source and not isinstance(source[name], str | None) and not (
                    name == "snapshot" and isinstance(source[name], bool)):
                return f"a field of another JSON kind than its type (source.{name})"
        if any(isinstance(source.get(n), str) for n in _NUMBER):
            return "a field of another JSON kind than its type (a number as text)"
        snapshot = source.get("snapshot")
        if isinstance(snapshot, str) and snapshot not in _SNAPSHOT_KNOWN:
            return "a source snapshot not among the flags Debezium writes"
        gtid = source.get("gtid")
        if isinstance(gtid, str) and (":" not in gtid or gtid[:1] in "{["):
            return "a gtid unlike a GTID"
        sequence = source.get("sequence")
        if isinstance(sequence, str) and not _SEQUENCE.match(sequence):
            return "a sequence not in Debezium's shape"
        if item["pos"] is None:
            return "a change without a position"
        if item["op"] in ("c", "r", "u") and item["after"] is None:
            return "a change without an after image"
        if re.search(r'"(after|before)"\s*:\s*"', text):
            return "an image that may be a JSON string (a key `after` or `before` before a string)"
        if "status" in body:
            return "a change that also has a status"
        if any(v is not None and v >= 1 << 63 for v in item["pos"]) or any(
                len(d) > 18 for d in re.findall(r"\.([0-9]+)(?:,|$)", str(source.get("file"))
                                                + "," + str(item["tx"]))):
            return "a binlog number of more than 18 digits"
    if item["kind"] in ("BEGIN", "END") and body.get("source") is not None:
        return "a boundary with a source"
    if item["kind"] in ("BEGIN", "END") and re.search(r'"data_collections"\s*:\s*"', text):
        return "data_collections that may be a JSON string"
    return None


def aggregated_facts(items: Any) -> dict[str, Any]:
    """What `debezium_path._merged_facts` gathers from the tasks (but `shapes`), as Spark's
    aggregates over `items`, the lines as `java_items(udf=True)` reads them."""
    from pyspark.sql import functions as F

    change = F.col("kind") == "change"
    return items.agg(
        F.count("flaw").alias("flawed"), F.count(F.when(change, 1)).alias("changes"),
        F.min(F.when(change, F.col("table"))).alias("table"),
        F.max(F.when(change, F.col("table"))).alias("other_table"),
        F.count(F.when(change & F.col("ptime").isNull(), 1)).alias("untimed"),
        F.count(F.when(change & F.col("tx_min"), 1)).alias("by_tx"),
        F.count(F.when(F.col("kind").isin("BEGIN", "END") | F.col("tx_order").isNotNull(), 1))
        .alias("metadata"),
        F.max(F.when(change, F.col("ptime"))).alias("high"),
        F.min(F.when(change, F.col("schema"))).alias("schema"),
        F.max(F.when(change, F.col("schema"))).alias("other_schema"),
        F.count(F.when(change & F.col("schema").isNull(), 1)).alias("schemaless"),
        F.min_by(F.when(change, F.struct("after_raw", "before_raw", "schema")),
                 F.when(change & (F.col("after_raw").isNotNull()
                                  | F.col("before_raw").isNotNull()),
                        F.struct("file_index", "block", "row"))).alias("first"),
        F.count_if(F.col("_deferred")).alias("_deferred"),
        F.count(F.when(change & (F.col("op") == "t"), 1)).alias("truncates"),
        F.count(F.when(change & (F.col("op") == "c") & (
            F.col("after_raw").contains("__debezium_unavailable_value")
            | F.col("after_raw").contains("X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==")
            | F.col("after_raw").contains("\\u")), 1)).alias("placeheld")).first().asDict()
