"""Generated histories, written as changefeeds, encoded, decoded: every state must come back.

A PostgreSQL-style history (snapshot, inserts, updates with TOAST-unchanged columns, deletes,
primary-key changes) is written as the Debezium events a connector with the default replica
identity emits (no before-image on update, key-only before-image on delete, tombstones), in
every envelope shape, with a connector restart that re-sends a tail, optionally with the
transaction-metadata topic. A YDB history (initial scan, UPDATES-mode partial writes, REPLACE,
erase, Uint64 keys beyond a signed long, NaN/inf) is written to two partitions with barriers
and out-of-order records between them. Decoding the CDCv2 output with `protocol.collect` must
give the history's state after every transaction (Debezium) or step (YDB), and its final state.
"""

from __future__ import annotations

import base64
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.convert import encode_changefeed
from changelake.errors import ChangefeedError
from changelake.formats.change import NAN
from changelake.formats.debezium import PLACEHOLDER
from changelake.protocol import collect
from changelake.values import freeze
from tests.support.seeding import seeded

FIXTURE = [HealthCheck.function_scoped_fixture]  # tmp_path_factory is safe to share
PG_COLUMNS = ("id", "name", "amount", "note")
DECIMAL = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
           "parameters": {"scale": "2"}, "optional": True}
PG_TABLE = {"columns": [{"name": "id"}, {"name": "name"}, {"name": "amount", "debezium": DECIMAL},
                        {"name": "note"}], "primary_key": ["id"]}
PG_VALUE_SCHEMA = {"type": "struct", "fields": [
    {"field": image, "type": "struct", "optional": True, "fields": [
        {"field": "id", "type": "int32"}, {"field": "name", "type": "string"},
        {"field": "amount", **DECIMAL}, {"field": "note", "type": "string"}]}
    for image in ("before", "after")]}


# ------------------------------------------------------------------------ the PG history


@dataclass
class PgHistory:
    snapshot: dict[int, tuple[str, int, str]]
    transactions: list[list[tuple[Any, ...]]]
    replay: tuple[float, float]  # where the restart happens and how far back it re-sends
    metadata: bool
    tx_file_first: bool
    shapes: list[int] = field(default_factory=list)


@st.composite
def pg_histories(draw: Any, truncates: bool = False) -> PgHistory:
    """A history; with `truncates`, some transactions hold a truncate (`("truncate",)`: every
    row goes), first in the history or anywhere after."""
    names = st.sampled_from(["ann", "bob", "cy", "dee"])
    amounts = st.integers(-10**6, 10**6)
    notes = st.sampled_from(["short", "x" * 50, "toasted text"])
    state = {i: (draw(names), draw(amounts), draw(notes))
             for i in range(draw(st.integers(0, 4)))}
    snapshot = dict(state)
    next_id = 100
    transactions = []
    for _ in range(draw(st.integers(1, 8))):
        ops: list[tuple[Any, ...]] = []
        for _ in range(draw(st.integers(1, 4))):
            kinds = ["insert", "update", "delete", "rekey"] if state else ["insert"]
            kind = draw(st.sampled_from([*kinds, "truncate"] if truncates else kinds))
            if kind == "truncate":
                state.clear()
                ops.append(("truncate",))
                continue
            if kind == "insert":
                next_id += 1
                state[next_id] = (draw(names), draw(amounts), draw(notes))
                ops.append(("insert", next_id, state[next_id]))
                continue
            key = draw(st.sampled_from(sorted(state)))
            if kind == "update":
                keep_note = draw(st.booleans())
                name, amount, note = draw(names), draw(amounts), state[key][2]
                if not keep_note:
                    note = draw(notes)
                state[key] = (name, amount, note)
                ops.append(("update", key, state[key], keep_note))
            elif kind == "delete":
                del state[key]
                ops.append(("delete", key))
            else:  # the note unchanged is TOASTed: the placeholder (`key_moves`), or not
                next_id += 1
                state[next_id] = state.pop(key)
                ops.append(("rekey", key, next_id, state[next_id], draw(st.booleans())))
        transactions.append(ops)
    return PgHistory(snapshot, transactions,
                     (draw(st.floats(0, 1)), draw(st.floats(0, 1))), draw(st.booleans()),
                     draw(st.booleans()),
                     draw(st.lists(st.integers(0, 3), min_size=64, max_size=64)))


