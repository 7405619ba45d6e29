"""`changelake decode --engine spark`: the decode job on Spark, with the local engine's output.

The contract is the local engine's: every recovered update exactly once as a JSON
line, in time order, then the final frontier. To print the *same bytes*, the files are read
with `dataAs=json`: each `data` travels through Spark as the canonical JSON text that the local
engine prints (orjson of the thawed row), so no Avro-to-Spark type mapping can change a value,
and deduplication by that text is deduplication by value (the schema fixes field order and
types). Within a time the local engine orders lines by their bytes; JSON objects cannot be
prefixes of one another, so ordering by `(time, data text)` in Spark gives the same order.

Intermediate frontier lines are not printed (the contract allows that): one frontier, at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from changelake.errors import Location, ProtocolError
from changelake.formats.materialize import CdcSchema, SetAside, expand_paths
from changelake.protocol import Antichain, Rejected, Updates
from changelake.protocol.reader import waiting_reason
from changelake.spark.errors import translate_errors
from changelake.values import freeze

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from changelake.local import DecodeReport
    from changelake.spark.decoder import Decoded



@dataclass
class SparkDecoded:
    """A finished Spark decode: the history is read lazily, in the order it is printed."""

    frontier: Antichain
    progress_frontier: Antichain
    missing: dict[int, int]
    set_aside: list[SetAside] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    decoded: Decoded | None = None

    def lines(self) -> Iterator[bytes]:
        """The update lines, byte for byte as the local engine writes them, in its order."""
        if self.decoded is None:
            return
        ordered = self.decoded.updates.orderBy("time", "data")
        for row in translate_errors(ordered.toLocalIterator):
            yield b'{"data":%s,"time":%d,"diff":%d}' % (
                row["data"].encode(), row["time"], row["diff"]
            )

    def updates(self) -> Iterator[dict[str, Any]]:
        """The history as `{"data": ..., "time": T, "diff": D}` dicts, in printing order."""
        for line in self.lines():
            yield orjson.loads(line)

    def waiting_for(self) -> str | None:
        """Why the frontier is not further along, in the local engine's words."""
        if self.frontier.is_closed:
            return None
        return waiting_reason(dict(self.missing), self.progress_frontier)

    def close(self) -> None:
        if self.decoded is not None:
            self.decoded.unpersist()


def read_messages_frame(
    spark: SparkSession,
    files: Sequence[str],
    *,
    schema: CdcSchema | None = None,
    lenient: bool = False,
    data_as: str = "json",
) -> Any:
    """The `materialize-cdc` messages DataFrame of these files."""
    from changelake.spark.source import register

    register(spark)
    # Executors open absolute paths (their working directory is not ours); errors and `_file`
    # show the names as given, like the local engine.
    names = {os.path.abspath(f): str(f) for f in files}
    reader = (
        spark.read.format("materialize-cdc")
        .option("paths", orjson.dumps(list(names)).decode())
        .option("names", orjson.dumps(names).decode())
        .option("lenient", str(lenient).lower())
        .option("dataAs", data_as)
    )
    if schema is not None:
        reader = reader.option("avroSchema", orjson.dumps(schema.avro).decode())
    return translate_errors(reader.load)


def decode_files(
    spark: SparkSession,
    paths: Sequence[str | Path],
    *,
    schema: CdcSchema | None = None,
    strict: bool = True,
    since: Antichain | None = None,
) -> SparkDecoded:
    """Decode Materialize CDC files (Avro OCF or JSON lines, detected per file) on Spark.

    Raises `InputError` for unreadable input and `ProtocolError` for a broken rule (strict);
    lenient mode reports both in the result instead. Call `close()` when done with `lines()`.
    """
    from pyspark.sql import functions as F

    from changelake.spark.decoder import decode, split_messages

    files = [str(p) for p in expand_paths(list(paths))]
    if not files:
        start = since if since is not None else Antichain([0])
        return SparkDecoded(start, start, {})
    messages = read_messages_frame(spark, files, schema=schema, lenient=not strict)
    set_aside: list[SetAside] = []
    if not strict:
        for row in translate_errors(
            messages.where(F.col("_error").isNotNull())
            .select("_file", "_line", "_offset", "_error")
            .collect
        ):
            set_aside.append(
                SetAside(Location(row["_file"], row["_line"], row["_offset"]), row["_error"])
            )
    updates, progress = split_messages(messages)
    decoded = translate_errors(decode, updates, progress, since=since, strict=strict)
    rejected = [] if strict else _rejected_items(decoded)
    return SparkDecoded(
        decoded.frontier,
        decoded.progress_frontier,
        decoded.missing,
        set_aside,
        rejected,
        decoded,
    )


def _rejected_items(decoded: Decoded) -> list[Rejected]:
    """Lenient rejections as the protocol's `Rejected` values, for the CLI's report."""
    from changelake.protocol import Progress

    out: list[Rejected] = []
    for row in decoded.rejected.collect():
        error = ProtocolError(row["rule"], row["reason"] or row["rule"])
        if row["lower"] is not None:
            message: Any = Progress.make(
                row["lower"], row["upper"], [(c["time"], c["count"]) for c in row["counts"]]
            )
        else:
            data = orjson.loads(row["data"]) if isinstance(row["data"], str) else row["data"]
            message = Updates([(freeze(data), row["time"], row["diff"])])
            shown = orjson.dumps({"data": data, "time": row["time"], "diff": row["diff"]})
            error = ProtocolError(row["rule"], f"{row['reason']}: {shown.decode()}")
        out.append(Rejected(message, error))
    return out


def decode_with_spark(
    paths: list[str],
    out: IO[bytes],
    *,
    schema: CdcSchema | None = None,
    lenient: bool = False,
    since: Antichain | None = None,
    master: str = "local[*]",
    conf: dict[str, str] | None = None,
) -> DecodeReport:
    """The CLI's Spark engine: same arguments and report as `changelake.local.decode_local`.
    It builds its own session (`build_session(master, conf=conf)`); `decode_files` takes one.

    Standard input (no paths) is spooled to a temporary file first: executors read files.
    """
    from changelake.local import DecodeReport, frontier_line
    from changelake.spark.session import build_session

    spool: Path | None = None
    if not paths:
        spool = Path(tempfile.mkdtemp(prefix="changelake-stdin-"))
        with (spool / "stdin").open("wb") as fo:
            shutil.copyfileobj(sys.stdin.buffer, fo)
        paths = [str(spool / "stdin")]
    spark = build_session(master, conf=conf)
    # The contract is one line on stderr for an error; task failures would log tracebacks.
    spark.sparkContext.setLogLevel("FATAL")
    try:
        result = decode_files(spark, paths, schema=schema, strict=not lenient, since=since)
        try:
            count = 0
            for line in result.lines():
                out.write(line + b"\n")
                count += 1
            out.write(frontier_line(result.frontier) + b"\n")
            out.flush()
        finally:
            result.close()
        return DecodeReport(
            result.frontier, count, result.set_aside, result.rejected, result.waiting_for()
        )
    finally:
        spark.stop()
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
