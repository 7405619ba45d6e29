"""Generated CDC histories for the lake tests: the truth, and the mangled deliveries of it.

A history is a list of `(row, time, diff)` updates over integer times, consistent for a keyed
table (each key changes by retracting its old row and inserting its new one) or an arbitrary
multiset history for an unkeyed one. Deliveries go through the real protocol: `Writer` turns the
history into CDCv2 messages, which are duplicated, reordered and split into increments, and a
`Reader` recovers finished batches from them, as an ingest would.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from changelake.protocol import Antichain, Message, Reader, Writer
from changelake.simulate import debezium_orders

Row = tuple
Update = tuple[Row, int, int]

SCHEMA = StructType([
    StructField("id", LongType()),
    StructField("name", StringType()),
    StructField("amount", LongType()),
])


def keyed_history(rng: random.Random, times: int, keys: int, per_time: int) -> list[Update]:
    """Inserts, updates and deletes of `keys` keys over `times` times."""
    live: dict[int, Row] = {}
    out: list[Update] = []
    for t in range(times):
        touched = rng.sample(range(keys), min(keys, per_time))
        for k in touched:
            old = live.get(k)
            roll = rng.random()
            if old is not None and roll < 0.2:
                out.append((old, t, -1))
                del live[k]
            else:
                new = (k, rng.choice(["ann", "bob", "cy", None]), rng.randrange(1000))
                if new == old:
                    continue
                if old is not None:
                    out.append((old, t, -1))
                out.append((new, t, 1))
                live[k] = new
    return out


def unkeyed_history(rng: random.Random, times: int, values: int, per_time: int) -> list[Update]:
    """A multiset over a few distinct rows, so multiplicities above one are common."""
    live: Counter[Row] = Counter()
    out: list[Update] = []
    for t in range(times):
        changes: Counter[Row] = Counter()
        for _ in range(per_time):
            row = (rng.randrange(values), rng.choice(["x", "y"]), rng.randrange(3))
            if live[row] + changes[row] > 0 and rng.random() < 0.4:
                changes[row] -= 1
            else:
                changes[row] += rng.choice([1, 1, 2])
        for row, diff in changes.items():
            if diff:
                out.append((row, t, diff))
                live[row] += diff
    return out


def state_at(history: Sequence[Update], t: int, *, keyed: bool) -> Counter:
    """The truth: the multiset of rows after all updates at times <= t."""
    acc: Counter[Row] = Counter()
    for row, time, diff in history:
        if time <= t:
            acc[row] += diff
    out = Counter({row: n for row, n in acc.items() if n > 0})
    if keyed:
        assert all(n == 1 for n in out.values())
        assert len({row[0] for row in out}) == len(out)
    return out


def rows_of(df: DataFrame) -> Counter:
    return Counter(tuple(r) for r in df.collect())


def messages(history: Sequence[Update], finish_every: int, rng: random.Random,
             last_time: int) -> list[Message]:
    """The history through a Writer, finishing times in steps, then mangled: every message
    possibly duplicated, and neighbours shuffled."""
    writer = Writer(batch_size=7)
    by_time: dict[int, list[Update]] = {}
    for u in history:
        by_time.setdefault(u[1], []).append(u)
    out: list[Message] = []
    for t in range(last_time + 1):
        writer.extend(by_time.get(t, []))
        if t % finish_every == finish_every - 1 or t == last_time:
            out.extend(writer.finish_through(t))
    mangled: list[Message] = []
    for m in out:
        mangled.append(m)
        if rng.random() < 0.3:
            mangled.append(m)
    for i in range(len(mangled) - 1):  # local reordering
        if rng.random() < 0.3:
            mangled[i], mangled[i + 1] = mangled[i + 1], mangled[i]
    return mangled


@dataclass(frozen=True)
class Increment:
    updates: list[Update]
    lower: Antichain
    upper: Antichain


def increments(msgs: Sequence[Message], rng: random.Random, overlap: float = 0.3
               ) -> Iterator[Increment]:
    """Read the messages in chunks as an ingest would; sometimes re-deliver an increment that
    overlaps what was already delivered (a replayed log), which the lake must not double."""
    reader = Reader()
    lower = reader.frontier
    pending: list[Update] = []
    delivered: list[Increment] = []
    i = 0
    while i < len(msgs):
        step = rng.randint(1, 6)
        for m in msgs[i:i + step]:
            for batch, _frontier in reader.push(m):
                pending.extend(batch)
        i += step
        if reader.frontier != lower:
            inc = Increment(pending, lower, reader.frontier)
            delivered.append(inc)
            yield inc
            if len(delivered) > 1 and rng.random() < overlap:
                # a replay: the previous and this increment again, as one overlapping input
                a, b = delivered[-2], delivered[-1]
                yield Increment(a.updates + b.updates, a.lower, b.upper)
            lower, pending = reader.frontier, []


def to_df(spark: SparkSession, updates: Sequence[Update], schema: StructType = SCHEMA
          ) -> DataFrame:
    fields = [*schema.fields, StructField("_time", LongType()), StructField("_diff", LongType())]
    return spark.createDataFrame([(*row, t, d) for row, t, d in updates], StructType(fields))


def changes_are_exactly_once(table, key: str = "id") -> bool:
    """A keyed table's committed changes apply exactly once: per key, its row at `since`
    (0 or 1) plus the diffs of the change segments after it is 0 or 1, so no insertion came
    without the retraction of the row before it and nothing was retracted twice. (Compacted
    buckets hold each key's state at `since`, not its changes, so their diffs do not sum.)"""
    from pyspark.sql import functions as F

    from changelake.lake.sql import union_sql

    state = table.state()
    at_since = table.as_of(state.since).select(key, F.lit(1).cast("long").alias("_diff"))
    changes = table.spark.sql(union_sql(state, table.directory, state.segments()))
    sums = (at_since.unionByName(changes.select(key, "_diff"))
            .groupBy(key).agg(F.sum("_diff").alias("n")).where(~F.col("n").isin(0, 1)))
    return sums.count() == 0


def write_parts(tmp_path: Path, rng: random.Random) -> tuple[object, list[str]]:
    """A keyed Debezium orders feed cut at two random points into three files (for writers
    that race each other with overlapping parts): the feed, and the files' paths."""
    feed = debezium_orders(rng, rows=12, transactions=30, replay=0)
    cuts = sorted(rng.sample(range(1, len(feed.events)), 2))
    parts = []
    for n, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, len(feed.events)], strict=True)):
        path = tmp_path / f"part-{n}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in feed.events[lo:hi]))
        parts.append(str(path))
    return feed, parts
