"""An S3 server on loopback for the tests: moto's (`moto[server]`), started in this process
on a free port of 127.0.0.1, with a fixed test key and a bucket, stopped after.

A lake on it is `s3a://BUCKET/PREFIX`. A changelake command reaches it the usual ways only:
the AWS SDK's environment variables (`S3Server.environment()`: the key pair, the endpoint as
`AWS_ENDPOINT_URL`, a region), which `lake_session` turns into S3A's settings where no
`--conf spark.hadoop.fs.s3a.*` says otherwise; never a secret on a command line.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

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


@dataclass(frozen=True)
class Taken:
    counts: Counter[str]  # requests by kind
    seconds: float  # the server's time answering them, summed over its threads
    requests: list[tuple[str, str]]  # (kind, key or prefix) of each, in order


class RequestCounts:
    """The requests the server has answered, by kind (`request_kind`), counted as they come
    (the server answers on a thread per request): for the benchmark's and the tests' counts
    of what a command asks of the store."""

    KINDS = ("GET", "HEAD", "PUT", "LIST", "DELETE", "COPY", "POST")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[tuple[str, str]] = []
        self._seconds = 0.0

    def add(self, kind: str, key: str, seconds: float) -> None:
        with self._lock:
            self._requests.append((kind, key))
            self._seconds += seconds

    def take(self) -> Taken:
        """The requests since the last `take` (or the start); a fresh count from now."""
        with self._lock:
            requests, seconds = self._requests, self._seconds
            self._requests, self._seconds = [], 0.0
        return Taken(Counter(kind for kind, _ in requests), seconds, requests)


def request_kind(environ: dict[str, Any]) -> tuple[str, str]:
    """A path-style S3 request's kind: LIST (a GET of the bucket: ListObjects), GET (of an
    object), HEAD, PUT (an object or a multipart upload's part), COPY (a PUT with
    `x-amz-copy-source`), DELETE (one object, or a POST `?delete` of several), POST (a
    multipart upload's start or completion); and the object's key (a listing's prefix)."""
    method = environ["REQUEST_METHOD"]
    key = environ.get("PATH_INFO", "").lstrip("/").partition("/")[2]
    query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    if method == "GET" and not key:
        return "LIST", query.get("prefix", [""])[0]
    if method == "PUT" and environ.get("HTTP_X_AMZ_COPY_SOURCE"):
        return "COPY", key
    if method == "POST" and "delete" in query:
        return "DELETE", key
    return method, key


def _counting(app: Callable, counts: RequestCounts) -> Callable:
    def counted(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        start = time.perf_counter()
        try:
            return app(environ, start_response)  # moto answers whole, not streamed
        finally:
            counts.add(*request_kind(environ), time.perf_counter() - start)
    return counted


@contextmanager
def s3_server(bucket: str = BUCKET, *, counts: RequestCounts | None = None
              ) -> Iterator[S3Server]:
    """moto's server on 127.0.0.1 (a free port), with `bucket` made; stopped on exit. With
    `counts`, every request it answers is counted there, by kind."""
    import logging

    from moto.moto_server.threaded_moto_server import make_server
    from moto.server import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        ThreadedMotoServer,
        create_backend_app,
    )

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:  # ThreadedMotoServer's, the app wrapped if counted
            app: Callable = DomainDispatcherApplication(create_backend_app)
            if counts is not None:
                app = _counting(app, counts)
            self._server = make_server(self._ip_address, self._port, app, True,
                                       request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = Server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        running = S3Server(f"http://{host}:{port}", bucket)
        running.client().create_bucket(Bucket=bucket)
        yield running
    finally:
        server.stop()
