"""The remote writer lock's create against a store, for the conditional-PUT test:
`python tests/support/s3_lock_worker.py s3a://BUCKET/PREFIX`. The store's endpoint and key pair come
from the environment (`s3_server.environment`). Prints one JSON line `RESULT {...}`:

* `first`, `again`: `files.create_exclusive` of a new object, then of the same one;
* `overtaken`: a create during which another writer (boto3, another connection) makes the
  object after this one has checked nothing and before its PUT: it must lose, by the PUT's
  own condition; `held`: what the object holds after it.
"""

from __future__ import annotations

import json
import os
import sys

import boto3

from changelake.lake.files import RemotePath, create_exclusive, object_store_conf
from changelake.spark.session import build_session


def main(prefix: str) -> None:
    spark = build_session("local[1]", conf=object_store_conf({}), object_store=True)
    bucket, _, key = prefix.removeprefix("s3a://").partition("/")
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    first = create_exclusive(RemotePath(f"{prefix}/lock-a"), "writer 1")
    again = create_exclusive(RemotePath(f"{prefix}/lock-a"), "writer 2")

    def other_writer() -> None:
        client.put_object(Bucket=bucket, Key=f"{key}/lock-b", Body=b"the other writer")

    target = RemotePath(f"{prefix}/lock-b")
    overtaken = create_exclusive(target, "writer 1", before_put=other_writer)
    result = {"first": first, "again": again, "overtaken": overtaken,
              "held": target.read_text(), "held_a": RemotePath(f"{prefix}/lock-a").read_text()}
    print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
