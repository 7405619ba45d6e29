"""The lake and table a command names: checked before Spark starts (a mistyped lake, a bad
table name, an engine a remote lake cannot use), then opened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from changelake.cli.options import is_remote
from changelake.redact import redact


def existing_lake(lake_dir: Path) -> None:
    """Every lake command but `ingest` (whose first run makes the lake) reads a lake that
    exists: a mistyped --lake is an error naming it, not an empty lake, and is not made.
    A remote lake `remote_lake_held` cannot ask is asked when its session starts
    (`open_lake(..., existing=True)`)."""
    if not is_remote(lake_dir):
        if not lake_dir.is_dir():
            raise _no_lake(lake_dir)
    elif remote_lake_held(str(lake_dir)) is False:
        raise _no_lake(lake_dir)


def remote_lake_held(lake_uri: str) -> bool | None:
    """Whether the remote lake at `lake_uri` holds tables, asked without a JVM (pyarrow's S3
    file system, as `remote_engine` asks it) where it is on `s3a://` and the key pair is in
    the environment; None otherwise (only its session can ask)."""
    import os

    scheme = lake_uri.split("://", 1)[0].lower()
    if scheme in ("s3a", "s3") and os.environ.get("AWS_ACCESS_KEY_ID") and \
            os.environ.get("AWS_SECRET_ACCESS_KEY"):
        from changelake.lake.files import RemotePath, arrow_probe

        root = RemotePath(lake_uri)
        arrow_probe(root)
        return (root / "tables").is_dir()
    return None


def _no_lake(lake_dir: Any) -> Exception:
    from changelake.errors import LakeError

    return LakeError(f"no lake at {redact(str(lake_dir))} (a lake is made by the first ingest "
                     "into it)")


def table_and_key(table: str, key: str | None = None) -> tuple[Any, tuple[str, ...]]:
    """The table name and key columns checked before Spark starts (see lake/identifier.py):
    a bad name is one line and exit 2 at once, with nothing created."""
    from changelake.lake.identifier import TableIdentifier, check_name

    ident = TableIdentifier.parse(table)
    columns = tuple(key.split(",")) if key else ()
    for column in columns:
        check_name(column, f"table {ident}: key column")
    return ident, columns


def open_lake(lake_dir: Path, metastore_uri: str | None, master: str, conf: dict,
              table_format: str | None = None, *, existing: bool = False) -> Any:
    """The lake on a Spark session whose logs keep to errors (`quiet_spark`). With
    `existing` (a command that reads a lake: `existing_lake`), a remote lake without its
    `tables` is refused as a local one is, the session stopped."""
    from changelake.lake.api import open_lake as open_on_spark
    from changelake.spark.session import quiet_spark

    lake = open_on_spark(lake_dir, master=master, metastore_uri=metastore_uri, conf=conf,
                         storage=table_format)
    quiet_spark(lake.spark)
    if existing and is_remote(lake_dir) and not lake.tables_dir.is_dir():
        lake.spark.stop()
        raise _no_lake(lake_dir)
    return lake


def remote_engine(lake_dir: Any, engine: str) -> str:
    """The engine of `snapshot`/`status` on `lake_dir`. A remote lake is read without a JVM
    (pyarrow's S3 file system, delta-rs) on `s3a://` with the key pair in the environment
    (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`: `files.arrow_s3`); otherwise by Spark,
    whose S3A finds credentials wherever its provider chain looks (`auto`), and
    `--engine arrow` is refused in one line."""
    import os

    if not is_remote(lake_dir) or engine == "spark":
        return engine
    scheme = str(lake_dir).split("://", 1)[0].lower()
    keys = os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")
    if scheme in ("s3a", "s3") and keys:
        from changelake.lake.files import RemotePath, arrow_probe

        root = RemotePath(str(lake_dir))
        arrow_probe(root)
        if not (root / "tables").is_dir():
            from changelake.errors import LakeError

            raise LakeError(f"no lake at {redact(str(lake_dir))} (a lake is made by the "
                            "first ingest into it)")
        return engine
    if engine == "arrow":
        from changelake.errors import LakeError

        raise LakeError(f"lake {redact(str(lake_dir))}: --engine arrow reads a remote lake on "
                        "s3a:// with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the "
                        "environment only; use --engine spark")
    return "spark"
