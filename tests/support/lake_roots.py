"""Where the lake tests make their lakes: a local directory, or with `CHANGELAKE_TEST_LAKE=s3`
an `s3a://` prefix on the run's one moto S3 server (`s3_server.py`), so that the same tests
check a lake on object storage (issue 66).

`tests/conftest.py` starts the server before the run's SparkSession and puts its key pair and
endpoint in this process's environment (the AWS SDK's variables, as a user gives them to a
command: `s3_server.S3Server.environment`), so the SparkSession's S3A settings and every CLI
process a test starts take them from there; no secret on a command line. The tables are then
Delta tables, the product's default, or Hive-format ones with `CHANGELAKE_TABLE_FORMAT=hive`
(`tests/conftest.py`).

A test that checks what has no meaning on a store (a local file's size, mode, `fsync`, a
`flock`) says so with `local_only(reason)`.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

LAKE_ENV = "CHANGELAKE_TEST_LAKE"
"""`s3`: the lake tests' lakes on the run's S3 server; unset (or `local`): local directories."""


def lake_kind() -> str:
    value = os.environ.get(LAKE_ENV, "").strip().lower() or "local"
    if value not in ("local", "s3"):
        raise pytest.UsageError(f"{LAKE_ENV}={value!r}: expected 'local' or 's3'")
    return value


def on_s3() -> bool:
    return lake_kind() == "s3"


def local_only(reason: str) -> pytest.MarkDecorator:
    """Skip a test on an S3 lake: `reason` names what it checks that a store does not have."""
    return pytest.mark.skipif(on_s3(), reason=f"{LAKE_ENV}=s3: {reason}")


def unique_prefix(name: str) -> str:
    """A prefix on the bucket of its own for one lake of one test."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-")[:60]
    return f"{readable}-{uuid.uuid4().hex[:8]}"


class LakeRoots:
    """The roots of a test's lakes: `tmp_path / name` locally, `s3a://BUCKET/<test>-<id>/name`
    on S3 (a `str`, which `Lake`, `lake_root` and `--lake` take as they take a path)."""

    def __init__(self, tmp_path: Path, test_name: str, bucket: str | None) -> None:
        self._tmp_path = tmp_path
        self._bucket = bucket
        self._prefix = unique_prefix(test_name)

    def __call__(self, name: str = "lake") -> Path | str:
        if self._bucket is None:
            return self._tmp_path / name
        return f"s3a://{self._bucket}/{self._prefix}/{name}"


def lake_exists(root: Path | str) -> bool:
    """Whether anything is at a lake root `LakeRoots` made: a local path, or an object under
    an `s3a://` prefix (asked of the store with the environment's key pair)."""
    if isinstance(root, Path):
        return root.exists()
    import boto3

    bucket, _, prefix = str(root).removeprefix("s3a://").partition("/")
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                          region_name=os.environ.get("AWS_REGION"))
    return bool(client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/", MaxKeys=1)
                .get("KeyCount"))
