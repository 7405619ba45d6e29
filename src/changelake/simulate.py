"""Histories and the logs that mangle them: the adversary the protocol is built against.

An at-least-once log may duplicate messages, deliver them in any order, carry the output of
several writers that batched the same history differently, and stop short. `mangle` does all
of that to a message stream; `justified` computes, directly from the truth and the delivered
messages (without the Reader's machinery), what any correct reader must recover. Tests,
benchmarks and `changelake demo` share these so they exercise one and the same adversary.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from changelake.formats.materialize import CdcSchema, write_json_lines, write_ocf
from changelake.protocol.consolidate import consolidate
from changelake.protocol.messages import Message, Progress, Update, Updates
from changelake.protocol.writer import Writer
from changelake.values import Record


@dataclass(frozen=True, slots=True)
class History:
    """Changes (not consolidated) and the points after which the writer finished input."""

    changes: list[Update]
    finish_points: list[int]  # finish_through(T) is called after the changes up to T
    closed: bool

    @property
    def truth(self) -> list[Update]:
        """The consolidated updates: what a reader of a complete log must recover."""
        return consolidate(self.changes)


def random_history(
    rng: random.Random,
    *,
    updates: int = 100,
    times: int = 10,
    keys: int = 20,
    closed: bool = True,
) -> History:
    """Rows `Record(id=.., v=..)` inserted, updated and deleted over `times` logical times.

    Changes include cancelling pairs and repeats so that consolidation has work to do.
    """
    live: dict[int, int] = {}
    changes: list[Update] = []
    time_points = sorted(rng.sample(range(1, times * 3 + 1), times))
    for _ in range(updates):
        time = rng.choice(time_points)
        key = rng.randrange(keys)
        row = Record((("id", key), ("v", rng.randrange(5))))
        roll = rng.random()
        if roll < 0.1:  # a change and its retraction at one time: consolidates away
            changes += [(row, time, 1), (row, time, -1)]
        elif key in live and roll < 0.4:
            changes.append((Record((("id", key), ("v", live.pop(key)))), time, -1))
        else:
            changes.append((row, time, rng.choice((1, 1, 2, -1))))
            live[key] = row.get("v")
    finish = sorted(rng.sample(time_points, max(1, len(time_points) // 3)))
    return History(changes, finish, closed)


def write(history: History, *, batch_size: int = 7, finish_every: int = 1) -> list[Message]:
    """The messages one writer emits for a history, finishing at every `finish_every`-th point
    (different writers batch progress differently)."""
    writer = Writer(batch_size=batch_size)
    messages: list[Message] = []
    by_time = sorted(history.changes, key=lambda u: u[1])
    points = history.finish_points[::finish_every]
    position = 0
    for point in points:
        while position < len(by_time) and by_time[position][1] <= point:
            writer.push(*by_time[position])
            position += 1
        messages += writer.finish_through(point)
    for change in by_time[position:]:
        writer.push(*change)
    if history.closed:
        messages += writer.close()
    return messages


def rebatch(messages: Sequence[Message], rng: random.Random) -> list[Message]:
    """Split and merge update batches; progress statements stay as they are."""
    pool = [u for m in messages if isinstance(m, Updates) for u in m.updates]
    rng.shuffle(pool)
    out: list[Message] = [m for m in messages if isinstance(m, Progress)]
    while pool:
        size = rng.randint(1, max(1, len(pool) // 2))
        out.append(Updates(pool[:size]))
        pool = pool[size:]
    return out


def mangle(
    streams: Sequence[Sequence[Message]],
    rng: random.Random,
    *,
    duplicate: float = 0.5,
    keep: float = 1.0,
) -> list[Message]:
    """Mix several writers' streams, re-batch, duplicate, shuffle, and keep a prefix.

    `keep` < 1 truncates the shuffled log, as a reader that has not seen everything yet.
    """
    log: list[Message] = []
    for stream in streams:
        log += rebatch(stream, rng)
    log += [m for m in log if rng.random() < duplicate]
    rng.shuffle(log)
    return log[: int(len(log) * keep)] if keep < 1 else log


def justified(truth: Sequence[Update], delivered: Sequence[Message]) -> tuple[list[Update], list]:
    """What a correct reader must report from `delivered`: (updates, frontier as JSON).

    Integer times only. The covered prefix is found by chaining delivered statements from 0;
    the frontier is held back by the first covered time whose updates were not all delivered.
    """
    statements = [m for m in delivered if isinstance(m, Progress)]
    seen = {(d, t) for m in delivered if isinstance(m, Updates) for d, t, _ in m.updates}
    covered: int | None = 0  # None: closed
    grew = True
    while grew and covered is not None:
        grew = False
        for p in statements:
            (low,) = p.lower.elements
            if low <= covered:
                if not p.upper.elements:
                    covered, grew = None, True
                    break
                (up,) = p.upper.elements
                if up > covered:
                    covered, grew = up, True
    missing = [t for d, t, _ in truth if (d, t) not in seen and (covered is None or t < covered)]
    frontier = min(missing) if missing else covered
    kept = [u for u in truth if frontier is None or u[1] < frontier]
    return kept, ([] if frontier is None else [frontier])



# ------------------------------------------------------------------ a Debezium changefeed

ORDER_COLUMNS = ("id", "customer", "amount_cents", "status")


@dataclass(frozen=True, slots=True)
class DebeziumFeed:
    """Debezium PostgreSQL change events for a table `orders`, with the truth to check against.

    Events are bare payloads as the default replica identity writes them: updates carry no
    before-image and deletes only the key, so conversion must take previous rows by key. The
    feed ends with a tail of events re-sent after a simulated connector restart.
    """

    events: list[dict]
    states: list[tuple[int, dict[int, dict]]]  # (time, rows by id after that time)
    replayed: int

    @property
    def final(self) -> dict[int, dict]:
        return self.states[-1][1]


def debezium_orders(
    rng: random.Random, *, rows: int = 50, transactions: int = 60, replay: int = 5
) -> DebeziumFeed:
    """A snapshot of `rows` orders, then `transactions` transactions of 1-4 changes each.

    Times follow the Debezium mapping changelake uses for PostgreSQL (`formats/debezium.py`):
    a transaction's time is `sequence[0]`, the LSN of the previous commit; snapshot rows come
    at time 0.
    """
    live: dict[int, dict] = {}
    events: list[dict] = []
    lsn = 24_000_000
    statuses = ("new", "paid", "shipped", "returned")

    def event(op: str, before: dict | None, after: dict | None, *, snapshot: str,
              previous_commit: int | None, xid: int) -> dict:
        nonlocal lsn
        lsn += rng.randint(8, 200)
        sequence = orjson.dumps([None if previous_commit is None else str(previous_commit),
                                 str(lsn)]).decode()
        return {"before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000 + lsn,
                "transaction": None,
                "source": {"version": "2.5.0.Final", "connector": "postgresql", "name": "demo",
                           "ts_ms": 1_700_000_000_000 + lsn, "snapshot": snapshot, "db": "shop",
                           "sequence": sequence, "schema": "public", "table": "orders",
                           "txId": xid, "lsn": lsn, "xmin": None}}

    def order(key: int) -> dict:
        return {"id": key, "customer": f"customer-{rng.randrange(20)}",
                "amount_cents": rng.randrange(100, 100_000), "status": rng.choice(statuses)}

    xid = 500
    for key in range(rows):
        live[key] = order(key)
        flag = "last" if key == rows - 1 else ("first" if key == 0 else "true")
        events.append(event("r", None, live[key], snapshot=flag, previous_commit=None, xid=xid))
    states: list[tuple[int, dict[int, dict]]] = [(0, {k: dict(v) for k, v in live.items()})]
    previous_commit = lsn
    next_key = rows
    for _ in range(transactions):
        xid += 1
        time = previous_commit
        touched: set[int] = set()
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            candidates = [k for k in live if k not in touched]
            if roll < 0.35 or not candidates:
                key, next_key = next_key, next_key + 1
                live[key] = order(key)
                events.append(event("c", None, live[key], snapshot="false",
                                    previous_commit=time, xid=xid))
            elif roll < 0.8:
                key = rng.choice(candidates)
                live[key] = {**live[key], "status": rng.choice(statuses),
                             "amount_cents": rng.randrange(100, 100_000)}
                events.append(event("u", None, live[key], snapshot="false",
                                    previous_commit=time, xid=xid))
            else:
                key = rng.choice(candidates)
                del live[key]
                events.append(event("d", {"id": key, "customer": None, "amount_cents": None,
                                          "status": None}, None, snapshot="false",
                                    previous_commit=time, xid=xid))
            touched.add(key)
        lsn += rng.randint(8, 64)  # the commit record
        previous_commit = lsn
        states.append((time, {k: dict(v) for k, v in live.items()}))
    tail = events[-replay:] if replay else []
    return DebeziumFeed(events + tail, states, len(tail))


def write_log_files(directory: Path, parts: Sequence[Sequence[Message]], schema: CdcSchema,
                    *, prefix: str = "part-", start: int = 0) -> list[Path]:
    """One file per part, alternating JSON lines (even parts) and Avro OCF (odd parts), as a
    log written by several kinds of writer; returns the paths in part order. `start` numbers
    the first part, so a log written in several calls keeps alternating."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for k, part in enumerate(parts, start=start):
        path = directory / f"{prefix}{k:03d}{'.avro' if k % 2 else '.jsonl'}"
        with open(path, "wb") as fo:
            (write_ocf if k % 2 else write_json_lines)(fo, part, schema)
        paths.append(path)
    return paths
