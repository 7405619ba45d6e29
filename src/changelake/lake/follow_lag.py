"""A followed table's lag for `status` (`ingest --follow`, see `follow.py`): how many files of
its directory (records of its topics) no committed micro-batch has read, and how long the
oldest of them has waited (0 when caught up). A directory listing (or the topics' ends and
one record each) and one small file of the checkpoint, no Spark, so the JVM-free `status`
asks it too.

The files a committed batch `n` had read are in Spark's offsets log of the checkpoint the
table's last commit names (`offsets/<n>`: its last line is the source's offset, the sorted list
of files seen). Files are named there as the source names them (absolute paths under the
followed directory), and listed as it lists them (hidden and `_` names skipped).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from changelake.errors import LakeError
from changelake.lake.files import lake_root
from changelake.lake.layout import SourceOffsets

SPARK_OFFSETS = ("spark", "offsets")
KIND = "files"
"""`SourceOffsets.kind` of a followed directory."""
TOPICS = "topics"
"""`SourceOffsets.kind` of followed Kafka topics: the address is `kafka://BOOTSTRAP/T1,T2`."""
NOT_ASKED = "not asked (--live)"
"""What `status` says where a lag would be that only a server the lake names could tell (a
Kafka cluster, a source database): a lake someone else wrote is not a reason to connect to
the servers it names, with the user's credentials, unless the user asks."""


@dataclass(frozen=True, slots=True)
class FollowLag:
    """`status` of a followed table: its directory, the last committed micro-batch, the files
    not yet committed and the age in seconds of the oldest of them (None, with `error`, when
    the directory or the checkpoint cannot be read)."""

    source: str
    batch: int
    files_behind: int | None
    seconds_behind: float | None
    error: str | None = None
    records_behind: int | None = None  # followed topics: records not yet committed


def _offsets_log(checkpoint: Any, batch: int) -> Any:
    """Batch `batch`'s entry of Spark's offsets log in the checkpoint at `checkpoint` (a
    directory, or a URI on a remote store: read through its Hadoop FileSystem, or pyarrow's
    S3 without a JVM)."""
    path = lake_root(str(checkpoint))
    for part in (*SPARK_OFFSETS, str(batch)):
        path = path / part
    return path


def committed_files(checkpoint: Any, batch: int) -> set[str]:
    """The files the source had handed out up to batch `batch` (Spark's offsets log)."""
    lines = [line for line in _offsets_log(checkpoint, batch).read_text().splitlines()
             if line.strip()]
    return set(json.loads(lines[-1])["files"])


def listed_files(directory: Path) -> list[Path]:
    """The files the `materialize-cdc` source would read under `directory`."""
    return [f for f in directory.rglob("*")
            if f.is_file() and not any(part.startswith((".", "_"))
                                       for part in f.relative_to(directory).parts)]


def follow_lag(offsets: SourceOffsets, now: float | None = None) -> FollowLag:
    """The lag of a table whose last commit recorded `offsets` (a followed directory's)."""
    mark = offsets.stream
    assert mark is not None
    source = Path(offsets.address)
    try:
        seen = committed_files(mark.directory, mark.batch)
    except (OSError, ValueError, KeyError, IndexError, LakeError) as error:
        return FollowLag(str(source), mark.batch, None, None,
                         f"checkpoint {mark.directory} unreadable: {error}")
    try:
        behind = [f for f in listed_files(source) if str(f) not in seen]
        stamps = [f.stat().st_mtime for f in behind]
    except OSError as error:
        return FollowLag(str(source), mark.batch, None, None,
                         f"directory unreadable: {error}")
    now = time.time() if now is None else now
    seconds = round(max(0.0, now - min(stamps)), 3) if stamps else 0.0
    return FollowLag(str(source), mark.batch, len(behind), seconds)


def checkpoint_offsets(checkpoint: Any, batch: int) -> dict[str, dict[str, int]]:
    """What the topics' source had handed out up to batch `batch`: its offsets in Spark's log,
    `{topic: {partition: next offset}}`."""
    lines = [line for line in _offsets_log(checkpoint, batch).read_text().splitlines()
             if line.strip()]
    return json.loads(lines[-1])


def topics_lag(offsets: SourceOffsets, now: float | None = None,
               timeout: float = 5.0) -> FollowLag:
    """Followed topics' lag: the records beyond the offsets the last committed batch read (the
    partitions' ends asked now), and how long the oldest of them has waited (its timestamp)."""
    from confluent_kafka import KafkaException, TopicPartition

    from changelake.kafka.client import describe
    from changelake.kafka.lag import status_consumer

    mark = offsets.stream
    assert mark is not None
    bootstrap, _, _ = offsets.address.removeprefix("kafka://").partition("/")
    try:
        read = checkpoint_offsets(mark.directory, mark.batch)
    except (OSError, ValueError, KeyError, IndexError, LakeError) as error:
        return FollowLag(offsets.address, mark.batch, None, None,
                         f"checkpoint {mark.directory} unreadable: {error}")
    consumer = status_consumer(bootstrap)
    behind, oldest = 0, None
    try:
        for topic, partitions in read.items():
            for partition, offset in partitions.items():
                place = TopicPartition(topic, int(partition), offset)
                _, high = consumer.get_watermark_offsets(place, timeout=timeout)
                if high <= offset:
                    continue
                behind += high - offset
                consumer.assign([place])
                record = consumer.consume(1, timeout=timeout)
                if record and record[0].error() is None:
                    kind, millis = record[0].timestamp()
                    if kind in (1, 2):  # create or log-append time
                        oldest = millis / 1000 if oldest is None else min(oldest, millis / 1000)
    except KafkaException as error:
        return FollowLag(offsets.address, mark.batch, None, None,
                         f"unreachable: {describe(error)}")
    finally:
        consumer.close()
    now = time.time() if now is None else now
    seconds = 0.0 if behind == 0 else (None if oldest is None else
                                       round(max(0.0, now - oldest), 3))
    return FollowLag(offsets.address, mark.batch, None, seconds, records_behind=behind)


def follow_status(offsets: SourceOffsets | None, *, live: bool = True
                  ) -> dict[str, Any] | None:
    """The lag (`follow_lag`, `topics_lag`) as the plain record a `TableStatus` carries
    (None: not a followed table). Topics' lag is asked of their cluster only when `live`
    (`NOT_ASKED` otherwise); a directory's is a listing, always made."""
    if offsets is None or offsets.stream is None or offsets.kind not in (KIND, TOPICS):
        return None
    if offsets.kind == KIND:
        return asdict(follow_lag(offsets))
    if not live:
        return asdict(FollowLag(offsets.address, offsets.stream.batch, None, None, NOT_ASKED))
    return asdict(topics_lag(offsets))