def _amount(cents: int) -> str:
    return base64.b64encode(cents.to_bytes(8, "big", signed=True)).decode()


def _json_row(key: int, values: tuple[str, int, str], toast: bool = False) -> dict[str, Any]:
    name, amount, note = values
    return {"id": key, "name": name, "amount": _amount(amount),
            "note": PLACEHOLDER if toast else note}


def _wrap(payload: dict[str, Any], shape: int) -> Any:
    return [{"schema": PG_VALUE_SCHEMA, "payload": payload}, payload,
            {"schema": None, "payload": payload}, {"payload": payload}][shape]


def _expected_row(key: int, values: tuple[str, int, str]) -> Any:
    name, amount, note = values
    return freeze({"id": key, "name": name, "amount": _decimal(amount), "note": note},
                  fields=PG_COLUMNS)


def _decimal(cents: int) -> str:
    from decimal import Decimal

    return format(Decimal(cents).scaleb(-2), "f")


def write_pg(history: PgHistory, directory: Path) -> tuple[list[Path], list[int],
                                                           list[Counter[Any]]]:
    """The feed files, each transaction's CDCv2 time, and the state after each (index 0:
    the snapshot at time 0)."""
    lines: list[tuple[bytes, int | None]] = []  # (line, index of the transaction) for replay
    shapes = iter(history.shapes * 100)
    lsn = 1000
    source = {"version": "2.7.0.Final", "connector": "postgresql", "name": "pg", "db": "db",
              "schema": "public", "table": "items", "xmin": None}
    state = {k: v for k, v in history.snapshot.items()}
    states = [Counter(_expected_row(k, v) for k, v in state.items())]
    keys = sorted(state)
    for n, key in enumerate(keys):
        flag = "last" if n == len(keys) - 1 else ("first" if n == 0 else "true")
        payload = {"op": "r", "before": None, "after": _json_row(key, state[key]),
                   "source": {**source, "snapshot": flag, "txId": 99, "lsn": lsn,
                              "sequence": f'[null,"{lsn}"]'}, "ts_ms": 1}
        lines.append((orjson.dumps(_wrap(payload, next(shapes))), None))
    previous_commit = lsn - 10
    times: list[int] = [0]
    ends: list[bytes] = []
    for index, ops in enumerate(history.transactions):
        xid = 500 + index
        order = 0
        for op in ops:
            lsn += 8
            src = {**source, "snapshot": "false", "txId": xid, "lsn": lsn,
                   "sequence": orjson.dumps([str(previous_commit), str(lsn)]).decode()}

            def event(kind: str, before: Any, after: Any, src: dict[str, Any] = src,
                      xid: int = xid) -> bytes:
                nonlocal order
                order += 1
                payload = {"op": kind, "before": before, "after": after, "source": src,
                           "ts_ms": 2}
                if history.metadata:
                    payload["transaction"] = {"id": f"{xid}:{src['lsn']}", "total_order": order,
                                              "data_collection_order": order}
                return orjson.dumps(_wrap(payload, next(shapes)))

            key_only = {"id": None, "name": None, "amount": None, "note": None}
            if op[0] == "insert":
                lines.append((event("c", None, _json_row(op[1], op[2])), index))
                state[op[1]] = op[2]
            elif op[0] == "update":
                lines.append((event("u", None, _json_row(op[1], op[2], toast=op[3])), index))
                state[op[1]] = op[2]
            elif op[0] == "delete":
                lines.append((event("d", {**key_only, "id": op[1]}, None), index))
                lines.append((b"null", index))
                del state[op[1]]
            elif op[0] == "truncate":
                lines.append((event("t", None, None), index))
                state.clear()
            else:
                lines.append((event("d", {**key_only, "id": op[1]}, None), index))
                lines.append((b"null", index))
                lines.append((event("c", None, _json_row(op[2], op[3],
                                                         toast=len(op) > 4 and op[4])), index))
                del state[op[1]]
                state[op[2]] = op[3]
        commit = lsn + 8
        times.append(previous_commit)
        previous_commit = commit
        lsn = commit
        states.append(Counter(_expected_row(k, v) for k, v in state.items()))
        ends.append(orjson.dumps({"status": "BEGIN", "id": f"{xid}:{commit - 100}",
                                  "event_count": None, "data_collections": None}))
        ends.append(orjson.dumps({"status": "END", "id": f"{xid}:{commit}", "event_count": order,
                                  "data_collections": [{"data_collection": "public.items",
                                                        "event_count": order}]}))
    # A connector restart: everything since some earlier point is sent again.
    cut = int(history.replay[0] * len(lines))
    start = int(history.replay[1] * cut)
    data = [line for line, _ in lines[:cut] + lines[start:cut] + lines[cut:]]
    paths = [directory / "items.jsonl"]
    paths[0].write_bytes(b"\n".join(data) + b"\n")
    if history.metadata:
        tx = directory / "transactions.jsonl"
        tx.write_bytes(b"\n".join(ends + ends[-2:]) + b"\n")  # a duplicate END too
        paths = [tx, *paths] if history.tx_file_first else [*paths, tx]
    return paths, times, states


