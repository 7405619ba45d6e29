"""Which changefeed batches the Spark path converts and which the Python path does, and why.

The promise: `choose` converts a batch on the Spark path (the project's Java and Spark's
expressions: `debezium_path.py`, `ydb_path.py`, the main one) unless a reason is known before
the batch is read (`reason_before_reading`) or the Spark path raises `Unsupported` on its way;
then on the Python path, the specification (`formats/`, `convert/`) run in `mapInPandas`
(`python_path/`), on the same lines, which converts every batch `encode_changefeed` does and
names bad lines as it does. `pipeline.convert_lines` makes the choice with it. The reasons, as
the code has them:

* asked for: `python_path=True` (tests and benchmarks compare the two paths), or a `reason`
  the caller gives: a check the Spark path's conversion deferred to the job that writes its
  updates failed (`conversion.Checks.settle`; `lake.ingest` converts again with its reason);
* YDB without a table schema, or without key columns (before reading);
* Debezium, from the parse (`debezium_path.debezium_timed`): a line over the bound or not
  UTF-8; any line the Java line reader leaves (`DebeziumLine.java`: a shape it does not
  read, a truncate, a logical message, a Kafka record dump, a key record, a change without a
  position, a bad line, ...); changes of two tables;
* Debezium columns (`debezium_path._columns`, `types.py`): no row image; column names that
  differ only in case; Debezium schemas that differ between lines other than by columns
  added or dropped or a widening (an `ALTER TABLE` while streaming: `_merged_connect`); an
  image column beyond the table schema's (schema drift); a column type, Connect type,
  logical type or decimal scale it does not convert; a column decoded two ways, a type
  decoded from text, or decoded on some lines only; key columns that no image has;
* YDB (`ydb.py`, `ydb_path.py`): key columns other than the table's primary key; column
  names that differ only in case; a YDB type or a column name it does not convert; from the
  parse (`ydb_path._ydb_parsed_by_java`), a line over the bound or not UTF-8, and any line the
  Java line reader leaves (`YdbLine.java`, `YdbLines.problems`: a bad line, DEBEZIUM_JSON, a
  null in a key, a name twice in an object, an OLD_IMAGE record, a barrier beyond a long,
  ...); records without `ts` beside records with `ts` or barriers; a record below its
  partition's last barrier that repeats no earlier event of its file; a line out of bounds
  that the bounds check did not find;
* the conversion (`conversion.py`, `keyed.py`, `unkeyed.py`): a problem its checks find (a
  null key, a key it cannot tell, two rows for one key at one position, an image value of
  another kind than its column's, a retraction without a before image, ...); positions of a
  type the Java conversion does not take; more than `moves.MAX_CHAINED` key moves of one
  batch whose old key another move made (`moves.py`); and in any step, a value Spark refuses
  (`steps.guard`).

A reason that starts with "bad" names a line the encoder refuses too; the Python path then
names it as the encoder does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from changelake.formats.tableschema import TableSchema

log = logging.getLogger(__name__)
Out = TypeVar("Out")


class Unsupported(Exception):
    """The batch needs something the Spark path does not do; the Python path converts it."""


def reason_before_reading(source: str, schema: TableSchema | None, keys: Sequence[str], *,
                          python_path: bool, reason: str | None) -> str | None:
    """Why the batch goes to the Python path before any of it is read, or None."""
    if reason is None and python_path:
        reason = "the Python path was asked for"
    if source == "ydb":
        if schema is None:
            reason = "unsupported: YDB without a table schema"
        elif not keys:
            reason = "unsupported: YDB without key columns"
    return reason


def choose(spark_path: Callable[[], Out], python_path: Callable[[str], Out],
           reason: str | None) -> Out:
    """`spark_path()`, unless there is a `reason` or it raises `Unsupported`; else
    `python_path(reason)`, the reason logged."""
    if reason is None:
        try:
            return spark_path()
        except Unsupported as why:
            reason = str(why)
    log.info("changefeed conversion on the Python path: %s", reason)
    return python_path(reason)
