"""Lake rows as Arrow, without collecting rows to the driver: the types, and the two ways data
leaves Spark for an export target.

* `arrow_schema`: the Arrow schema of a lake table's columns, from its Spark types, decided
  once from the table's logical schema (not from whatever a batch happens to carry), so every
  export of a table writes the same types. Timestamps are UTC instants (`timestamp[us, UTC]`),
  `timestamp_ntz` stays zoneless; every column is nullable, as every lake column is.
* `staged_batches`: a large frame (a whole table) written by Spark's executors as Parquet into
  a staging directory, then read back file by file as a stream of Arrow record batches
  (`pyarrow.parquet`), cast to the schema batch by batch: the driver holds one batch at a time,
  never the table.
* `frame_to_arrow`: a small frame (the changes of one export) through `DataFrame.toArrow()`:
  Arrow batches from the executors, gathered on the driver. Used for changes only, whose size
  is that of the changes, not of the table.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from changelake.durable import exclusive_lock
from changelake.errors import SchemaError
from changelake.lake.files import RemotePath, parquet_source, remove_tree
from changelake.private import process_alive
from changelake.spark_arrow import NoArrowType, arrow_of


def arrow_type(kind: T.DataType, where: str) -> pa.DataType:
    """The Arrow type of a Spark type (`spark_arrow.arrow_of`, the one mapping); a SchemaError
    naming `where` (and the field in it) for one with none."""
    try:
        return arrow_of(json.loads(kind.json()), where)
    except NoArrowType as missing:
        raise SchemaError(f"{missing.where}: type {json.dumps(missing.spark_type)} has no "
                          "Arrow type to export as") from None


def arrow_schema(struct: T.StructType, table: str) -> pa.Schema:
    return pa.schema([pa.field(f.name, arrow_type(f.dataType, f"table {table}, column {f.name}"))
                      for f in struct.fields])


def cast_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` on `schema`: columns by name, in its order, at its types (a Spark INT96
    timestamp read as nanoseconds becomes microseconds; a session time zone becomes UTC)."""
    columns = [batch.column(f.name).cast(f.type) for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def frame_to_arrow(frame: DataFrame, schema: pa.Schema) -> pa.Table:
    """A small frame (changes) as one Arrow table on `schema` (see the module docstring)."""
    table = frame.toArrow()
    batches = [cast_batch(b, schema) for b in table.to_batches()]
    return pa.Table.from_batches(batches, schema=schema)


STAGING = "_export"
"""Staging directories live under `LAKE/_export/`, one per run, named `{pid}-{random}`; the
export locks in `LAKE/_export/locks/`."""


@contextmanager
def export_lock(lake_root: Path | RemotePath, target: str | Path) -> Iterator[None]:
    """Hold an exclusive lock for exports to `target` from this lake (a `flock`, which the
    kernel releases when the process dies), so two runs do not apply the same changes twice.
    `target` names the target: a Delta table's path, an Iceberg catalog and table. On a
    remote lake the lock is an object made by a conditional PUT (`commit.remote_writer_lock`,
    whose rules for a holder that died apply)."""
    import hashlib

    from changelake.lake.commit import remote_writer_lock

    locks = lake_root / STAGING / "locks"
    name = hashlib.sha256(str(target).encode()).hexdigest()[:32]
    if isinstance(locks, RemotePath):
        with remote_writer_lock(locks / name):
            yield
        return
    locks.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(locks / name):
        yield


@contextmanager
def staging_dir(lake_root: Path | RemotePath) -> Iterator[Path | RemotePath]:
    """A fresh staging directory under the lake, removed afterwards. A run killed before it
    could remove its own leaves one behind: the next run removes those whose process is gone
    (on a local lake; a remote lake's are named by a process of any host, and stay)."""
    top = lake_root / STAGING
    if isinstance(top, RemotePath):
        path = top / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            yield path
        finally:
            remove_tree(path)
        return
    top.mkdir(parents=True, exist_ok=True)
    for old in top.iterdir():
        if old.name == "locks":
            continue
        pid = old.name.split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    path = top / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def staged_batches(frame: DataFrame, schema: pa.Schema, directory: Path | RemotePath
                   ) -> pa.RecordBatchReader:
    """Write `frame` with Spark into `directory` (Parquet, by the executors) and return a
    reader streaming it back in batches on `schema` (see the module docstring), in the frame's
    order (Spark numbers its part files in partition order). The directory must outlive the
    reader."""
    import pyarrow.parquet as pq

    frame.write.mode("overwrite").parquet(str(directory))
    files = sorted(directory.glob("*.parquet"))

    def batches() -> Iterator[pa.RecordBatch]:
        for path in files:  # one file at a time, in order
            # Spark writes timestamps as INT96 by default: read them as microseconds, which
            # holds every Spark timestamp (nanoseconds would overflow beyond the year 2262).
            with parquet_source(path) as source, \
                    pq.ParquetFile(source, coerce_int96_timestamp_unit="us") as parquet:
                for batch in parquet.iter_batches(columns=schema.names):
                    if batch.num_rows:
                        yield cast_batch(batch, schema)

    return pa.RecordBatchReader.from_batches(schema, batches())
