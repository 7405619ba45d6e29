"""No password printed back (issue 67): a password planted in each input that may hold one
(a schema registry URL, a libpq DSN in both forms, an Iceberg catalog URI, the demo's --dsn),
each error path run through the CLI, and the password looked for in everything it printed.
Then the registry's credentials (from the environment; not carried to another host by a
redirect), and `status`, which asks the servers a lake names only with --live."""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from changelake.cli import main
from changelake.kafka import RegistryError, RegistryServer, SchemaRegistry
from changelake.kafka.registry import AUTH_ENV

PW = "s3cretpw"


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def refused_without_password(result: Result, *words: str) -> str:
    """The command failed with one `changelake: error:` line that names `words` and holds no
    password."""
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert PW not in text, text
    assert result.exit_code == 2, text
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("changelake: error: "), line
    for word in words:
        assert word in line, line
    return line


def test_a_bad_schema_registry_url_is_not_printed_back() -> None:
    line = refused_without_password(cli("decode", "--kafka", "127.0.0.1:1", "--topic", "t",
                                        "--schema-registry", f"htp://alice:{PW}@h"),
                                    "--schema-registry", "alice:***@h")
    assert "expected http(s)://" in line
    for url in (f"http://alice:{PW}@h:notaport", f"http://alice:{PW}@"):  # no port, no host
        with pytest.raises(RegistryError) as error:
            SchemaRegistry(url)
        assert PW not in str(error.value)


@pytest.mark.parametrize("dsn", [
    f"postgresql://alice:{PW}@127.0.0.1:1/db",  # refused connection
    f"postgresql://alice:{PW}@127.0.0.1:1/db?sslpassword={PW}",
    f"postgresql://alice:{PW}%zz@h/db",  # libpq quotes the token: "s3cretpw%zz"
    f"dbname=x postgresql://alice:{PW}@h",  # libpq quotes the URI: missing "=" after ...
    f"host=127.0.0.1 port=1 password={PW} sslpassword={PW}",
    f"host=127.0.0.1 port=1 password='{PW} x'",
    f"postgresql://alice:{PW}@[::1/db",  # libpq quotes the whole URI
    # libpq reads a URI's user information up to its '@', where a URL's stops at a space,
    # '#' or '?' (the password had been shown whole), and an unquoted value up to a space
    # that no backslash escapes (the part after it had been shown).
    f"postgresql://alice:x {PW}@127.0.0.1:1/db",
    f"postgresql://alice:x#{PW}@127.0.0.1:1/db",
    f"postgresql://alice:x?{PW}@127.0.0.1:1/db",
    f"host=127.0.0.1 port=1 password=x\\ {PW}",
])
def test_capture_dsn_errors_hold_no_password(dsn: str, tmp_path: Path) -> None:
    refused_without_password(cli("capture", "postgres", "--out", str(tmp_path / "out"),
                                 "--dsn", dsn, "--publication", "p", "--slot", "s"),
                             "cannot connect to PostgreSQL")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("dsn", "shown"), [
    (f"postgresql://alice:{PW}@127.0.0.1:1/db", "(postgresql://alice:***@"),
    # Masked by the demo's own message, not only by the CLI's last redaction (which cannot
    # know that libpq's "s3cretpw%zz" or a password's part after a space is one).
    (f"postgresql://alice:{PW}%zz@h/db", "(a DSN libpq cannot parse)"),
    (f"postgresql://alice:x {PW}@127.0.0.1:1/db", "(postgresql://alice:***@"),
])
def test_demo_dsn_errors_hold_no_password(tmp_path: Path, dsn: str, shown: str) -> None:
    """`demo --dsn` refused: no password in anything it printed."""
    refused_without_password(cli("demo", "--updates", "50", "--workdir", str(tmp_path),
                                 "--dsn", dsn),
                             f"cannot connect to the demo's PostgreSQL {shown}")


def test_the_demo_hands_its_captures_the_dsn_in_the_environment(tmp_path: Path) -> None:
    """Not on their command lines, which `ps` shows to every user: `capture postgres` takes
    --dsn from CHANGELAKE_DSN."""
    from changelake.demo.postgres import DSN_ENV, capture_command

    dsn = f"postgresql://alice:{PW}@127.0.0.1:1/db"
    command, env = capture_command(dsn, tmp_path / "lake", create=True, until_idle=1)
    assert not any(PW in arg for arg in command) and env[DSN_ENV] == dsn
    result = CliRunner(env={DSN_ENV: dsn}).invoke(main, [
        "capture", "postgres", "--out", str(tmp_path / "out"), "--publication", "p",
        "--slot", "s"])
    refused_without_password(result, "cannot connect to PostgreSQL (postgresql://alice:***@")


