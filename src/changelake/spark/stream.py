"""Continuous CDCv2 decoding with Structured Streaming, exactly once across crashes.

A file stream of Materialize CDC messages (`materialize-cdc` as a streaming source) is decoded
micro-batch by micro-batch in `foreachBatch`. Between batches only what the protocol leaves
unfinished is kept, as files in a state directory:

* the distinct updates at times at or beyond the reported frontier (`pending`, Parquet);
* the progress statements not wholly behind the frontier (they still say how many updates an
  unfinished time must have, or wait for a gap before them to close), and the frontier.

Batch `n` is a pure function of (the state after batch `n-1`, the files of batch `n`):
`decode(state updates + new updates, state statements + new statements, since=frontier)`, the
statements passed as they are (they stay on the driver, see `decode_statements`). One Spark
job writes its finished and its pending updates, under a hidden name in the state directory;
the finished ones are moved to `output/<n>` (no directory when the batch finishes nothing),
and the new state is renamed into place as `state/<n>`: that rename is the batch's commit.
Spark logs batch `n`'s offsets (its file list) before running it and replays exactly that
batch after a crash, so after `kill -9` anywhere:

* before `state/<n>` exists, the replay recomputes the same result from `state/<n-1>` and the
  same files, replacing any `output/<n>` left behind (identical content, since the function
  is deterministic): nothing is lost and nothing is written twice;
* once `state/<n>` exists, the replay does nothing.

The history is the union of `output/*` (see `read_history`); the frontier is the latest state's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from changelake.protocol import Antichain, Progress
from changelake.protocol.reader import progress_from_json, progress_to_json

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

BATCH_DIGITS = 12
PENDING = "pending"
"""A state's pending updates, as Parquet, when there are any."""
_PART, _FINISHED, _PENDING = "part", "finished", "pending"
"""The partition column of a batch's one write, and its two values."""


@dataclass(frozen=True)
class StreamState:
    """The state after a batch (see the module docstring)."""

    batch: int
    frontier: Antichain
    statements: tuple[Progress, ...]
    has_pending: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "batch": self.batch,
            "frontier": self.frontier.to_json(),
            "statements": [progress_to_json(p) for p in self.statements],
            "has_pending": self.has_pending,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> StreamState:
        if value.get("version") != 1:
            raise ValueError(f"unknown stream state version {value.get('version')!r}")
        return cls(
            value["batch"],
            Antichain.from_json(value["frontier"]),
            tuple(progress_from_json(p) for p in value["statements"]),
            value["has_pending"],
        )


def _name(batch: int) -> str:
    return f"{batch:0{BATCH_DIGITS}d}"


def latest_state(state_dir: Path, before: int | None = None) -> tuple[StreamState, Path] | None:
    """The last committed state (before batch `before`, if given), with its directory."""
    if not state_dir.is_dir():
        return None
    batches = sorted(
        int(p.name) for p in state_dir.iterdir() if p.name.isdigit() and p.is_dir()
    )
    if before is not None:
        batches = [b for b in batches if b < before]
    if not batches:
        return None
    path = state_dir / _name(batches[-1])
    return StreamState.from_json(json.loads((path / "state.json").read_text())), path


def _rename_into_place(temporary: Path, final: Path) -> None:
    if final.exists():
        shutil.rmtree(final)
    os.replace(temporary, final)


