"""Where a lake table's files live, and the manifest that says which of them are committed.

A table directory holds immutable *file sets* (directories of Parquet files), each with the
columns of the table plus `_time` (long) and `_diff` (long):

* `seg/{lower}-{upper}`: a change segment, the updates of one frontier interval `[lower, upper)`
  as committed by one ingest (`upper` is `inf` once the feed closed). The name is the interval,
  so an ingest that crashed and runs again writes the same directory and replaces it.
* `seg/{lower}-{upper}.v{N}`: the part of a segment beyond a compaction's `since`, rewritten by
  compaction version N (the part at or before `since` went into the buckets).
* `delta/v{N}/_bucket={k}`: a run of compacted changes of bucket k written by compaction N, with
  times advanced to that compaction's `since`.
* `delta/v{N}.m/_bucket={k}`: several runs of bucket k merged into one by compaction N.
* `base/v{N}/_bucket={k}`: bucket k consolidated as of the `since` of compaction N.

A file set is never modified after it is committed. Which of them make up the table is the
*manifest* (`TableState`) of the committed version, kept as `_state/v{N}.json`; the commit
point (see `commit.py`) names that version, so a manifest written by a run that crashed before
its commit is never read, and the next run overwrites it.

After the commit point the writer also records the version in the *commit pointer*
`_state/COMMITTED` (write-then-rename, fsynced; on a store one PUT): a hint for readers
without the metastore (see `arrow.py`, which says when the hint can be trusted). It is written
only after the commit point, so the version it names has been committed; it may lag behind (a
crash between the two, or a commit in flight), never run ahead.

Times are the lake's integer times; a frontier is stored as an `Antichain` of at most one
integer (the empty antichain: the feed is closed, every time is final).

A table captured from a database also records its `Origin` in every manifest (set at creation,
carried by every later version): which source database, and so which time domain, its times
belong to. Manifests written before origins existed have none and read as before.

A table ingested from Kafka topics records in every manifest the offsets its commits covered
(`SourceOffsets`, written by the commit that wrote the data those offsets hold, carried by every
later version): the next ingest starts there instead of re-reading the topics. Manifests
without it read as before (an ingest then reads the topics from their beginning).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from changelake.errors import LakeError
from changelake.lake.files import parquet_source, replace_whole
from changelake.protocol import Antichain

FORMAT = 1
SEGMENT = "segment"
DELTA = "delta"
BASE = "base"


@dataclass(frozen=True, slots=True)
class FileSet:
    """One immutable directory of Parquet files and what the manifest knows about it.

    `struct` indexes `TableState.structs`: the physical columns of these files, so the read
    path can project old files onto today's schema without opening them.
    """

    path: str
    kind: str
    struct: int
    rows: int
    bytes: int
    bucket: int | None = None
    lower: int | None = None
    upper: int | None = None  # None with kind == SEGMENT: the interval reaches to the end
    min_time: int | None = None
    max_time: int | None = None


@dataclass(frozen=True, slots=True)
class SchemaVersion:
    """The source's columns from time `from_time` on (a StructType as JSON, without _time and
    _diff). The live columns at a time are those of the last version starting at or before it."""

    from_time: int
    struct: str


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a captured table's history comes from. Tables with the same `source` share one time
    domain (the source database's commit positions), so reading each of them AS OF one time
    gives one state of that database (see `sources.py`).

    `source` is the identity, stable while names change and distinct between servers (for
    PostgreSQL: the server's system identifier and the database's OID); `name` is what people
    call the source (the database name when the table was created); `details` are what a
    reader needs to reach it again (slot, publication, a DSN without its password), as text.
    """

    kind: str
    source: str
    name: str
    details: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """How far the table has consumed one partition of a topic.

    `resume` is where the next read starts: every record before it is in the table, or says
    nothing beyond the table's frontier (the table no longer needs it). `end` is where the read
    that committed it ended; the records in `[resume, end)` reach beyond the frontier (updates
    at later times, progress statements that cover later times), so they are read again.
    `reached` is the greatest upper of the progress statements the partition has delivered
    (None: none yet): a partition that reached no further than the table's frontier while
    another reached beyond it is the one holding the frontier back (`status` says so)."""

    partition: int
    resume: int
    end: int
    reached: int | None = None


@dataclass(frozen=True, slots=True)
class TopicOffsets:
    topic: str
    partitions: tuple[PartitionOffsets, ...]

    def partition(self, number: int) -> PartitionOffsets | None:
        return next((p for p in self.partitions if p.partition == number), None)


@dataclass(frozen=True, slots=True)
class StreamMark:
    """The last micro-batch of a followed source (`ingest --follow`) that the table committed:
    the streaming checkpoint's identity and directory, and the batch id. A batch Spark replays
    after a crash, at or before `batch` of the same checkpoint, commits nothing again."""

    checkpoint: str
    directory: str
    batch: int