def state_at(updates: list[Any], time: int) -> Counter[Any]:
    total: Counter[Any] = Counter()
    for data, t, diff in updates:
        if t <= time:
            total[data] += diff
    assert all(n >= 0 for n in total.values())
    return +total


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE)
@given(history=pg_histories(), close=st.booleans())
def test_pg_history_round_trips(tmp_path_factory: pytest.TempPathFactory, history: PgHistory,
                                close: bool) -> None:
    paths, times, states = write_pg(history, tmp_path_factory.mktemp("pg"))
    got = collect(encode_changefeed(paths, source="debezium", keys=["id"],
                                    table_schema=PG_TABLE, close=close, lenient=False))
    assert {t for _, t, _ in got.updates} <= set(times)
    if close:
        assert got.frontier.is_closed
    else:
        # Metadata finishes the last transaction too; the high water alone leaves it open.
        last = times[-1] + 1 if history.metadata else times[-1]
        assert got.frontier.elements == (last,)
    for time, expected in zip(times, states, strict=True):
        if close or time < got.frontier.elements[0]:
            assert state_at(got.updates, time) == expected


# --------------------------------------------------------------- full images, no keys (MySQL)


def write_full_images(history: PgHistory, path: Path, *, one_event: bool = False
                      ) -> tuple[Path, dict[int, Any]]:
    """`history` as a MySQL connector with FULL row images writes it (before images on
    updates and deletes), truncates as op t, with its connector restart's re-sent tail; and
    the rows at the end. A transaction's events are at one position each, or (`one_event`)
    rows of one binlog event (one `pos`): the Spark path's high water is the greatest own
    position of an event, where the encoder's is the greatest GTID time, so a transaction over
    several positions ends with another open frontier on the two."""
    lines: list[bytes] = []
    state = dict(history.snapshot)
    source = {"connector": "mysql", "db": "inv", "table": "items", "server_id": 1}
    pos = 4
    for key in sorted(state):
        lines.append(orjson.dumps({"op": "r", "after": _json_row(key, state[key]), "source": {
            **source, "snapshot": "true", "file": "bin.000001", "pos": pos, "row": 0}}))
    for ops in history.transactions:
        pos += 100
        src = {**source, "snapshot": "false", "file": "bin.000001", "gtid": f"g:{pos}"}
        for row, op in enumerate(ops):
            s = {**src, "pos": pos, "row": row} if one_event else {**src, "pos": pos + row}
            if op[0] == "truncate":
                lines.append(orjson.dumps({"op": "t", "source": s}))
                state.clear()
            elif op[0] == "insert":
                lines.append(orjson.dumps({"op": "c", "after": _json_row(op[1], op[2]),
                                           "source": s}))
                state[op[1]] = op[2]
            elif op[0] == "update":
                lines.append(orjson.dumps({"op": "u", "before": _json_row(op[1], state[op[1]]),
                                           "after": _json_row(op[1], op[2]), "source": s}))
                state[op[1]] = op[2]
            elif op[0] == "delete":
                lines.append(orjson.dumps({"op": "d", "before": _json_row(op[1], state.pop(op[1])),
                                           "source": s}))
            else:
                lines.append(orjson.dumps({"op": "u", "before": _json_row(op[1], state.pop(op[1])),
                                           "after": _json_row(op[2], op[3]), "source": s}))
                state[op[2]] = op[3]
    cut = int(history.replay[0] * len(lines))
    start = int(history.replay[1] * cut)
    path.write_bytes(b"\n".join(lines[:cut] + lines[start:cut] + lines[cut:]) + b"\n")
    return path, state