class DecodeBatches:
    """The `foreachBatch` function: one micro-batch of messages in, history and state out."""

    def __init__(self, output_dir: Path, state_dir: Path, *, strict: bool = True,
                 keep_states: int = 2) -> None:
        self.output_dir = Path(output_dir).resolve()
        self.state_dir = Path(state_dir).resolve()
        self.strict = strict
        self.keep_states = keep_states

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark import StorageLevel

        from changelake.spark.decoder import collect_statements, decode_statements, split_messages

        if (self.state_dir / _name(batch_id)).exists():
            return  # committed before a crash: the replay must not redo it
        spark = batch.sparkSession
        previous = latest_state(self.state_dir, before=batch_id)
        start = previous[0].frontier if previous else Antichain([0])
        kept = list(previous[0].statements) if previous else []

        messages = batch.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            updates, progress = split_messages(messages)
            updates = updates.selectExpr("data", "time", "diff")
            if previous and previous[0].has_pending:
                # The schema is known: reading it from the files would be a Spark job.
                pending = spark.read.schema(updates.schema).parquet(
                    str(previous[1] / PENDING)
                )
                updates = updates.unionByName(pending)
            statements = list(dict.fromkeys([*kept, *collect_statements(progress, kept)]))
            # A micro-batch is small: as many partitions as cores, not the session's 200.
            decoded = decode_statements(updates, statements, since=start, strict=self.strict,
                                        partitions=spark.sparkContext.defaultParallelism)
            try:
                frontier = decoded.frontier
                # What stays: statements not wholly behind the new frontier, pending updates.
                still = tuple(p for p in statements if not p.upper.le(frontier))
                temporary = self.state_dir / f".{_name(batch_id)}-{uuid.uuid4().hex}"
                # One job writes both, each to its own directory, only if it has rows.
                assert decoded.pending is not None
                spark.sql(
                    f"SELECT *, '{_FINISHED}' AS {_PART} FROM {{finished}} UNION ALL "
                    f"SELECT *, '{_PENDING}' AS {_PART} FROM {{pending}}",
                    finished=decoded.updates, pending=decoded.pending,
                ).write.partitionBy(_PART).parquet(str(temporary))
                self._place(temporary / f"{_PART}={_FINISHED}",
                            self.output_dir / _name(batch_id))
                if not self.strict:
                    self._write(decoded.rejected, self.output_dir / f"{_name(batch_id)}.rejected")
                has_pending = (temporary / f"{_PART}={_PENDING}").is_dir()
                if has_pending:
                    os.replace(temporary / f"{_PART}={_PENDING}", temporary / PENDING)
                state = StreamState(batch_id, frontier, still, has_pending)
                (temporary / "state.json").write_text(json.dumps(state.to_json()))
                _rename_into_place(temporary, self.state_dir / _name(batch_id))  # commit
            finally:
                decoded.unpersist()
        finally:
            messages.unpersist()
        self._forget_old_states(batch_id)

    def _place(self, written: Path, final: Path) -> None:
        """Move a batch's finished updates, written beside its state, to `final` (replacing
        what a crashed attempt left there); no directory when the batch finished nothing."""
        final.parent.mkdir(parents=True, exist_ok=True)
        if not written.is_dir():
            if final.exists():
                shutil.rmtree(final)
            return
        temporary = final.parent / f".{final.name}-{uuid.uuid4().hex}"
        shutil.move(written, temporary)  # a rename when on one file system
        _rename_into_place(temporary, final)

    @staticmethod
    def _write(df: DataFrame, final: Path) -> None:
        temporary = final.parent / f".{final.name}-{uuid.uuid4().hex}"
        df.write.parquet(str(temporary))
        _rename_into_place(temporary, final)

    def _forget_old_states(self, batch_id: int) -> None:
        """Older states are never read again once a newer one is committed."""
        names = sorted(p.name for p in self.state_dir.iterdir() if p.name.isdigit())
        for name in names[: -self.keep_states]:
            shutil.rmtree(self.state_dir / name, ignore_errors=True)
        for stale in self.state_dir.glob(".*"):
            if stale.name.startswith(f".{_name(batch_id)}-"):
                continue
            shutil.rmtree(stale, ignore_errors=True)


def start(
    spark: SparkSession,
    input_dir: Path,
    output_dir: Path,
    checkpoint_dir: Path,
    *,
    avro_schema: str | None = None,
    strict: bool = True,
    available_now: bool = False,
    interval: str = "2 seconds",
    max_files_per_trigger: int | None = None,
) -> StreamingQuery:
    """Start decoding the files that appear in `input_dir`; returns the running query.

    `checkpoint_dir` holds Spark's offsets and commits (`offsets`, `commits`) and this job's
    state (`decoder`); restart with the same directories to resume.
    """
    from changelake.spark.source import register

    register(spark)
    reader = spark.readStream.format("materialize-cdc").option("dataAs", "json")
    if avro_schema is not None:
        reader = reader.option("avroSchema", avro_schema)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    sink = DecodeBatches(output_dir, Path(checkpoint_dir) / "decoder", strict=strict)
    writer = (
        reader.load(str(Path(input_dir).resolve()))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(Path(checkpoint_dir).resolve() / "spark"))
    )
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(
        processingTime=interval
    )
    return writer.start()


def read_history(spark: SparkSession, output_dir: Path) -> DataFrame | None:
    """Every update the stream has finished, each exactly once (None before the first batch
    that finishes any)."""
    parts = sorted(
        str(p) for p in Path(output_dir).iterdir() if p.name.isdigit()
    ) if Path(output_dir).is_dir() else []
    return spark.read.parquet(*parts) if parts else None


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m changelake.spark.stream --input DIR --output DIR --checkpoint DIR ...`"""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--schema", type=Path, help="Avro schema file for JSON-lines input")
    parser.add_argument("--lenient", action="store_true")
    parser.add_argument("--available-now", action="store_true",
                        help="process what is there, then stop")
    parser.add_argument("--interval", default="2 seconds")
    parser.add_argument("--max-files-per-trigger", type=int, default=None)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    from changelake.formats.materialize import load_schema_text
    from changelake.spark.session import build_session

    spark = build_session(args.master, app_name="changelake-stream")
    try:
        query = start(
            spark, args.input, args.output, args.checkpoint,
            avro_schema=load_schema_text(args.schema) if args.schema else None,
            strict=not args.lenient, available_now=args.available_now,
            interval=args.interval, max_files_per_trigger=args.max_files_per_trigger,
        )
        query.awaitTermination()
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