@dataclass(frozen=True, slots=True)
class SourceOffsets:
    """The positions in a log source (`kind`: "kafka") that the table has consumed, per topic
    and partition, and what the messages there are (`format`: "materialize"). `address` is
    where the source was last read (bootstrap servers), for `status` to ask its lag; the
    offsets belong to the topics, not to the address. A followed source (`ingest --follow`,
    see `follow.py`) records its last committed micro-batch in `stream` (`kind` "files":
    `address` is the directory followed)."""

    kind: str
    format: str
    address: str
    topics: tuple[TopicOffsets, ...] = ()
    stream: StreamMark | None = None

    def topic(self, name: str) -> TopicOffsets | None:
        return next((t for t in self.topics if t.topic == name), None)

    @classmethod
    def from_plain(cls, raw: dict) -> SourceOffsets:
        topics = tuple(
            TopicOffsets(t["topic"], tuple(PartitionOffsets(**p) for p in t["partitions"]))
            for t in raw.get("topics", ()))
        stream = raw.get("stream")
        return cls(raw["kind"], raw["format"], raw["address"], topics,
                   None if stream is None else StreamMark(**stream))


@dataclass(frozen=True, slots=True)
class TableState:
    """A committed version of a table: everything a reader or writer needs to know."""

    name: str
    version: int
    key: tuple[str, ...]
    buckets: int
    since: int
    frontier: tuple[int, ...]  # Antichain elements: (t,) or () when closed
    versions: tuple[SchemaVersion, ...]
    structs: tuple[str, ...]
    files: tuple[FileSet, ...] = ()
    bucket_columns: tuple[str, ...] = ()
    scd2: bool = False
    operation: str = "create"
    committed_at: float = field(default_factory=time.time)
    detail: dict = field(default_factory=dict)
    format: int = FORMAT
    origin: Origin | None = None  # captured tables only; kept by every later version
    offsets: SourceOffsets | None = None  # tables ingested from topics; kept likewise
    storage: str = "hive"  # the back end: "hive" (file sets, a view) or "delta"
    folded: bool = False  # a Delta table's updates at times <= since are folded (compacted)

    @property
    def keyed(self) -> bool:
        return bool(self.key)

    @property
    def upper(self) -> int | None:
        """The committed frontier as an integer; None once the feed is closed."""
        return self.frontier[0] if self.frontier else None

    def frontier_antichain(self) -> Antichain:
        return Antichain(self.frontier)

    def segments(self) -> list[FileSet]:
        return [f for f in self.files if f.kind == SEGMENT]

    def struct_id(self, struct_json: str) -> tuple[TableState, int]:
        """The index of a physical schema, adding it if new."""
        if struct_json in self.structs:
            return self, self.structs.index(struct_json)
        return replace(self, structs=(*self.structs, struct_json)), len(self.structs)

    def next(self, operation: str, **changes: object) -> TableState:
        return replace(
            self, version=self.version + 1, operation=operation, committed_at=time.time(),
            detail={}, **changes,
        )

    # --------------------------------------------------------------------- serialization

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TableState:
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise LakeError(f"table manifest format {raw.get('format')!r} is not supported")
        raw["key"] = tuple(raw["key"])
        raw["bucket_columns"] = tuple(raw["bucket_columns"])
        raw["frontier"] = tuple(raw["frontier"])
        raw["structs"] = tuple(raw["structs"])
        raw["versions"] = tuple(SchemaVersion(**v) for v in raw["versions"])
        raw["files"] = tuple(FileSet(**f) for f in raw["files"])
        if raw.get("origin") is not None:  # absent in manifests written before origins
            raw["origin"] = Origin(**raw["origin"])
        if raw.get("offsets") is not None:  # absent in manifests written before offsets
            raw["offsets"] = SourceOffsets.from_plain(raw["offsets"])
        return cls(**raw)


DELTA_CURRENT = "current"
DELTA_UPDATES = "updates"
DELTA_APP_ID = "changelake"
"""A Delta-format table's two Delta tables in its directory, and the application id of the
transactions its commits record (see `delta_storage.py`)."""


def current_path(table_dir: Path) -> Path:
    """A Delta-format table's rows now: the Delta table registered in the metastore."""
    return table_dir / DELTA_CURRENT


def updates_path(table_dir: Path) -> Path:
    """A Delta-format table's retained updates."""
    return table_dir / DELTA_UPDATES


def interval_name(lower: int, upper: int | None) -> str:
    return f"{lower}-{'inf' if upper is None else upper}"


def segment_path(lower: int, upper: int | None, version: int | None = None) -> str:
    suffix = "" if version is None else f".v{version}"
    return f"seg/{interval_name(lower, upper)}{suffix}"


SEGMENT_NAME = r"\d+-(?:\d+|inf)(?:\.v\d+)?"
"""The name (after `seg/`) that `segment_path` gives a segment, as a regular expression."""


def bucket_path(kind: str, version: int, bucket: int, merged: bool = False) -> str:
    return f"{kind}/v{version}{'.m' if merged else ''}/_bucket={bucket}"


