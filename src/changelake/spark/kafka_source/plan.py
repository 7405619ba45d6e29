"""Planning a `kafka-cdc` read on the driver: each partition's watermarks, the range each input
partition reads, and records lost to retention or a recreated topic (`failOnDataLoss`, the loss
report)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import InputPartition

from changelake.spark.kafka_source.options import (
    _TIMEOUT,
    EARLIEST,
    LATEST,
    NAME,
    KafkaOptions,
    Offsets,
    _fail,
    _offset_in,
    _parse_offsets,
    log,
)


@dataclass(frozen=True)
class Watermarks:
    """A partition's offsets now: the first held (`low`) and the next to be written (`high`)."""

    topic: str
    partition: int
    low: int
    high: int


def watermarks(options: KafkaOptions) -> list[Watermarks]:
    """Every partition of the topics and its watermarks: the driver's only calls to Kafka
    (metadata and offsets, no records)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from changelake.errors import ChangelakeError
    from changelake.kafka.client import client_config, describe, partitions_of, watch_of

    settings = client_config(options.bootstrap, "plan", options.consumer_config())
    settings.update({"group.id": f"changelake-plan-{uuid.uuid4()}",
                     "enable.auto.commit": False, "isolation.level": "read_committed"})
    settings.update(options.consumer_config())
    consumer = Consumer(settings)
    try:
        out = []
        for topic in options.topics:
            try:
                partitions = partitions_of(consumer, options.bootstrap, topic, _TIMEOUT,
                                           watch_of(settings))
            except ChangelakeError as error:
                raise _fail(str(error)) from None
            for p in partitions:
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                               timeout=_TIMEOUT)
                except KafkaException as error:
                    raise _fail(f"topic {topic!r} partition {p}: cannot read its offsets: "
                                f"{describe(error)}") from None
                out.append(Watermarks(topic, p, low, high))
        return out
    finally:
        consumer.close()


def _resolve(spec: str | Offsets, mark: Watermarks, default: int, what: str) -> int:
    """An offset of `spec` for this partition, checked against what the partition holds."""
    asked = _offset_in(spec, mark.topic, mark.partition, default)
    if asked == EARLIEST:
        return mark.low
    if asked == LATEST:
        return mark.high
    where = f"topic {mark.topic} partition {mark.partition}"
    if asked < mark.low:
        raise _fail(f"{where}: {what} {asked} is before the partition's first offset "
                    f"{mark.low}: those records were deleted")
    if asked > mark.high:
        raise _fail(f"{where}: {what} {asked} is beyond the partition's end {mark.high}: the "
                    "topic was recreated or truncated")
    return asked


def lost_records(topic: str, partition: int, offset: int, low: int, high: int,
                 what: str = "the query was at offset") -> str:
    """Why records `offset` on are not what the partition holds now (`[low, high)`): the one
    wording of data loss, on the driver and on the executors (see the module docstring)."""
    where = (f"topic {topic} partition {partition}: {what} {offset}, but the partition's "
             f"first offset is {low} and its end {high}")
    if offset < low:
        return f"{where}: records were deleted (retention or DeleteRecords) before being read"
    return f"{where}: the topic was recreated or truncated (offset {offset} is beyond its end)"


def report_loss(options: KafkaOptions, message: str, warned: set[str] | None = None, *,
                then: str = "going on from the first offset held") -> None:
    """Data loss: a `_fail` error with `failOnDataLoss` (the default), else a warning (once per
    message in `warned`), saying what the caller does `then`, in the log and the `lossReport`
    file (see the module docstring)."""
    if options.fail_on_data_loss:
        raise _fail(f"{message} (the option failOnDataLoss=false, `ingest --follow --kafka "
                    "--no-fail-on-data-loss`, goes on from the first offset held)")
    if warned is None or message not in warned:
        log.warning("%s: warning: %s; %s (failOnDataLoss=false)", NAME, message, then)
        if options.loss_report is not None:
            _append_line(options.loss_report, f"{message}; {then}")
        if warned is not None:
            warned.add(message)


def _append_line(path: str, line: str) -> None:
    """One line at the end of the driver's `LossReport` file, in one write (lines from several
    processes do not mix); nothing where the file is not (an executor on another host: the
    warning is in its log)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # not created: only the driver's counts
    except FileNotFoundError:
        return
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


class LossReport:
    """The data-loss warnings of a `failOnDataLoss=false` stream, brought to the process that
    runs the query: its planner and (in local mode) its readers run in Python processes that
    Spark starts, whose warnings reach only logs. Give `option` as the source's `lossReport`;
    `drain()` calls `tell` with each line written since, each loss once (the same line again,
    from a task run again, is not repeated). Use as a context manager (the file goes at the
    end)."""

    def __init__(self, tell: Callable[[str], None], directory: str | None = None) -> None:
        import tempfile

        fd, self.path = tempfile.mkstemp(prefix="changelake-data-loss-", suffix=".txt",
                                         dir=directory)
        os.close(fd)
        self.tell = tell
        self._read = 0  # bytes of the file told
        self._told: set[str] = set()
        self._lock = threading.Lock()  # drained by the follow's loop and its batches' thread

    @property
    def option(self) -> str:
        return self.path

    def drain(self) -> None:
        with self._lock:
            try:
                with open(self.path, "rb") as file:
                    file.seek(self._read)
                    text = file.read()
            except FileNotFoundError:
                return
            whole = text.rfind(b"\n") + 1  # a line still being written waits for its end
            self._read += whole
            for line in text[:whole].decode().splitlines():
                if line not in self._told:
                    self._told.add(line)
                    self.tell(line)

    def __enter__(self) -> LossReport:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.drain()
        with self._lock:
            Path(self.path).unlink(missing_ok=True)


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """One topic-partition's offsets `[start, end)`, read by one task."""

    topic: str
    partition: int
    start: int
    end: int


def plan_batch(options: KafkaOptions) -> list[KafkaRange]:
    """The ranges of a batch read: each partition from `startingOffsets` to `endingOffsets`."""
    starting = _parse_offsets("startingOffsets", options.starting)
    ending = _parse_offsets("endingOffsets", options.ending)
    ranges = []
    for mark in watermarks(options):
        start = _resolve(starting, mark, EARLIEST, "startingOffsets")
        end = _resolve(ending, mark, LATEST, "endingOffsets")
        if end < start:
            raise _fail(f"topic {mark.topic} partition {mark.partition}: endingOffsets {end} "
                        f"is before startingOffsets {start}")
        ranges.append(KafkaRange(mark.topic, mark.partition, start, end))
    return ranges