def test_iceberg_catalog_uris_are_not_printed_back(tmp_path: Path) -> None:
    lake = ["export", "--lake", str(tmp_path / "lake"), "--table", "t", "--to", "iceberg"]
    refused_without_password(cli(*lake, f"postgresql://alice:{PW}@h/db"),
                             "postgresql://alice:***@h/db", "warehouse")
    refused_without_password(cli(*lake, f"postgresql//alice:{PW}@h/db"),
                             "not a SQLAlchemy URL")
    assert not (tmp_path / "lake").exists()  # refused before the lake (and Spark)

    from changelake.errors import LakeError
    from changelake.lake.export.iceberg import open_catalog

    for uri in (f"postgresql+psycopg2://alice:{PW}@127.0.0.1:1/db",  # refused connection
                f"bogus://alice:{PW}@h/db", f"mysql://alice:{PW}@h/db"):  # no such dialect
        with pytest.raises(LakeError, match="cannot be opened") as error:
            open_catalog(uri, warehouse=tmp_path / "warehouse")
        assert PW not in str(error.value)


@pytest.mark.parametrize(("catalog", "warehouse", "said"), [
    # SQLAlchemy reads the URL, and not its port: had been "internal error: ValueError".
    (f"postgresql://alice:{PW}@h:notaport/db", "WH",
     "iceberg catalog 'postgresql://alice:***@h:notaport/db' is not a SQLAlchemy URL it can "
     "read"),
    # pyiceberg refuses the warehouse only once Spark has run, with the password in its text
    # (pyarrow: "Not a valid bucket name: 'alice:s3cretpw@bucket'") or as "internal error".
    ("CAT", f"bogus://alice:{PW}@h/x", "iceberg warehouse 'bogus://alice:***@h/x': pyiceberg "
     "has no file system for bogus:// URLs"),
    ("CAT", f"s3://alice:{PW}@bucket/x", "iceberg warehouse 's3://alice:***@bucket/x': a "
     "password in the URL is not taken"),
    ("CAT", "file://elsewhere/x", "a file:// warehouse is a directory of this machine"),
])
def test_iceberg_uris_sqlalchemy_or_pyiceberg_refuse_are_one_line(
        tmp_path: Path, catalog: str, warehouse: str, said: str) -> None:
    """Refused in one line before the lake (and Spark) start, and before the catalog's file
    or the warehouse is made."""
    catalog = catalog.replace("CAT", f"sqlite:///{tmp_path / 'ice' / 'catalog.db'}")
    warehouse = warehouse.replace("WH", str(tmp_path / "warehouse"))
    refused_without_password(cli("export", "--lake", str(tmp_path / "lake"), "--table", "t",
                                 "--to", "iceberg", catalog, "--warehouse", warehouse), said)
    assert sorted(tmp_path.iterdir()) == []


def test_kafka_source_missing_subject_holds_no_password() -> None:
    """`ingest --follow --kafka` with a registry that has no subject for the topic (the
    planning step the Spark source runs on the driver)."""
    from changelake.spark.kafka_source import KafkaOptions

    with RegistryServer() as registry:
        url = registry.url.replace("http://", f"http://alice:{PW}@")
        options = KafkaOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1",
                                      "topics": "t", "schemaRegistry": url})
        with pytest.raises(ValueError, match="has no subject t-value") as error:
            options.resolved()
    assert PW not in str(error.value) and "alice:***@" in str(error.value)


# ------------------------------------------------------------------- registry credentials


class _Recorder(BaseHTTPRequestHandler):
    """Records each request's Authorization header; `/go/...` redirects to `server.target`
    + the rest of the path, anything else answers schema id 1."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Authorization")))  # type: ignore[attr-defined]
        if self.path.startswith("/go/"):
            self.send_response(302)
            self.send_header("Location", self.server.target + self.path[3:])  # type: ignore[attr-defined]
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"error_code": 40403, "message": "Schema not found"}'
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def recorders() -> Iterator[list[ThreadingHTTPServer]]:
    servers = []
    for _ in range(2):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        server.seen = []  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_registry_credentials_from_the_environment(recorders, monkeypatch) -> None:
    home = recorders[0]
    monkeypatch.setenv(AUTH_ENV, f"alice:{PW}")
    assert SchemaRegistry(_url(home)).schema(7) is None
    assert home.seen == [("/schemas/ids/7", _basic("alice", PW))]  # type: ignore[attr-defined]
    # credentials in the URL win over the environment's
    url = _url(home).replace("http://", "http://bob:pw2@")
    assert SchemaRegistry(url).schema(8) is None
    assert home.seen[-1] == ("/schemas/ids/8", _basic("bob", "pw2"))  # type: ignore[attr-defined]
    monkeypatch.setenv(AUTH_ENV, PW)
    with pytest.raises(RegistryError, match=f"{AUTH_ENV}: expected USER:PASSWORD") as error:
        SchemaRegistry(_url(home))
    assert PW not in str(error.value)


def test_a_redirect_to_another_host_loses_the_credentials(recorders) -> None:
    home, elsewhere = recorders
    home.target = _url(elsewhere)  # type: ignore[attr-defined]
    client = SchemaRegistry(_url(home).replace("http://", f"http://alice:{PW}@"))
    client.url += "/go"  # every call goes through the redirect
    assert client.schema(3) is None
    assert home.seen == [("/go/schemas/ids/3", _basic("alice", PW))]  # type: ignore[attr-defined]
    assert elsewhere.seen == [("/schemas/ids/3", None)]  # type: ignore[attr-defined]
    # to the same host and port, they go along
    home.target = _url(home)  # type: ignore[attr-defined]
    assert client.schema(4) is None
    assert home.seen[-1] == ("/schemas/ids/4", _basic("alice", PW))  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ status


class _Listener:
    """A TCP port that counts the connections made to it and closes each at once."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.socket.close()


