"""Records a lenient read of Kafka topics set aside, for `ingest --kafka --lenient` and
`ingest --follow --kafka --lenient`: found among a messages DataFrame's `_error` rows, counted,
a sample of them named, and (with a dead-letter topic) produced there before the lake commit.

`kafka-cdc` in lenient mode yields one `_error` row per record it cannot decode (`_file` =
`topic T partition P`, `_offset`, the reason; message columns null), so the decode never sees
it. Only those rows reach the driver: all of them when they go to a dead-letter topic (whose
producer reads each again by offset, `kafka.dead_letter`), else their count and the first
`SAMPLE`, in topic, partition and offset order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from changelake.formats.materialize import SetAside
    from changelake.kafka.dead_letter import BadRecord, DeadLetterTopic

SAMPLE = 20
"""How many of the records set aside a report names (all are counted)."""


def place(file: str) -> tuple[str, int]:
    """(topic, partition) of a `_file` value `topic T partition P` (`kafka.source.location`)."""
    topic, _, partition = file.removeprefix("topic ").rpartition(" partition ")
    return topic, int(partition)


def collect(messages: DataFrame, *, new: Column | None = None,
            everything: bool = False) -> tuple[int, list[BadRecord]]:
    """How many `_error` rows `messages` has (those where `new` holds), and all of them
    (`everything`) or the first `SAMPLE`, in topic, partition and offset order."""
    from pyspark.sql import functions as F

    from changelake.kafka.dead_letter import BadRecord

    errors = messages.where(F.col("_error").isNotNull())
    if new is not None:
        errors = errors.where(new)
    ordered = (errors.select(
        "_file", "_offset", "_error",
        F.regexp_extract("_file", r"^topic (.*) partition \d+$", 1).alias("_topic"),
        F.regexp_extract("_file", r" partition (\d+)$", 1).cast("int").alias("_partition"))
        .orderBy("_topic", "_partition", "_offset"))
    rows = (ordered if everything else ordered.limit(SAMPLE)).collect()
    count = len(rows) if everything else errors.count()
    return count, [BadRecord(*place(r["_file"]), r["_offset"], r["_error"]) for r in rows]


def dead_letter_topic(bootstrap: str, topic: str | None,
                      config: Mapping[str, Any] | None) -> DeadLetterTopic | None:
    """The dead-letter topic's producer (the topic checked now: before anything is read)."""
    if topic is None:
        return None
    from changelake.kafka.dead_letter import DeadLetterTopic

    return DeadLetterTopic(bootstrap, topic, config=config)


def send(bootstrap: str, dead_letters: DeadLetterTopic | None, bad: Sequence[BadRecord],
         config: Mapping[str, Any] | None) -> int:
    """Produce the records set aside to the dead-letter topic and wait for their acks (the
    caller commits after this: at least once); how many."""
    if dead_letters is None or not bad:
        return 0
    from changelake.kafka.dead_letter import fetch

    return dead_letters.send(fetch(bootstrap, bad, config=config))


@dataclass(frozen=True, slots=True)
class BatchSetAside:
    """What one micro-batch of a lenient follow set aside: its count, the first `SAMPLE`,
    and how many went to the dead-letter topic."""

    batch: int
    count: int
    sample: list[SetAside] = field(default_factory=list)
    dead_lettered: int = 0


class FollowSetAside:
    """`follow`'s hook for a lenient topic follow: each micro-batch's records set aside,
    collected, dead-lettered (before the batch's lake commit; a replay of a batch that did not
    commit produces them again: at least once) and reported to `report` when there are any."""

    def __init__(self, bootstrap: str, dead_letter: str | None = None, *,
                 config: Mapping[str, Any] | None = None,
                 report: Callable[[BatchSetAside], None] | None = None) -> None:
        self.bootstrap = bootstrap
        self.config = config
        self.dead_letters = dead_letter_topic(bootstrap, dead_letter, config)
        self.report = report or (lambda _r: None)

    def __call__(self, batch: int, messages: DataFrame) -> None:
        count, bad = collect(messages, everything=self.dead_letters is not None)
        if not count:
            return
        sent = send(self.bootstrap, self.dead_letters, bad, self.config)
        self.report(BatchSetAside(batch, count, [b.set_aside() for b in bad[:SAMPLE]], sent))


__all__ = ["SAMPLE", "BatchSetAside", "FollowSetAside", "collect", "place"]