@settings(max_examples=30, deadline=None, suppress_health_check=FIXTURE)
@given(history=pg_histories())
def test_full_before_images_convert_without_keys(tmp_path_factory: pytest.TempPathFactory,
                                                 history: PgHistory) -> None:
    """The same history as a MySQL connector with FULL row images writes it."""
    path, state = write_full_images(history, tmp_path_factory.mktemp("my") / "items.jsonl")
    expected = Counter(_expected_row(k, v) for k, v in state.items())
    no_key = {**PG_TABLE, "primary_key": []}
    for keys, schema in ((None, no_key), (["id"], no_key), (None, PG_TABLE)):
        got = collect(encode_changefeed([path], source="debezium", keys=keys,
                                        table_schema=schema, close=True, lenient=False))
        assert state_at(got.updates, 2**62) == expected


# ------------------------------------------------------------------------ bad input


def test_bad_line_strict_names_it_and_keeps_what_was_finished(tmp_path: Path) -> None:
    history = PgHistory({1: ("a", 1, "n")}, [[("update", 1, ("b", 2, "n"), False)],
                                             [("insert", 101, ("c", 3, "m"))],
                                             [("delete", 1)]], (1.0, 1.0), False, False, [1] * 64)
    paths, times, states = write_pg(history, tmp_path)
    lines = paths[0].read_bytes().splitlines()
    bad_at = len(lines) - 1  # before the last transaction's events
    lines.insert(bad_at - 1, b'{"op": "u", "source": ')
    paths[0].write_bytes(b"\n".join(lines))
    messages: list[Any] = []
    with pytest.raises(ChangefeedError) as caught:
        for m in encode_changefeed(paths, source="debezium", keys=["id"], table_schema=PG_TABLE,
                                   close=True, lenient=False):
            messages.append(m)
    assert str(caught.value).startswith(f"{paths[0]}, line {bad_at}: not valid JSON")
    got = collect(messages)
    # Everything up to the time before the bad line is finished and was written.
    assert got.frontier.elements == (times[2],)
    assert state_at(got.updates, times[1]) == states[1]

    aside: list[Any] = []
    lenient = collect(encode_changefeed(paths, source="debezium", keys=["id"],
                                        table_schema=PG_TABLE, close=True, lenient=True,
                                        set_aside=aside.append))
    assert [a.location.line for a in aside] == [bad_at]
    for time, expected in zip(times, states, strict=True):
        assert state_at(lenient.updates, time) == expected


# ------------------------------------------------------------------------ the YDB history

YDB_TABLE = {"columns": [{"name": "id", "type": "Uint64"}, {"name": "name", "type": "Utf8"},
                         {"name": "score", "type": "Double"}], "primary_key": ["id"]}
BIG = 2**63


