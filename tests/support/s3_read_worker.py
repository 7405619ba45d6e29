"""A remote Parquet file read as pyarrow asks for it (`files.parquet_source`), for the bounded
read test: `python tests/support/s3_read_worker.py s3a://BUCKET/KEY.parquet`, the file already
on the store and a copy of it at the path given second. The store's endpoint and key pair come from
the environment (`s3_server.environment`). Prints one JSON line `RESULT {...}`:

* `size`: the object's bytes; `footer_fetched`: the bytes fetched to read its footer alone
  (through the session's Hadoop FileSystem); `groups_fetched`: to read its last row group;
* `same_with_spark`, `same_without_spark`: whether the whole file, read through the session and
  then (the session stopped) through pyarrow's S3 file system, equals the local copy.
"""

from __future__ import annotations

import json
import sys

import pyarrow.parquet as pq

from changelake.lake.files import RemotePath, object_store_conf, parquet_source
from changelake.spark.session import build_session


def main(uri: str, local: str) -> None:
    expected = pq.read_table(local)
    path = RemotePath(uri)
    spark = build_session("local[1]", conf=object_store_conf({}), object_store=True)
    result: dict[str, object] = {"size": path.stat().st_size}
    with parquet_source(path) as source:
        parquet = pq.ParquetFile(source)
        result["footer_fetched"] = source.fetched
        parquet.read_row_group(parquet.num_row_groups - 1)
        result["groups_fetched"] = source.fetched
    with parquet_source(path) as source:
        result["same_with_spark"] = pq.ParquetFile(source).read().equals(expected)
    spark.stop()
    with parquet_source(path) as source:
        result["same_without_spark"] = pq.ParquetFile(source).read().equals(expected)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