@pytest.mark.spark
def test_status_asks_the_servers_a_lake_names_only_with_live(spark, tmp_path: Path,
                                                             monkeypatch) -> None:
    """A lake someone else wrote names a database (with a secret in its DSN, as lakes written
    before sslpassword was dropped hold it) and a Kafka cluster: `status` connects to neither
    unless asked (--live), and prints the secret in neither case."""
    import orjson
    from pyspark.sql import types as T

    from changelake.lake.catalog import Lake
    from changelake.lake.layout import Origin, PartitionOffsets, SourceOffsets, TopicOffsets

    database, cluster = _Listener(), _Listener()
    try:
        origin = Origin("postgres", "postgres:1:2", "theirs", {
            "slot": "s", "dsn": f"host=127.0.0.1 port={database.port} dbname=theirs "
                                f"sslpassword={PW}"})
        lake = Lake(spark, tmp_path / "lake")
        schema = T.StructType([T.StructField("id", T.LongType())])
        table = lake.create_table("public.t", schema, key=["id"], origin=origin)
        rows = spark.createDataFrame([], T.StructType([*schema.fields,
                                                       T.StructField("_time", T.LongType()),
                                                       T.StructField("_diff", T.LongType())]))
        with table.writer() as writer:
            writer.commit(rows, 0, 5, offsets=SourceOffsets(
                "kafka", "materialize", f"127.0.0.1:{cluster.port}",
                (TopicOffsets("a", (PartitionOffsets(0, 3, 5),)),)))

        quiet = cli("status", "--lake", str(tmp_path / "lake"), "--format", "jsonl")
        assert quiet.exit_code == 0, quiet.output
        assert PW not in quiet.output
        assert (database.connections, cluster.connections) == (0, 0)
        lines = [orjson.loads(line) for line in quiet.stdout.splitlines()]
        (row,) = [line for line in lines if "name" in line]
        (source,) = [line for line in lines if "database" in line]
        assert [o["error"] for o in row["offsets"]] == ["not asked (--live)"]
        assert [(s["slot"], s["reachable"], s["error"]) for s in source["slots"]] == [
            ("s", None, "not asked (--live)")]
        monkeypatch.delenv("COLUMNS", raising=False)  # the table at its whole width
        shown = cli("status", "--lake", str(tmp_path / "lake"), "--format", "table")
        assert shown.exit_code == 0 and "not asked (--live)" in shown.output
        assert PW not in shown.output

        live = cli("status", "--lake", str(tmp_path / "lake"), "--format", "jsonl", "--live")
        assert live.exit_code == 0, live.output
        assert PW not in live.output
        assert database.connections >= 1 and cluster.connections >= 1
        (source,) = [orjson.loads(line) for line in live.stdout.splitlines()
                     if '"database"' in line]
        assert source["slots"][0]["reachable"] is False
        assert source["slots"][0]["error"].startswith("unreachable: ")
    finally:
        database.close()
        cluster.close()


def test_captured_tables_keep_the_dsn_without_its_secrets(pg_dsn: str) -> None:
    """What a capture records on every table it creates (`Origin.details`), and the error
    that quotes it: no password, no sslpassword (libpq ignores it without an encrypted key,
    so the connection works with it)."""
    import psycopg2

    from changelake.capture.postgres.consistency import origin
    from changelake.capture.postgres.source import Source

    conn = psycopg2.connect(pg_dsn)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY)")
        c.execute("CREATE PUBLICATION p FOR TABLE t")
    conn.close()
    with Source(f"{pg_dsn} password={PW} sslpassword='{PW} x'", "p", "s") as source:
        kept = origin(source).details["dsn"]
    assert PW not in kept and "password" not in kept
    assert psycopg2.extensions.parse_dsn(kept) == psycopg2.extensions.parse_dsn(pg_dsn)
