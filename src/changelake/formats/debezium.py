"""Debezium JSON values (PostgreSQL, MySQL, and YDB's DEBEZIUM_JSON) into `Change`s.

Why one module of over 500 lines: the envelope rules and the value decoding of one format: the
specification the Spark path is tested against, kept whole.

Envelopes accepted (SPEC §1.2): schema+payload, bare payload, `{"payload": ...}`,
`{"schema": null, "payload": ...}`, and tombstones (a `null` line or a null payload). A line may
also be a Kafka record dump `{"key": <key JSON>, "value": <value JSON>}`; the key then names the
row's primary key. What is left is classified: `op` makes a data event, `status` a transaction
BEGIN/END, `ddl`/`tableChanges` a schema-change event, only `ts_*` a heartbeat, a schema named
`...Key` a key record. Anything else is a `ChangefeedError`.

Positions and times (the CDCv2 mapping, DESIGN.md "Conventions"):

* PostgreSQL. Position `(sequence[0], sequence[1], lsn)` (missing parts 0): Debezium emits in
  commit order and `sequence` orders events within it; `lsn` alone does not (PITFALLS P3).
  Time: `sequence[0]`, the LSN of the previous commit. It is shared by every event of one
  transaction and strictly increases from one transaction to the next, so it is a commit-ordered
  transaction time. Without `sequence[0]` (Debezium < 1.5, or null after some restarts) the
  transaction's time is the `lsn` of its first event this parser saw (by `txId`); that is a
  fallback, not commit-ordered for concurrent transactions (SPEC §1.4: LSNs of concurrent
  transactions interleave). What happens then is an error, not a wrong history: a transaction
  that began before, but committed after, one already finished arrives with a time below the
  frontier, and conversion refuses it naming its line ("arrives after times below ... were
  finished"). Debezium >= 1.5 sends `sequence`; older feeds need it fixed upstream.
* MySQL. Position `(binlog file number, pos, row)`. Time: the binlog position of the
  transaction as `file_number << 32 | pos`: from `transaction.id` (`file=..,pos=..`) when present,
  else the position of the first event seen with the same GTID, else the event's own position.
* YDB (`source.connector == "ydb"`). Position `(step, txId)`, time `step`: a step's transactions
  become one time (Uint64 pairs do not fit one long).
* Snapshot rows (`source.snapshot` true/first/last/...) have no time of their own on PostgreSQL
  and MySQL (`time=None`): conversion places them at the stream's current time, which is 0 for
  an initial snapshot, i.e. before the first streamed transaction.

Values are decoded by the Connect schema when the message carries one (or when the table schema
gives a column's `debezium` field schema): decimals from base64 two's-complement with the
schema's scale, `io.debezium.time.*` by their units, bytes from base64; the result is plain JSON
(see `change.py`). `__debezium_unavailable_value` (as text, as base64 bytes, or as the single
element of an array) becomes `UNCHANGED`.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

from changelake.errors import ChangefeedError, Location
from changelake.formats import lines as jsonl
from changelake.formats.change import (
    NAN,
    UNCHANGED,
    Change,
    Item,
    Op,
    Skipped,
    TxBoundary,
)
from changelake.formats.tableschema import TableSchema
from changelake.protocol.time import MAX_TIME
from changelake.text import short

PLACEHOLDER = "__debezium_unavailable_value"
PLACEHOLDER_B64 = base64.b64encode(PLACEHOLDER.encode()).decode()
_SNAPSHOT_TRUE = frozenset({"true", "first", "last", "first_in_data_collection",
                            "last_in_data_collection"})
_OPS = {"c": Op.CREATE, "r": Op.READ, "u": Op.UPDATE, "d": Op.DELETE, "t": Op.TRUNCATE,
        "m": Op.MESSAGE}
_KAFKA_FIELDS = frozenset({"key", "value", "headers", "topic", "partition", "offset",
                           "timestamp"})
_ENVELOPE_FIELDS = ("op", "before", "after", "status", "source")
# Decimals are written out in full ("f" format), so their size is bounded: PostgreSQL's
# numeric allows a scale up to 16383 digits; 4 KiB of two's complement is ~9860 digits (and
# converting more takes time quadratic in the length).
MAX_DECIMAL_SCALE = 16383
MAX_DECIMAL_BYTES = 4096
_PG_TX_ID = re.compile(r"^(\d+):\d+$")
_DIGITS = re.compile(r"[0-9]{1,20}")  # ASCII only: str.isdigit also takes "²"
_EPOCH = dt.datetime(1970, 1, 1)
#: What `DebeziumParser._locate` finds in a source block: position, time, transaction id, and
#: whether the time is the transaction's (`Change.tx_timed`).
_Located = tuple[tuple[int, ...] | None, int | None, str | None, bool]
# PostgreSQL +-infinity timestamps as Debezium writes them (µs; the ms form is /1000).
_PG_INFINITY_US = {9223372036825200000: "infinity", -9223372036832400000: "-infinity"}

FieldSchema = Mapping[str, Any]


def loads(line: bytes | str, origin: Location) -> Any:
    """orjson within the bounds of `lines.py`, a failure one clear error at this line."""
    try:
        return jsonl.loads(line)
    except jsonl.JsonError as error:
        raise ChangefeedError(str(error), origin) from None


def normalise_tx_id(raw: Any) -> str:
    """PostgreSQL ids are `txId:LSN` with an LSN that differs between BEGIN, data and END:
    keep the txId. Other ids (MySQL GTIDs `uuid:n`, `file=..,pos=..`) are kept whole."""
    text = str(raw)
    m = _PG_TX_ID.match(text)
    return m.group(1) if m else text


class DebeziumParser:
    """Parses one stream's values. Stateful only to give one time to a MySQL GTID or a
    PostgreSQL txId without `sequence` (see the module docstring); share one parser across the
    files of one connector."""

    def __init__(self, table_schema: TableSchema | None = None) -> None:
        self.table_schema = table_schema
        self._tx_time: dict[str, int] = {}

    # ------------------------------------------------------------------------- envelopes

    def parse_line(self, line: bytes | str, origin: Location) -> Item:
        return self.parse(loads(line, origin), origin)

    def parse(self, value: Any, origin: Location, key: Mapping[str, Any] | None = None) -> Item:
        if value is None:
            return _tombstone(key, origin)
        if not isinstance(value, dict):
            raise ChangefeedError(
                f"a Debezium value must be a JSON object or null, got {short(value)}", origin)
        if "value" in value and set(value) <= _KAFKA_FIELDS:
            return self.parse(value["value"], origin, _unwrap_key(value.get("key"), origin))
        schema: Any = None
        payload: Any = value
        if "payload" in value and not any(f in value for f in _ENVELOPE_FIELDS):
            schema = value.get("schema")
            payload = value["payload"]
            if payload is None:
                return _tombstone(key, origin)
            if not isinstance(payload, dict):
                raise ChangefeedError(f"payload must be an object, got {short(payload)}", origin)
        if "op" in payload:
            return self._data_event(payload, schema, key, origin)
        if "status" in payload:
            return _tx_boundary(payload, origin)
        if "ddl" in payload or "tableChanges" in payload:
            return Skipped("schema-change", origin)
        if payload and set(payload) <= {"ts_ms", "ts_us", "ts_ns"}:
            return Skipped("heartbeat", origin)
        if isinstance(schema, dict) and str(schema.get("name", "")).endswith(".Key"):
            return Skipped("key", origin)
        raise ChangefeedError(
            "not a Debezium change event (no op), transaction event (no status) or schema "
            f"change (no ddl); fields: {sorted(payload)[:8]}", origin)

    # ------------------------------------------------------------------------ data events

    def _data_event(self, payload: dict[str, Any], schema: Any,
                    key: Mapping[str, Any] | None, origin: Location) -> Change:
        raw_op = payload["op"]
        op = _OPS.get(raw_op) if isinstance(raw_op, str) else None
        if op is None:
            raise ChangefeedError(f"unknown op {short(raw_op)} (expected one of c, r, u, d, t, m)",
                                  origin)
        source = payload.get("source")
        if not isinstance(source, dict):
            raise ChangefeedError("data event without a source block", origin)
        snapshot = _snapshot_flag(source.get("snapshot"), origin)
        if op is Op.CREATE and snapshot:
            op = Op.READ  # legacy MySQL snapshots emitted c (PITFALLS P11)
        tx = payload.get("transaction")
        if tx is not None and not isinstance(tx, dict):
            raise ChangefeedError("transaction must be an object or null", origin)
        position, time, tx_id, tx_timed = self._locate(source, tx, snapshot, origin)
        if time is not None and time > MAX_TIME:
            raise ChangefeedError(f"the transaction's time {time} (from source) does not fit "
                                  "a 64-bit signed integer, as CDCv2 times must", origin)
        fields = _envelope_fields(schema)
        before = self._image(payload.get("before"), fields.get("before"), "before", origin)
        after = self._image(payload.get("after"), fields.get("after"), "after", origin)
        if op is Op.DELETE and after is not None:
            raise ChangefeedError("a delete (op d) must not have an after image", origin)
        if op in (Op.CREATE, Op.READ) and after is None:
            raise ChangefeedError(f"op {raw_op} without an after image", origin)
        message = None
        if op is Op.MESSAGE:
            msg = payload.get("message")
            if not isinstance(msg, dict):
                raise ChangefeedError("op m without a message block", origin)
            message = (str(msg.get("prefix")), str(msg.get("content")))
        order = tx.get("total_order") if tx else None
        if order is not None and type(order) is not int:
            raise ChangefeedError(f"transaction.total_order must be an integer, got {short(order)}",
                                  origin)
        return Change(op=op, key=key, before=before, after=after, position=position, time=time,
                      transaction=tx_id, table=_table_name(source), origin=origin,
                      snapshot=snapshot, tx_order=order, message=message, tx_timed=tx_timed)

    def _locate(self, source: dict[str, Any], tx: dict[str, Any] | None, snapshot: bool,
                origin: Location) -> _Located:
        """(position, time, transaction id, whether the time is the transaction's: see
        `Change.tx_timed`) from the source block; see the module docstring."""
        tx_id = normalise_tx_id(tx["id"]) if tx and tx.get("id") is not None else None
        if source.get("connector") == "ydb" or "step" in source:
            step = _uint(source.get("step"), "source.step", origin)
            txid = _uint(source.get("txId"), "source.txId", origin)
            return (step, txid), step, tx_id, False
        if "lsn" in source or "txId" in source or "sequence" in source:
            return self._locate_pg(source, tx_id, snapshot, origin)
        if "file" in source or "pos" in source:
            return self._locate_mysql(source, tx_id, snapshot, origin)
        return None, None, tx_id, False

    def _locate_pg(self, source: dict[str, Any], tx_id: str | None, snapshot: bool,
                   origin: Location) -> _Located:
        seq0, seq1 = _pg_sequence(source.get("sequence"), origin)
        lsn = _opt_uint(source.get("lsn"), "source.lsn", origin)
        xid = _opt_uint(source.get("txId"), "source.txId", origin)
        if tx_id is None and xid is not None:
            tx_id = str(xid)
        if seq0 is None and seq1 is None and lsn is None:
            return None, None, tx_id, False  # incremental-snapshot rows carry no position
        position = (seq0 or 0, seq1 if seq1 is not None else (lsn or 0), lsn or 0)
        if snapshot:
            return position, None, tx_id, False
        if seq0 is not None:
            return position, seq0, tx_id, False
        time = lsn if lsn is not None else seq1
        if tx_id is not None and time is not None:
            return position, self._tx_time.setdefault(tx_id, time), tx_id, True
        return position, time, tx_id, False

    def _locate_mysql(self, source: dict[str, Any], tx_id: str | None, snapshot: bool,
                      origin: Location) -> _Located:
        file_no = _binlog_number(source.get("file"), origin)
        pos = _uint(source.get("pos"), "source.pos", origin)
        row = _opt_uint(source.get("row"), "source.row", origin) or 0
        if pos >= 1 << 32:
            raise ChangefeedError(f"source.pos {pos} does not fit 32 bits", origin)
        position = (file_no, pos, row)
        gtid = source.get("gtid")
        if tx_id is None and isinstance(gtid, str):
            tx_id = gtid
        if snapshot:
            return position, None, tx_id, False
        time = file_no << 32 | pos
        if tx_id is not None and tx_id.startswith("file="):
            return position, _binlog_tx_time(tx_id, origin), tx_id, False
        if tx_id is not None:
            return position, self._tx_time.setdefault(tx_id, time), tx_id, True
        return position, time, tx_id, False

    # ---------------------------------------------------------------------------- values

    def _image(self, raw: Any, struct: FieldSchema | None, what: str,
               origin: Location) -> dict[str, Any] | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ChangefeedError(f"{what} must be an object or null, got {short(raw)}", origin)
        fields: dict[str, FieldSchema] = {}
        if isinstance(struct, dict):
            listed = struct.get("fields")
            for f in listed if isinstance(listed, list) else ():
                if isinstance(f, dict) and isinstance(f.get("field"), str):
                    fields[f["field"]] = f
        elif self.table_schema is not None:
            for c in self.table_schema.columns:
                if c.debezium is not None:
                    fields[c.name] = c.debezium
        out: dict[str, Any] = {}
        # Schema order first (it is the table's column order), then any extra fields.
        for name in [*(n for n in fields if n in raw), *(n for n in raw if n not in fields)]:
            try:
                out[name] = decode_value(raw[name], fields.get(name))
            except (ValueError, TypeError, ArithmeticError) as error:  # dates, decimals
                raise ChangefeedError(f"{what}.{name}: {error}", origin) from None
        return out


# -------------------------------------------------------------------------- value decoding


def decode_value(value: Any, schema: FieldSchema | None) -> Any:
    """One field value, by its Connect field schema when there is one. Plain JSON out."""
    if _is_placeholder(value):
        return UNCHANGED
    if value is None:
        return None
    if schema is None:
        return value
    name = schema.get("name")
    kind = schema.get("type")
    if name is not None:
        decoder = _LOGICAL.get(name)
        if decoder is not None:
            return decoder(value, schema)
    if kind == "bytes":
        return _bytes(value)
    if kind in ("float", "float32", "float64", "double"):
        return _float(value)
    if kind == "array" and isinstance(value, list):
        items = schema.get("items")
        return [decode_value(v, items if isinstance(items, dict) else None) for v in value]
    if kind == "struct" and isinstance(value, dict):
        fields = {f.get("field"): f for f in schema.get("fields") or () if isinstance(f, dict)}
        return {k: decode_value(v, fields.get(k)) for k, v in value.items()}
    return value


def _is_placeholder(value: Any) -> bool:
    if isinstance(value, str):
        return value in (PLACEHOLDER, PLACEHOLDER_B64)
    return isinstance(value, list) and len(value) == 1 and isinstance(value[0], str) \
        and value[0] in (PLACEHOLDER, PLACEHOLDER_B64)


def _bytes(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"bytes must be a base64 string, got {short(value)}")
    return base64.b64decode(value, validate=True).decode("latin-1")


def _float(value: Any) -> Any:
    if isinstance(value, str):
        special = {"NaN": NAN, "Infinity": math.inf, "-Infinity": -math.inf}
        if value in special:
            return special[value]
        raise ValueError(f"expected a number, got {short(value)}")
    return value


def _scale(schema: FieldSchema) -> int:
    params = schema.get("parameters")
    raw = params.get("scale", 0) if isinstance(params, dict) else 0
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"decimal scale {short(raw)} is not an integer") from None


def _unscaled(value: Any) -> int:
    if not isinstance(value, str):
        raise ValueError(f"decimal bytes must be base64 text, got {short(value)}")
    raw = base64.b64decode(value, validate=True)
    if len(raw) > MAX_DECIMAL_BYTES:
        raise ValueError(f"decimal of {len(raw)} bytes, more than the maximum of "
                         f"{MAX_DECIMAL_BYTES}")
    return int.from_bytes(raw, "big", signed=True)


def _decimal_text(unscaled: int, scale: int) -> str:
    if abs(scale) > MAX_DECIMAL_SCALE:
        raise ValueError(f"decimal scale {scale} is beyond the maximum of {MAX_DECIMAL_SCALE}")
    # Exact: the default context rounds to 28 digits, and a NUMERIC(38, 2) has 38.
    exact = decimal.Context(prec=len(str(abs(unscaled))))
    return format(decimal.Decimal(unscaled).scaleb(-scale, exact), "f")


def _connect_decimal(value: Any, schema: FieldSchema) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(decimal.Decimal(str(value)), "f")  # JsonConverter decimal.format=NUMERIC
    return _decimal_text(_unscaled(value), _scale(schema))


def _variable_decimal(value: Any, _schema: FieldSchema) -> Any:
    if isinstance(value, dict) and "value" in value:
        scale = value.get("scale")
        if type(scale) is not int:
            raise ValueError(f"VariableScaleDecimal scale must be an integer, got {short(scale)}")
        return _decimal_text(_unscaled(value["value"]), scale)
    if isinstance(value, str) and value.upper() == "NAN":
        return "NaN"
    raise ValueError(f"VariableScaleDecimal must be {{scale, value}}, got {short(value)}")


def _int(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"expected an integer, got {short(value)}")
    return value


def _date(value: Any, _schema: FieldSchema) -> str:
    try:
        return (dt.date(1970, 1, 1) + dt.timedelta(days=_int(value))).isoformat()
    except OverflowError:
        raise ValueError(f"date {value} is out of range") from None


def _time_of_day(value: Any, per_second: int) -> str:
    total = _int(value)
    seconds, fraction = divmod(total, per_second)
    hours, rest = divmod(seconds, 3600)
    text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    if fraction:
        digits = len(str(per_second)) - 1
        text += "." + f"{fraction:0{digits}d}".rstrip("0")
    return text


def _timestamp(value: Any, per_second: int) -> str:
    total = _int(value)
    micros = total * 1_000_000 // per_second if per_second >= 1_000_000 \
        else total * (1_000_000 // per_second)
    special = _PG_INFINITY_US.get(micros)
    if special is not None:
        return special
    seconds, fraction = divmod(total, per_second)
    try:
        moment = _EPOCH + dt.timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"timestamp {total} is out of range") from None
    text = moment.isoformat()
    if fraction:
        digits = len(str(per_second)) - 1
        text += "." + f"{fraction:0{digits}d}".rstrip("0")
    return text


_LOGICAL: dict[str, Any] = {
    "org.apache.kafka.connect.data.Decimal": _connect_decimal,
    "io.debezium.data.VariableScaleDecimal": _variable_decimal,
    "io.debezium.time.Date": _date,
    "org.apache.kafka.connect.data.Date": _date,
    "io.debezium.time.Time": lambda v, s: _time_of_day(v, 1000),
    "org.apache.kafka.connect.data.Time": lambda v, s: _time_of_day(v, 1000),
    "io.debezium.time.MicroTime": lambda v, s: _time_of_day(v, 1_000_000),
    "io.debezium.time.NanoTime": lambda v, s: _time_of_day(v, 1_000_000_000),
    "io.debezium.time.Timestamp": lambda v, s: _timestamp(v, 1000),
    "org.apache.kafka.connect.data.Timestamp": lambda v, s: _timestamp(v, 1000),
    "io.debezium.time.MicroTimestamp": lambda v, s: _timestamp(v, 1_000_000),
    "io.debezium.time.NanoTimestamp": lambda v, s: _timestamp(v, 1_000_000_000),
    "io.debezium.data.Bits": lambda v, s: _bytes(v),
}


# -------------------------------------------------------------------------------- helpers


def _tombstone(key: Mapping[str, Any] | None, origin: Location) -> Change:
    return Change(Op.TOMBSTONE, key, None, None, None, None, origin=origin)


def _unwrap_key(raw: Any, origin: Location) -> dict[str, Any] | None:
    """A Kafka key as JSON: `{"schema":..,"payload":{..}}`, `{"payload":{..}}` or bare."""
    if raw is None:
        return None
    if isinstance(raw, dict) and "payload" in raw and set(raw) <= {"schema", "payload"}:
        raw = raw["payload"]
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ChangefeedError(f"the record key must be an object, got {short(raw)}", origin)
    return dict(raw)


def _tx_boundary(payload: dict[str, Any], origin: Location) -> TxBoundary:
    status = payload.get("status")
    if status not in ("BEGIN", "END"):
        raise ChangefeedError(f"transaction status must be BEGIN or END, got {short(status)}",
                              origin)
    raw_id = payload.get("id")
    if raw_id is None:
        raise ChangefeedError("transaction event without an id", origin)
    count = payload.get("event_count")
    if status == "END" and type(count) is not int:
        raise ChangefeedError(f"END needs an integer event_count, got {short(count)}", origin)
    per: list[tuple[str, int]] = []
    collections = payload.get("data_collections") or []
    if not isinstance(collections, list):
        raise ChangefeedError(f"data_collections must be an array, got {short(collections)}",
                              origin)
    for entry in collections:
        if not isinstance(entry, dict) or type(entry.get("event_count")) is not int:
            raise ChangefeedError(f"bad data_collections entry {short(entry)}", origin)
        per.append((str(entry.get("data_collection")), entry["event_count"]))
    return TxBoundary(status, normalise_tx_id(raw_id), count if status == "END" else None,
                      tuple(per), origin)


def _envelope_fields(schema: Any) -> dict[str, FieldSchema]:
    if not isinstance(schema, dict):
        return {}
    fields = schema.get("fields")
    if not isinstance(fields, list):
        return {}  # not a Connect struct schema: values are taken as they are
    return {f["field"]: f for f in fields
            if isinstance(f, dict) and isinstance(f.get("field"), str)}


def _snapshot_flag(raw: Any, origin: Location) -> bool:
    """True for snapshot rows of an initial or repeated snapshot. `incremental` rows are not:
    they interleave with streaming and are ordinary upserts at their arrival."""
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    if isinstance(raw, str):
        return raw in _SNAPSHOT_TRUE
    raise ChangefeedError(f"source.snapshot must be a string or boolean, got {short(raw)}", origin)


def _table_name(source: dict[str, Any]) -> str | None:
    table = source.get("table")
    if not table:
        return None
    prefix = source.get("schema") or source.get("db")
    return f"{prefix}.{table}" if prefix else str(table)


def _uint(value: Any, what: str, origin: Location) -> int:
    if type(value) is not int or value < 0:
        raise ChangefeedError(f"{what} must be a non-negative integer, got {short(value)}",
                              origin)
    return value


def _opt_uint(value: Any, what: str, origin: Location) -> int | None:
    return None if value is None else _uint(value, what, origin)


def _pg_sequence(raw: Any, origin: Location) -> tuple[int | None, int | None]:
    """`sequence` is a JSON *string* holding `[lastCommittedLsn, currentLsn]`, either null."""
    if raw is None:
        return None, None
    try:
        parts = orjson.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(parts, list) or len(parts) != 2:
            raise ValueError
        out = [None if p is None else _lsn(p) for p in parts]
    except (ValueError, TypeError, orjson.JSONDecodeError):
        raise ChangefeedError(f"source.sequence must be '[lsn, lsn]', got {short(raw)}",
                              origin) from None
    return out[0], out[1]


def _lsn(value: Any) -> int:
    """An LSN in `sequence`: a non-negative integer, or its decimal digits."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    raise ValueError


def _binlog_number(raw: Any, origin: Location) -> int:
    if not isinstance(raw, str) or "." not in raw or not _DIGITS.fullmatch(raw.rsplit(".", 1)[1]):
        raise ChangefeedError(f"source.file must be a binlog name like mysql-bin.000003, "
                              f"got {short(raw)}", origin)
    return int(raw.rsplit(".", 1)[1])


def _binlog_tx_time(tx_id: str, origin: Location) -> int:
    parts = dict(p.split("=", 1) for p in tx_id.split(",") if "=" in p)
    pos = parts.get("pos", "")
    if not _DIGITS.fullmatch(pos):
        raise ChangefeedError(f"transaction id {short(tx_id)} has no pos", origin)
    return _binlog_number(parts.get("file"), origin) << 32 | int(pos)