def run_root(kind: str, version: int, merged: bool = False) -> str:
    return f"{kind}/v{version}{'.m' if merged else ''}"


# ----------------------------------------------------------------------------- file system


def manifest_path(table_dir: Path, version: int) -> Path:
    return table_dir / "_state" / f"v{version}.json"


def write_manifest(table_dir: Path, state: TableState) -> None:
    """Write-then-rename, so a crash never leaves a half manifest under the final name; the
    file synced before the rename and `_state` after it, so a commit point that names the
    version (made after this returns) never names a manifest a power loss took back. (On
    an object store one PUT: `files.replace_whole`.)"""
    replace_whole(manifest_path(table_dir, state.version), state.to_json())


POINTER = "COMMITTED"
MANIFEST_NAME = re.compile(r"v(\d+)\.json")


def pointer_path(table_dir: Path) -> Path:
    return table_dir / "_state" / POINTER


def write_pointer(table_dir: Path, version: int) -> None:
    """Record `version` as committed (call only after its commit point): temp file, fsync,
    rename, fsync of the directory (on a store one PUT: `files.replace_whole`), so a reader
    sees the old pointer or the new, whole."""
    replace_whole(pointer_path(table_dir), json.dumps({"version": int(version)}) + "\n")


def read_pointer(table_dir: Path) -> int | None:
    """The version the commit pointer names, or None: no pointer (a table committed before
    pointers existed, or one whose creation has not reached it) or an unreadable one."""
    try:
        raw = json.loads(pointer_path(table_dir).read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    version = raw.get("version") if isinstance(raw, dict) else None
    return version if type(version) is int and version >= 0 else None


def manifest_versions(table_dir: Path) -> list[int]:
    """The versions of every manifest in `_state`, committed or not, ascending."""
    state_dir = table_dir / "_state"
    if not state_dir.is_dir():
        return []
    found = (MANIFEST_NAME.fullmatch(p.name) for p in state_dir.iterdir())
    return sorted(int(m.group(1)) for m in found if m is not None)


def check_as_of_time(state: TableState, name: str, time: int) -> None:
    """AS OF `time` is answerable from `state`: from its `since` to before its frontier."""
    upper = state.upper
    if time < state.since:
        raise LakeError(f"table {name}: AS OF {time} is before the table's since "
                        f"({state.since}): its history starts there, or was compacted away up to "
                        "there")
    if upper is not None and time >= upper:
        raise LakeError(f"table {name}: AS OF {time} is not final yet: the table is "
                        f"committed through time {upper - 1}")


def read_manifest(table_dir: Path, version: int) -> TableState:
    path = manifest_path(table_dir, version)
    try:
        return TableState.from_json(path.read_text())
    except FileNotFoundError:
        raise LakeError(
            f"the metastore names version {version} of the table, but {path} is missing: "
            "the lake directory and the metastore do not belong together"
        ) from None


def parquet_stats(directory: Path) -> tuple[int, int, int | None, int | None]:
    """Rows, bytes and `_time` range of a file set, from the Parquet footers alone.

    Reading footers is cheap and needs no Spark job, which matters because every commit asks.
    """
    import pyarrow.parquet as pq

    rows = size = 0
    lo: int | None = None
    hi: int | None = None
    for path in sorted(directory.rglob("*.parquet")):
        if any(part.startswith((".", "_")) and "=" not in part
               for part in path.relative_to(directory).parts):
            continue
        size += path.stat().st_size
        with parquet_source(path) as source:
            found = _time_bounds(pq.ParquetFile(source))
        rows += found[0]
        for g_lo, g_hi in found[1]:
            lo = g_lo if lo is None else min(lo, g_lo)
            hi = g_hi if hi is None else max(hi, g_hi)
    return rows, size, lo, hi


def _time_bounds(parquet: Any) -> tuple[int, list[tuple[Any, Any]]]:
    """A Parquet file's rows and each non-empty row group's least and greatest `_time`, from
    the statistics (the one column read where none were written); no bounds without `_time`."""
    meta = parquet.metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if "_time" not in names:
        return meta.num_rows, []
    index = names.index("_time")
    bounds = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if not group.num_rows:
            continue
        stats = group.column(index).statistics
        if stats is not None and stats.has_min_max:
            bounds.append((stats.min, stats.max))
        else:
            values = parquet.read_row_group(g, columns=["_time"]).column(0).to_pylist()
            bounds.append((min(values), max(values)))
    return meta.num_rows, bounds


def file_set_leaves(table_dir: Path) -> Iterable[str]:
    """Every file-set directory present on disk, committed or not (for garbage collection)."""
    seg = table_dir / "seg"
    if seg.is_dir():
        for child in seg.iterdir():
            yield f"seg/{child.name}"
    for kind in (DELTA, BASE):
        top = table_dir / kind
        if not top.is_dir():
            continue
        for run in top.iterdir():
            if not run.is_dir():
                continue
            for child in run.iterdir():
                if child.is_dir():
                    yield f"{kind}/{run.name}/{child.name}"