@st.composite
def ydb_histories(draw: Any) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from([1, 2, 3, 4, 5, BIG + 1, BIG + 2, 2**64 - 1]),
                         min_size=1, max_size=8, unique=True))
    scores = st.sampled_from([0.5, 2.0, "nan", "inf", "-inf", None])
    names = st.sampled_from(["a", "b", "c", None])
    scan = {k: (draw(names), draw(scores)) for k in keys if draw(st.booleans())}
    txs = []
    for _ in range(draw(st.integers(1, 10))):
        touched = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
        ops = []
        for k in touched:
            kind = draw(st.sampled_from(["update", "reset", "erase"]))
            written = {}
            if kind != "erase":
                if draw(st.booleans()):
                    written["name"] = draw(names)
                if draw(st.booleans()):
                    written["score"] = draw(scores)
            ops.append((kind, k, written))
        txs.append((draw(st.integers(0, 2)), ops, draw(st.booleans())))  # step gap, barrier?
    return {"scan": scan, "txs": txs, "seed": draw(st.integers(0, 2**32))}


def _score(value: Any) -> Any:
    return {"nan": NAN, "inf": float("inf"), "-inf": float("-inf")}.get(value, value)


def write_ydb(history: dict[str, Any], directory: Path) -> tuple[list[Path], dict[int, Counter],
                                                                 int | None]:
    """Two partition files; the state after each step; the last barrier step."""
    rng = seeded(history["seed"])
    partitions: list[list[list[tuple[int, bytes]]]] = [[[]], [[]]]  # windows of (key, line)
    state: dict[int, dict[str, Any]] = {}
    states: dict[int, Counter] = {}
    step = 100

    def record(key: int, body: dict[str, Any], ts: list[int]) -> None:
        partitions[key % 2][-1].append((key, orjson.dumps({**body, "key": [key], "ts": ts})))

    for key, (name, score) in history["scan"].items():
        record(key, {"update": {"name": name, "score": score}}, [step, 0])
        state[key] = {"name": name, "score": _score(score)}
    states[step] = Counter(freeze({"id": k, **v}, ("id", "name", "score"))
                           for k, v in state.items())
    last_barrier = None
    tx_id = 7
    for gap, ops, barrier in history["txs"]:
        step += gap
        tx_id += 1
        for kind, key, written in ops:
            if kind == "erase":
                record(key, {"erase": {}}, [step, tx_id])
                state.pop(key, None)
                continue
            record(key, {kind: written}, [step, tx_id])
            base = state.get(key, {}) if kind == "update" else {}
            state[key] = {c: _score(written[c]) if c in written else base.get(c)
                          for c in ("name", "score")}
        states[step] = Counter(freeze({"id": k, **v}, ("id", "name", "score"))
                               for k, v in state.items())
        if barrier:
            step += 1
            last_barrier = step
            for windows in partitions:
                windows[-1].append((-1, orjson.dumps({"resolved": [step, 0]})))
                windows.append([])
    paths = []
    for p, windows in enumerate(partitions):
        out: list[bytes] = []
        for window in windows:
            # Out of ts order across keys between barriers, in order per key (P20).
            body = [w for w in window if w[0] != -1]
            tail = [w for w in window if w[0] == -1]
            queues: dict[int, list[bytes]] = {}
            for key, line in body:
                queues.setdefault(key, []).append(line)
            while queues:
                key = rng.choice(sorted(queues))
                out.append(queues[key].pop(0))
                if not queues[key]:
                    del queues[key]
            out.extend(line for _, line in tail)
        path = directory / f"partition-{p}.jsonl"
        path.write_bytes(b"\n".join(out) + b"\n")
        paths.append(path)
    return paths, states, last_barrier


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURE)
@given(history=ydb_histories(), close=st.booleans())
def test_ydb_history_round_trips(tmp_path_factory: pytest.TempPathFactory,
                                 history: dict[str, Any], close: bool) -> None:
    paths, states, last_barrier = write_ydb(history, tmp_path_factory.mktemp("ydb"))
    got = collect(encode_changefeed(paths, source="ydb", keys=None, table_schema=YDB_TABLE,
                                    close=close, lenient=False))
    if close:
        assert got.frontier.is_closed
    else:
        assert got.frontier.elements == ((last_barrier,) if last_barrier else (0,))
    for step, expected in states.items():
        if close or step < got.frontier.elements[0]:
            assert state_at(got.updates, step) == expected
