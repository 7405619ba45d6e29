"""An S3 server on loopback for the tests: moto's (`moto[server]`), started in this process
on a free port of 127.0.0.1, with a fixed test key and a bucket, stopped after.

A lake on it is `s3a://BUCKET/PREFIX`. A changelake command reaches it the usual ways only:
the AWS SDK's environment variables (`S3Server.environment()`: the key pair, the endpoint as
`AWS_ENDPOINT_URL`, a region), which `lake_session` turns into S3A's settings where no
`--conf spark.hadoop.fs.s3a.*` says otherwise; never a secret on a command line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

ACCESS_KEY = "AKIACHANGELAKETEST01"
SECRET_KEY = "changelake-test-secret-5b9f2e71c4"
"""The fixed test key pair. moto accepts any key; the secret is asserted absent from every
output the tests read."""

REGION = "us-east-1"
BUCKET = "lake-bucket"

NO_INSTANCE_METADATA = {"AWS_EC2_METADATA_DISABLED": "true"}
"""Without credentials the SDKs' default chains end by asking the instance metadata service
(169.254.169.254), which is not on loopback: never asked in the tests."""


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str

    def lake(self, prefix: str) -> str:
        return f"s3a://{self.bucket}/{prefix}"

    def environment(self, *, credentials: bool = True) -> dict[str, str]:
        """The variables a command on the lake needs (merge into a copy of `os.environ`)."""
        env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION,
               **NO_INSTANCE_METADATA}
        if credentials:
            env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        return env

    def client(self):  # boto3, for the tests' own looks at the bucket
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", ())]


def command_environment(server: S3Server, *, credentials: bool = True) -> dict[str, str]:
    """`os.environ` with any AWS settings of the machine left out, plus the server's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(server.environment(credentials=credentials))
    return env


@contextmanager
def s3_server(bucket: str = BUCKET) -> Iterator[S3Server]:
    """moto's server on 127.0.0.1 (a free port), with `bucket` made; stopped on exit."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        running = S3Server(f"http://{host}:{port}", bucket)
        running.client().create_bucket(Bucket=bucket)
        yield running
    finally:
        server.stop()
