"""`changelake ingest --follow --kafka --from debezium|ydb`: changefeed topics followed into a
lake table, each round committed exactly once.

Materialize CDC sources are followed by a Structured Streaming query (`follow.py`), whose
checkpoint keeps the offsets and the pending messages. A changefeed needs neither: its offsets
already live in the lake table's commits, and a round re-reads what the table still needs
(`kafka_changefeed`). So following it is a loop of those ingests, one round every
`trigger_seconds`: each round reads from the offsets the last commit recorded to the partitions'
ends, converts on Spark and commits with its offsets, or commits nothing when nothing is new.
There is no checkpoint: a SIGKILL anywhere leaves the last commit's offsets, and the restarted
follow reads from there, as a one-shot ingest would; nothing is lost or doubled.

A clean stop (`FollowControl.stop`, which the CLI calls on SIGTERM and SIGINT) lets the round in
flight commit, then returns; `until_idle` stops once no round has found new records for that
many seconds. `status` shows the lag as for any Kafka-ingested table: each partition's
committed offset against its end, and the partition holding the frontier back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from changelake.errors import LakeError
from changelake.lake.catalog import Lake
from changelake.lake.current_follower import following
from changelake.lake.follow import FollowControl, FollowReport
from changelake.lake.identifier import TableIdentifier
from changelake.lake.kafka_changefeed import ingest_changefeed_topics
from changelake.lake.kafka_ingest import KafkaIngestReport
from changelake.lake.table import DEFAULT_BUCKETS

RoundProgress = Callable[[int, KafkaIngestReport], None]
"""progress(round number, the round's ingest report), after each round."""

ROUND_STEPS = {"reading topics": "plan", "converting": "read", "committing": "convert",
               "done": "commit"}
"""A round's steps, by the `ingest_changefeed_topics` progress step that ends each: `plan`
(the writer lock, the committed offsets and the partitions' ends), `read` (the records read
and counted on the executors), `convert` (the conversion and the resume points), `commit`
(the table's commit). A round's report carries their seconds (`KafkaIngestReport.steps`),
those it reached: one with nothing new ends after `read`."""


class _StepTimer:
    """A `ProgressFn` keeping the seconds from a round's start to each step of it."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.seconds: dict[str, float] = {}

    def __call__(self, description: str, _done: int, _total: int) -> None:
        now = time.monotonic()
        name = ROUND_STEPS.get(description)
        if name is not None:
            self.seconds[name] = round(now - self.last, 3)
            self.last = now


def follow_changefeed_topics(
    lake: Lake,
    table: str | TableIdentifier,
    bootstrap: str,
    topics: str | Sequence[str],
    *,
    source: str,
    key: Sequence[str] = (),
    table_schema: Path | None = None,
    group: str | None = None,
    buckets: int = DEFAULT_BUCKETS,
    scd2: bool = False,
    trigger_seconds: float = 2.0,
    until_idle: float | None = None,
    control: FollowControl | None = None,
    progress: RoundProgress | None = None,
    config: Mapping[str, Any] | None = None,
    lenient: bool = False,
    dead_letter_topic: str | None = None,
) -> FollowReport:
    """Ingest `topics` round after round until `control.stop()` is called or (`until_idle`)
    no round found new records for that many seconds: see the module docstring. The other
    options are `ingest_changefeed_topics`'s, for every round."""
    if trigger_seconds <= 0:
        raise LakeError(f"trigger interval {trigger_seconds} s: it must be positive")
    control = control or FollowControl()
    handle = lake.handle(table)
    # The MERGE into a Delta table's `current` stays in the round (beside the rounds it took
    # the same two cores and made them slower); the logs' checkpoints, a Spark job in every
    # tenth round otherwise, are a thread's (`current_follower.py`).
    with following(lake, merge=False):
        rounds = committed = 0
        last_new = time.monotonic()
        while not control.stopping.is_set():
            started = time.monotonic()
            before = handle.load()
            timer = _StepTimer()
            report = ingest_changefeed_topics(lake, handle.ident, bootstrap, topics, source=source,
                                              key=key, table_schema=table_schema, group=group,
                                              buckets=buckets, scd2=scd2, config=config,
                                              lenient=lenient, dead_letter_topic=dead_letter_topic,
                                              progress=timer)
            report = replace(report, steps=timer.seconds)
            rounds += 1
            after = handle.load()
            if after is not None and (before is None or after.version != before.version):
                committed += 1
            if report.records and (before is None or before.offsets != after.offsets):
                last_new = time.monotonic()
            if progress is not None:
                progress(rounds, report)
            if until_idle is not None and time.monotonic() - last_new >= until_idle:
                break
            control.stopping.wait(max(0.0, trigger_seconds - (time.monotonic() - started)))
    return FollowReport(handle.name, rounds, committed, "")  # no checkpoint: see above


__all__ = ["ROUND_STEPS", "RoundProgress", "follow_changefeed_topics"]
