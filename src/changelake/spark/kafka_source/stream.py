"""The streaming side of `kafka-cdc`: offsets as Spark checkpoints them, the micro-batches' ranges
(`maxRecordsPerTrigger` shared fairly) and `Trigger.AvailableNow`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from changelake.spark.kafka_source.options import EARLIEST, KafkaOptions, Offsets, _parse_offsets
from changelake.spark.kafka_source.plan import (
    KafkaRange,
    Watermarks,
    _resolve,
    lost_records,
    report_loss,
    watermarks,
)
from changelake.spark.kafka_source.read import read_partition


def _as_offsets(positions: Mapping[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _positions(offsets: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], int]:
    return {(t, int(p)): o for t, by in offsets.items() for p, o in by.items()}


def share(backlog: Mapping[tuple[str, int], int], budget: int) -> dict[tuple[str, int], int]:
    """How many records each partition may read of `budget`: even shares, what a partition
    does not need going to the others (so the whole budget is used while records wait)."""
    granted = dict.fromkeys(backlog, 0)
    waiting = sorted(k for k, n in backlog.items() if n > 0)
    while budget > 0 and waiting:
        each = max(1, budget // len(waiting))
        for key in list(waiting):
            take = min(each, backlog[key] - granted[key], budget)
            granted[key] += take
            budget -= take
            if granted[key] == backlog[key]:
                waiting.remove(key)
            if budget == 0:
                break
    return granted


class KafkaCdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """New records since the last offset, per topic-partition (see the module docstring)."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self.target: dict[tuple[str, int], int] | None = None
        self._marks: list[Watermarks] | None = None  # latestOffset's, for the partitions after
        self._warned: set[str] = set()  # data-loss warnings given (failOnDataLoss=false)

    def _lost(self, message: str, then: str) -> None:
        report_loss(self.options, message, self._warned, then=then)

    def _gone(self, topic: str, partition: int, offset: int) -> None:
        self._lost(f"topic {topic} partition {partition}: the query was at offset {offset}, "
                   f"but the topic has no partition {partition} now: the topic was recreated "
                   "with fewer partitions", "going on without it")

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {(m.topic, m.partition): m.high for m in watermarks(self.options)}

    def initialOffset(self) -> dict:
        starting = _parse_offsets("startingOffsets", self.options.starting)
        return _as_offsets({(m.topic, m.partition): _resolve(starting, m, EARLIEST,
                                                             "startingOffsets")
                            for m in watermarks(self.options)})

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        marks = self._marks = watermarks(self.options)
        held = {(m.topic, m.partition): m for m in marks}
        begun = _positions(start) if start else {}
        kept = {}  # partitions of topics no longer read: kept as they are
        for (topic, partition), offset in sorted(begun.items()):
            if topic not in self.options.topics:
                kept[(topic, partition)] = offset
            elif (topic, partition) not in held:
                self._gone(topic, partition, offset)  # failOnDataLoss=false: dropped
        froms, ends = {}, {}
        for key, m in held.items():
            froms[key] = self._from(m, begun[key] if key in begun else self._new(begun, key))
            high = m.high if self.target is None else min(m.high, self.target.get(key, m.high))
            ends[key] = max(high, froms[key])
        if isinstance(limit, ReadMaxRows):
            granted = share({k: ends[k] - froms[k] for k in ends}, limit.max_rows)
            ends = {k: froms[k] + granted[k] for k in ends}
        return _as_offsets({**kept, **ends})

    @staticmethod
    def _new(begun: Mapping[tuple[str, int], int], key: tuple[str, int]) -> int:
        """Where a partition not in the offsets starts: at 0 if it was added to a topic the
        query reads (its records are all new to it: a first offset above 0 is data loss, as
        Spark's source says of an added partition), else (a topic added to `topics`, or the
        first batch) at its first offset."""
        return 0 if any(topic == key[0] for topic, _ in begun) else EARLIEST

    def _from(self, mark: Watermarks, offset: int) -> int:
        """Where a partition the query was at `offset` goes on: there if the partition holds
        it; else data loss, and (failOnDataLoss=false) its first offset. An end below the
        batch's start says so to `partitions` (recreated); deleted records give a start below
        the first offset, which `partitions` reads from the first offset."""
        if offset == EARLIEST:
            return mark.low
        if mark.low <= offset <= mark.high:
            return offset
        self._lost(lost_records(mark.topic, mark.partition, offset, mark.low, mark.high),
                   f"going on from offset {mark.low}")
        return mark.low

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.options.max_records:
            return ReadMaxRows(self.options.max_records)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict | None:
        return _as_offsets({(m.topic, m.partition): m.high for m in watermarks(self.options)})

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """The batch's ranges, each checked against the partition's watermarks (those
        `latestOffset` just read, or fresh ones for a batch Spark replays after a restart):
        see "Lost records" in the module docstring."""
        begun = _positions(start)
        marks, self._marks = self._marks, None
        held = None if marks is None else {(m.topic, m.partition): m for m in marks}
        ranges = []
        for (topic, partition), stop in sorted(_positions(end).items()):
            first = begun.get((topic, partition))
            if first == stop:
                continue  # nothing to read (a topic no longer read keeps its offsets so)
            if topic not in self.options.topics:  # dropped from `topics` since it was planned
                if first is not None and first < stop:
                    ranges.append(KafkaRange(topic, partition, first, stop))
                continue
            if held is None:
                held = {(m.topic, m.partition): m for m in watermarks(self.options)}
            mark = held.get((topic, partition))
            if mark is None:
                self._gone(topic, partition, stop if first is None else first)
                continue
            if first is None:  # a partition that appeared since: from its beginning
                first = self._from(mark, self._new(begun, (topic, partition)))
            elif stop < first:
                first = mark.low  # latestOffset's reset (failOnDataLoss=false): from the start
            elif not mark.low <= first <= mark.high:
                self._lost(lost_records(topic, partition, first, mark.low, mark.high),
                           f"reading nothing of offsets [{first}, {stop})"
                           if first > mark.high else f"going on from offset {mark.low}")
                if first > mark.high:
                    continue  # recreated: nothing of the range is held; the next batch resets
                first = mark.low
            if stop > mark.high:
                self._lost(lost_records(topic, partition, stop, mark.low, mark.high,
                                        "the micro-batch reads up to offset"),
                           f"reading up to offset {mark.high}")
                stop = mark.high
            if first < stop:
                ranges.append(KafkaRange(topic, partition, first, stop))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, KafkaRange):  # with no ranges, Spark reads one empty partition
            yield from read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        pass  # the offsets live in the query's checkpoint, not in a consumer group
