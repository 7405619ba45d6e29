"""The README's tour and the docs' command blocks run as written against `examples/`, and
print what the pages show (the markers: `tests/support/doc_blocks.py`).

The commands run in-process (click's runner) in one copy of `examples/`, on the test run's
SparkSession: a lake command opens the lake on that session instead of starting a JVM of its
own, so the whole set costs a few Spark jobs, not a process each. A page repeats a command
another page ran at the same point of its own sequence (the tour's ingests are on three
pages): its output is taken from that run, which is what a fresh copy would print. An ingest
run again to show that it changes nothing, and the SQL endpoint's blocks, are each a Spark
job or a server of their own: the slow tier checks them, running the README's tour as a user
does, a process per command, then `changelake sql` and beeline on its queries
(`test_the_readme_tour_in_processes`).

The blocks that need a server, a database or a cluster run in the slow tier too, as written,
on servers the tests start, the blocks' placeholders (`...` of an `export`, a host name, a
port) given this run's values: the `bash` ones a line at a time in bash (`Shell`: the S3,
metastore service, PostgreSQL capture and cluster blocks), the `DebeziumRunner` example in
a fresh Python. Only the set-up itself is not run (`MAX_NOT_RUN`): CI runs it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tests.support.doc_blocks import (
    CODE,
    EXAMPLES,
    README,
    ROOT,
    RUN_KINDS,
    Block,
    Command,
    all_blocks,
    commands,
    matches,
    sql_statements,
)

#: Blocks marked `not run` (the set-up itself, which CI runs): at most this many, so that
#: examples stay runnable.
MAX_NOT_RUN = 1

#: Commands that change a lake, and those that do not open one (the rest read it; `export`
#: reads the lake and writes its target, outside it).
MUTATING = {"ingest", "compact", "capture"}
NO_LAKE = {"encode", "decode"}

DATABASE = "shop"  # the examples' tables: dropped from the test session before and after


def marked(kind: str) -> list[Block]:
    return [b for b in all_blocks() if b.mark == "run" and b.detail == kind]


def test_every_code_block_is_run_or_says_why_not() -> None:
    code = [b for b in all_blocks() if b.language in CODE]
    setup = code[0]
    assert setup.path == README and setup.line == 3, "the README opens with the set-up block"
    unmarked = [b.where for b in code[1:] if b.mark is None]
    assert not unmarked, f"mark these blocks <!-- run: KIND --> or <!-- not run: why -->: " \
                         f"{unmarked}"
    kinds = Counter(b.detail for b in code if b.mark == "run")
    assert set(kinds) <= RUN_KINDS, kinds
    assert kinds["python-api"] == 3 and kinds["kafka-python"] == 1, kinds
    assert kinds["cli"] >= 10 and kinds["sql"] >= 1, kinds
    not_run = [b for b in code if b.mark == "not run"]
    assert all(b.detail for b in not_run), "a `not run` mark says why"
    assert len(not_run) <= MAX_NOT_RUN, [b.where for b in not_run]
    # the one block not run here is the README's set-up, which CI runs (.ci/run)
    assert all(b.text == setup.text for b in not_run), [b.where for b in not_run]
    print(f"code blocks: {len(code)}; run: {dict(kinds)}; not run: {len(not_run)}")


def test_a_block_that_shows_a_file_is_that_file() -> None:
    import json

    shown = [b for b in all_blocks() if b.mark == "file"]
    assert shown
    for block in shown:
        assert json.loads(block.text) == json.loads((ROOT / block.detail).read_text()), \
            block.where


def test_command_lines_name_real_commands_and_options() -> None:
    """Every changelake command line of the pages (the `cli` blocks' and those of the blocks
    that do not run, `bash` ones) names a real command and its real options (no invented
    option), checked without running anything."""
    import click

    from changelake.cli import main

    lines: list[tuple[str, list[str]]] = []
    for block in marked("cli"):
        lines.extend((block.where, list(c.argv)) for c in commands(block))
    for block in all_blocks():
        if block.language == "bash" and block.mark is not None:
            text = block.text.replace("\\\n", " ")
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip().rstrip("&").strip()
                if line.startswith(".venv/bin/changelake "):
                    lines.append((block.where, shlex.split(line)[1:]))
    assert len(lines) >= 30
    for where, words in lines:
        cmd: click.Command = main
        while isinstance(cmd, click.Group):
            name = words.pop(0)
            assert name in cmd.commands, f"{where}: no command {name}"
            cmd = cmd.commands[name]
        known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        given = {w.split("=", 1)[0] for w in words if w.startswith("-") and w != "-"}
        assert given <= known, f"{where}: {sorted(given - known)} not options of {cmd.name}"


def changed(result: Result) -> bool:
    """Whether a lake command changed the lake (an ingest of nothing new did not)."""
    return ": nothing new" not in result.output


def _drop_database(spark) -> None:
    if spark.catalog.databaseExists(DATABASE):
        for table in spark.catalog.listTables(DATABASE):
            kind = "VIEW" if table.tableType == "VIEW" else "TABLE"
            spark.sql(f"DROP {kind} IF EXISTS `{DATABASE}`.`{table.name}`")
        spark.sql(f"DROP DATABASE IF EXISTS `{DATABASE}` CASCADE")


def _option(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _bearing_on(history: tuple[tuple[str, ...], ...], argv: tuple[str, ...]
                ) -> tuple[tuple[str, ...], ...]:
    """The commands of `history` whose changes `argv` can see: those on its lake and, for a
    command on one table, on that table (an ingest into another table changes nothing it
    prints)."""
    lake, table = _option(argv, "--lake"), _option(argv, "--table")
    return tuple(h for h in history if _option(h, "--lake") == lake
                 and (table is None or _option(h, "--table") == table))


class Sandbox:
    """One copy of `examples/` where the pages' commands run in order. `history` is the lake
    commands run in it so far that changed it. A page's lake command runs here if the page
    ran the same lake commands on its lake and table before it; one that another page
    already ran at the same point of its sequence gives that run's output (as a fresh copy
    would print it). `$PWD` in a command is the copy's directory, as the shell expands it."""

    def __init__(self, root: Path, spark, monkeypatch: pytest.MonkeyPatch) -> None:
        from changelake.cli import ingest as cli_ingest
        from changelake.cli import maintain as cli_maintain
        from changelake.cli import read as cli_read
        from changelake.lake.catalog import Lake

        self.root = root
        shutil.copytree(EXAMPLES, root / "examples")
        self.history: tuple[tuple[str, ...], ...] = ()
        self.seen: dict[tuple, Result] = {}

        def shared_lake(lake_dir, metastore_uri, master, conf, table_format=None, *,
                        existing=False):
            return Lake(spark, lake_dir, storage=table_format)

        for module in (cli_ingest, cli_read, cli_maintain):
            monkeypatch.setattr(module, "open_lake", shared_lake)
        monkeypatch.setattr(type(spark), "stop", lambda self: None)  # the commands' last step
        monkeypatch.chdir(root)
        self.env = {"CHANGELAKE_JVM_LOG": str(root / "jvm.log")}

    def run(self, page_history: tuple, argv: tuple[str, ...], where: str) -> Result:
        from changelake.cli import main

        key = (page_history, argv)
        if argv[0] not in NO_LAKE and key in self.seen:
            return self.seen[key]
        lake = _option(argv, "--lake")
        mine, made = _bearing_on(page_history, argv), _bearing_on(self.history, argv)
        assert argv[0] in NO_LAKE or not (self.root / str(lake)).exists() or mine == made, (
            f"{where}: {' '.join(argv)} runs on a lake made by {mine}, but the "
            f"sandbox's lake was made by {made}: give the page the same commands as "
            "the tour, or teach this test a second sandbox")
        started = time.monotonic()
        words = [w.replace("$PWD", str(self.root)) for w in argv]
        result = CliRunner(env=self.env).invoke(main, words, catch_exceptions=False)
        print(f"{time.monotonic() - started:6.2f} s  {where}  {' '.join(argv)}")
        if argv[0] not in NO_LAKE:
            self.seen[key] = result
            if argv[0] in MUTATING and changed(result):
                self.history = (*self.history, argv)
        return result


def check_shown(result: Result, command: Command, where: str, tmp_path: Path,
                as_shown: Callable[[str], str] = lambda shown: shown) -> None:
    """A block's command ran as the page shows it: its stdout in the file a `> FILE` names
    (the lines shown are then its stderr), exit status 2 where the page shows an error line
    and 0 otherwise, and the output the page shows (`as_shown`: the output as the page
    would print it)."""
    shown = result.output
    if command.stdout_to is not None:
        (tmp_path / command.stdout_to).write_bytes(result.stdout_bytes)
        shown = result.stderr
    failing = any(line.startswith("changelake: error:") for line in command.expected)
    assert result.exit_code == (2 if failing else 0), (
        f"{where}: {' '.join(command.argv)}: exit {result.exit_code}\n{result.output}")
    shown = as_shown(shown)
    if command.expected:
        assert matches(command.expected, shown), (
            f"{where}: {' '.join(command.argv)} printed\n{shown}\n"
            "but the page shows\n" + "\n".join(command.expected))


@pytest.mark.spark
def test_the_pages_commands_print_what_the_pages_show(spark, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _drop_database(spark)
    try:
        sandbox = Sandbox(tmp_path, spark, monkeypatch)
        histories: dict[Path, tuple] = {}
        ran = skipped = 0
        for block in marked("cli"):
            for command in commands(block):
                page = histories.get(block.path, ())
                if command.argv in page and any("nothing new" in line
                                                for line in command.expected):
                    # the same ingest again, shown to change nothing: a Spark job of its own,
                    # so the slow tier's run of the README's tour checks it
                    skipped += 1
                    continue
                result = sandbox.run(page, command.argv, block.where)
                if command.argv[0] in MUTATING and changed(result):
                    histories[block.path] = (*page, command.argv)
                check_shown(result, command, block.where, tmp_path)
                ran += 1
        assert ran >= 15 and skipped <= 3, (ran, skipped)
    finally:
        _drop_database(spark)


# ------------------------------------------------------------------------- the slow tier


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # a process per command, the SQL endpoint and beeline: minutes
def test_the_readme_tour_in_processes(tmp_path: Path) -> None:
    """The README's tour as a user types it: each command a process of its own on the lake's
    embedded metastore (Delta tables, the product's default), then `changelake sql` and
    beeline on the tour's SQL."""
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    venv = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_TABLE_FORMAT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    for block in [b for b in marked("cli") if b.path == README]:
        for command in commands(block):
            out = subprocess.run([str(venv / "changelake"), *command.argv], cwd=tmp_path,
                                 capture_output=True, env=env, timeout=900)
            assert out.returncode == 0, out.stderr.decode()[-3000:]
            if command.stdout_to is not None:
                (tmp_path / command.stdout_to).write_bytes(out.stdout)
                shown = out.stderr.decode()
            else:
                shown = out.stdout.decode() + out.stderr.decode()
            if command.expected:
                assert matches(command.expected, shown), (command.argv, shown)
    (block,) = [b for b in marked("sql") if b.path == README]
    assert all(sql_statements(b) == sql_statements(block) for b in marked("sql")), \
        "every sql block runs the README's queries (this test runs those)"
    port = _free_port()
    server = subprocess.Popen([str(venv / "changelake"), "sql", "--lake", "lake", "--port",
                               str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = server.stdout.readline().decode()  # printed once it accepts connections
        assert f"jdbc:hive2://127.0.0.1:{port}/default" in line, server.stderr.read()[-3000:]
        jars = Path(__import__("pyspark").__file__).parent / "jars"
        beeline = subprocess.run(
            ["java", "-cp", f"{jars}/*", "org.apache.hive.beeline.BeeLine", "-u",
             f"jdbc:hive2://127.0.0.1:{port}/default", "--outputformat=csv2", "-e",
             "; ".join(sql_statements(block))],
            cwd=tmp_path, capture_output=True, timeout=600)
        assert beeline.returncode == 0, beeline.stderr.decode()[-3000:]
        text = beeline.stdout.decode()
        assert "alice" in text and "erin" in text  # erin: deleted at 1400, there AS OF 1250
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + 120
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    assert server.returncode == 0


# ------------------------------------------------------------ the blocks that need a broker

#: What the Kafka blocks call the broker; the test gives them the run's.
PAGE_BROKER = "broker:9092"


def _topics_of(argv: tuple[str, ...]) -> list[str]:
    """The topics a command names (`--topic A,B` or `--topic A --topic B`)."""
    return [t for i, word in enumerate(argv[:-1]) if word == "--topic"
            for t in argv[i + 1].split(",")]


def _debezium_key(event: bytes) -> bytes:
    """The key a Debezium connector gives an event of `examples/orders.jsonl`'s table."""
    import orjson

    body = orjson.loads(event)
    return orjson.dumps({"id": (body["after"] or body["before"])["id"]})


@pytest.mark.spark
def test_the_kafka_blocks_run_on_a_broker(spark, broker, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The `kafka-cli` blocks (commands that read topics) run as the page shows them on the
    run's Apache Kafka broker, where each topic they name holds what a Debezium connector
    would have written of `examples/orders.jsonl`: the feed's events on the table topic (keyed
    by the row's key, as Debezium keys them), and no records on the transaction topic."""
    from tests.support.kafka_helpers import produce_keyed

    blocks = marked("kafka-cli")
    assert blocks, "the Debezium guide's topic examples are marked kafka-cli"
    topics = sorted({t for b in blocks for c in commands(b) for t in _topics_of(c.argv)})
    events = (EXAMPLES / "orders.jsonl").read_bytes().splitlines()
    for topic in topics:
        broker.create_topic(topic, partitions=1)
        if not topic.endswith(".transaction"):
            produce_keyed(broker, topic, [(_debezium_key(e), e) for e in events])
    _drop_database(spark)
    try:
        sandbox = Sandbox(tmp_path, spark, monkeypatch)
        ran = 0
        for block in blocks:
            for command in commands(block):
                argv = tuple(broker.bootstrap if w == PAGE_BROKER else w for w in command.argv)
                assert argv != command.argv or argv[0] in NO_LAKE, \
                    f"{block.where}: names no {PAGE_BROKER}"
                result = sandbox.run((), argv, block.where)
                check_shown(result, command, block.where, tmp_path,
                            lambda shown: shown.replace(broker.bootstrap, PAGE_BROKER))
                ran += 1
        assert ran >= 2
    finally:
        _drop_database(spark)


# ------------------------------------------- the shell blocks (the slow tier: processes)


class Shell:
    """A `bash` block's lines run as a user types them into one shell, in a copy of
    `examples/` with `.venv` (this run's) beside it: each line (with its continuation lines)
    by `bash -c`, which must exit 0; an `export` line sets the environment of the lines
    after it; a line ending in `&` runs in the background, the next line starting once it
    printed its first line (a server saying it is up), and is stopped (SIGTERM, as Ctrl-C)
    at the end, which it must survive with exit status 0. `given` replaces the block's
    placeholders (`...`, a host) with this run's values before a line runs."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        shutil.copytree(EXAMPLES, root / "examples")
        (root / ".venv").symlink_to(Path(sys.executable).parent.parent)
        self.root, self.env = root, env
        self.background: list[subprocess.Popen] = []

    @staticmethod
    def lines(block: Block) -> list[str]:
        text = block.text.replace("\\\n", " ")
        return [line for line in text.splitlines() if line.split("#", 1)[0].strip()]

    def run(self, block: Block, given: dict[str, str]) -> list[str]:
        """The block's lines run in order; each line's output (stdout, then stderr)."""
        outputs = []
        for line in self.lines(block):
            for placeholder, value in given.items():
                line = line.replace(placeholder, value)
            if line.startswith("export "):
                for word in shlex.split(line, comments=True)[1:]:
                    name, value = word.split("=", 1)
                    self.env[name] = value
                outputs.append("")
                continue
            started = time.monotonic()
            if line.rstrip().endswith("&"):
                server = subprocess.Popen(
                    ["bash", "-c", f"exec {line.rstrip().rstrip('&')}"], cwd=self.root,
                    env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    start_new_session=True)
                self.background.append(server)
                said = server.stdout.readline().decode()
                assert said and server.poll() is None, \
                    f"{block.where}: {line}: {said}{server.stderr.read().decode()[-3000:]}"
                outputs.append(said)
            else:
                out = subprocess.run(["bash", "-c", line], cwd=self.root, env=self.env,
                                     capture_output=True, timeout=900)
                assert out.returncode == 0, \
                    f"{block.where}: {line}: exit {out.returncode}\n" \
                    f"{out.stderr.decode()[-3000:]}"
                outputs.append(out.stdout.decode() + out.stderr.decode())
            print(f"{time.monotonic() - started:6.2f} s  {block.where}  {line}")
        return outputs

    def stop(self) -> None:
        """Stop the background processes (SIGTERM); each must exit 0."""
        for server in self.background:
            stop_group(server, signal.SIGTERM)
        codes = [server.returncode for server in self.background]
        assert codes == [0] * len(codes), codes


def stop_group(process: subprocess.Popen, sig: int) -> None:
    """`sig` to a running process's group, then SIGKILL if it has not exited in 2 minutes."""
    if process.poll() is None:
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def shown_for(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The output the README's tour shows for a command of it (at its first run)."""
    return next(c for b in marked("cli") if b.path == README for c in commands(b)
                if c.argv == argv).expected


def _without_aws(env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in env.items()
           if not k.startswith("AWS_") and k != "CHANGELAKE_TABLE_FORMAT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def _emptied(s3) -> None:
    """The server's bucket without objects: moto's backend is one per process, so what an
    earlier test's server stored under the bucket's name is still there."""
    client = s3.client()
    for key in s3.keys(""):
        client.delete_object(Bucket=s3.bucket, Key=key)


@pytest.mark.slow  # a Spark process per command, on moto's S3 server in this process
def test_the_s3_block_runs_on_an_s3_server(tmp_path: Path) -> None:
    """The `s3-shell` block (the storage guide's lake on object storage) runs as written on
    moto's S3 server (`tests/support/s3_server.py`), which holds the bucket the block names:
    its `export` lines get the server's key pair and endpoint for their placeholders, and
    its snapshot prints what the README's tour shows for the same table on a local lake."""
    from tests.support.s3_server import ACCESS_KEY, NO_INSTANCE_METADATA, SECRET_KEY, s3_server

    (block,) = marked("s3-shell")
    bucket = re.search(r"s3a://([^/]+)/", block.text).group(1)
    with s3_server(bucket) as s3:
        _emptied(s3)
        env = {**_without_aws(dict(os.environ)), **NO_INSTANCE_METADATA,
               "CHANGELAKE_STATE_HOME": str(tmp_path / "state")}  # the remote lake's metastore
        shell = Shell(tmp_path, env)
        given = {"AWS_ACCESS_KEY_ID=...": f"AWS_ACCESS_KEY_ID={ACCESS_KEY}",
                 "AWS_SECRET_ACCESS_KEY=...": f"AWS_SECRET_ACCESS_KEY={SECRET_KEY}",
                 "AWS_ENDPOINT_URL=http://127.0.0.1:9000": f"AWS_ENDPOINT_URL={s3.endpoint}"}
        for placeholder in given:
            assert placeholder in block.text, f"{block.where}: no {placeholder}"
        outputs = shell.run(block, given)
        assert s3.keys("lake/tables/shop/orders/")
    assert all(SECRET_KEY not in out for out in outputs)
    snapshot = ("snapshot", "--lake", "lake", "--table", "shop.orders", "--format", "csv")
    assert matches(shown_for(snapshot), outputs[-1]), outputs[-1]


@pytest.mark.slow  # the metastore service and a Spark process per command
def test_the_metastore_block_runs_with_the_service(tmp_path: Path) -> None:
    """The `metastore-shell` block (the operating guide's metastore service): the service
    started in the background on a free port (the block's 9083 may be taken on a test
    machine), the commands after it through the service, each printing what the README's
    tour shows for the same command on the embedded metastore; then the service stopped."""
    (block,) = marked("metastore-shell")
    shell = Shell(tmp_path, _without_aws(dict(os.environ)))
    port = _free_port()
    try:
        outputs = shell.run(block, {"9083": str(port)})
    finally:
        shell.stop()
    assert f"listening on 127.0.0.1:{port}" in outputs[0], outputs[0]
    for line, out in zip(shell.lines(block)[1:], outputs[1:], strict=True):
        words = shlex.split(line, comments=True)[1:]
        at = words.index("--metastore-uri")
        del words[at:at + 2]
        assert matches(shown_for(tuple(words)), out), (line, out)


@contextmanager
def _embedded_postgres() -> Iterator:
    """A PostgreSQL server of the test's own (`wal_level = logical`), stopped and removed
    after (in a folder of its own: the server's account must reach it, see conftest)."""
    from changelake.capture.postgres.server import EmbeddedPostgres

    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="changelake-test-pg-docs-")))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.directory, ignore_errors=True)


@pytest.mark.slow  # a PostgreSQL server of its own and a capture's Spark process
@pytest.mark.timeout(1200)
def test_the_capture_block_runs_on_postgres(tmp_path: Path) -> None:
    """The `postgres-shell` block (the PostgreSQL guide's capture into a lake) runs as written
    on an embedded PostgreSQL (`wal_level = logical`) where it names one: database `shop`,
    role `capture` (a replication role that must give its password, scram-sha-256), a table
    `public.orders` of `examples/orders.jsonl`'s first rows and publication `shop_pub`; the
    DSN's host is this server's address, `PGPASSWORD=...` the role's password. The capture
    runs until stopped: once the slot confirms a transaction made after it started (the
    slot is confirmed after the lake commit), it is stopped as Ctrl-C does (SIGINT), and
    the lake table holds the snapshot's rows and the transaction's."""
    import psycopg2

    from tests.support.postgres import execute

    (block,) = marked("postgres-shell")
    password = "capture-pw-7d1e"
    with _embedded_postgres() as server:
        execute(server.dsn, f"CREATE ROLE capture LOGIN REPLICATION PASSWORD '{password}'",
                "CREATE DATABASE shop OWNER capture")
        hba = server.data / "pg_hba.conf"
        hba.write_text("host all capture 127.0.0.1/32 scram-sha-256\n"
                       "host replication capture 127.0.0.1/32 scram-sha-256\n"
                       + hba.read_text())
        execute(server.dsn, "SELECT pg_reload_conf()")
        owner = f"{server.dsn_for('shop').replace('user=postgres', 'user=capture')} " \
                f"password='{password}'"
        execute(owner, "CREATE TABLE orders (id int PRIMARY KEY, customer text, "
                       "amount_cents int, status text)",
                "INSERT INTO orders VALUES (1, 'alice', 2500, 'new'), (2, 'bob', 1200, 'new')",
                "CREATE PUBLICATION shop_pub FOR TABLE orders")
        shell = Shell(tmp_path, {k: v for k, v in _without_aws(dict(os.environ)).items()
                                 if not k.startswith("PG")})
        given = {"host=db.internal": f"host=127.0.0.1 port={server.port}",
                 "PGPASSWORD=...": f"PGPASSWORD={shlex.quote(password)}"}
        (export, capture) = shell.lines(block)
        for placeholder, value in given.items():
            assert placeholder in block.text, f"{block.where}: no {placeholder}"
            export = export.replace(placeholder, value)
            capture = capture.replace(placeholder, value)
        assert export.startswith("export ") and "capture postgres" in capture
        shell.env.update(w.split("=", 1) for w in shlex.split(export, comments=True)[1:])
        started = time.monotonic()
        process = subprocess.Popen(["bash", "-c", f"exec {capture}"], cwd=tmp_path,
                                   env=shell.env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
        try:
            slot = "SELECT confirmed_flush_lsn FROM pg_replication_slots " \
                   "WHERE slot_name = 'changelake_shop'"
            admin = psycopg2.connect(server.dsn_for("shop"))
            admin.autocommit = True
            with admin.cursor() as cursor:
                while True:  # the slot is made once the capture's checks pass
                    assert process.poll() is None, process.stderr.read().decode()[-3000:]
                    assert time.monotonic() - started < 600
                    cursor.execute(slot)
                    if cursor.fetchone():
                        break
                    time.sleep(1)
                cursor.execute("INSERT INTO orders VALUES (3, 'carol', 9900, 'new')")
                cursor.execute("SELECT pg_current_wal_lsn()")
                (written,) = cursor.fetchone()
                while True:  # confirmed: committed into the lake, synced
                    assert process.poll() is None, process.stderr.read().decode()[-3000:]
                    assert time.monotonic() - started < 900
                    cursor.execute(f"SELECT ({slot}) >= %s::pg_lsn", (written,))
                    if cursor.fetchone()[0]:
                        break
                    time.sleep(1)
            admin.close()
            print(f"{time.monotonic() - started:6.2f} s  {block.where}  {capture}")
        finally:
            stop_group(process, signal.SIGINT)
        read = subprocess.run([".venv/bin/changelake", "snapshot", "--lake", "lake", "--table",
                               "public.orders", "--format", "csv"], cwd=tmp_path, env=shell.env,
                              capture_output=True, timeout=600)
        assert read.returncode == 0, read.stderr.decode()[-3000:]
        assert read.stdout.decode().splitlines() == [
            "id,customer,amount_cents,status", "1,alice,2500,new", "2,bob,1200,new",
            "3,carol,9900,new"], read.stdout.decode()


@pytest.mark.slow  # a PostgreSQL server of its own, the run's broker and Debezium's JVM
@pytest.mark.timeout(900)
def test_the_debezium_runner_block_runs(broker, tmp_path: Path) -> None:
    """The `debezium-python` block (the Debezium guide's `DebeziumRunner`) runs as written,
    in a fresh Python, on an embedded PostgreSQL holding what it names (database `shop`,
    replication role `cdc`, which owns table `public.orders`; Debezium makes publication
    `shop` and slot `shop`) and on the run's Apache Kafka broker: the DSN's host and
    `broker:9092` are given this run's addresses, and its `...` (your code while the log
    streams) waits until the table's topic holds the table's two rows (`start()` returns
    once Debezium streams, which may be before the snapshot's last records are sent; a
    stop before they are re-snapshots at the next start). After `stop()`: the topic holds
    the snapshot of each row, once, and the state folder Debezium's offsets."""
    from tests.support.debezium_real import topic_records
    from tests.support.postgres import execute

    (block,) = marked("debezium-python")
    topics = ["shop.public.orders", "shop.transaction"]
    def delete_topics() -> None:  # the kafka-cli blocks' topics have these names too
        existing = broker.admin().list_topics(timeout=30).topics
        for topic in topics:
            if topic in existing:
                broker.delete_topic(topic)

    delete_topics()
    with _embedded_postgres() as server:
        execute(server.dsn, "CREATE ROLE cdc LOGIN REPLICATION",
                "CREATE DATABASE shop OWNER cdc")
        owner = server.dsn_for("shop").replace("user=postgres", "user=cdc")
        execute(owner, "CREATE TABLE orders (id int PRIMARY KEY, customer text, "
                       "amount_cents int, status text)",
                "INSERT INTO orders VALUES (1, 'alice', 2500, 'new'), (2, 'bob', 1200, 'new')")
        wait = ("from tests.support.debezium_real import wait_for_records; "
                f"wait_for_records({broker.bootstrap!r}, {topics[0]!r}, 2)")
        given = {"host=db ": f"host=127.0.0.1 port={server.port} ",
                 "broker:9092": broker.bootstrap, "\n    ...\n": f"\n    {wait}\n"}
        code = block.text
        for placeholder, value in given.items():
            assert placeholder in code, f"{block.where}: no {placeholder!r}"
            code = code.replace(placeholder, value)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT),
                                             env.get("PYTHONPATH", "")])
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        print(f"{time.monotonic() - started:6.2f} s  {block.where}  DebeziumRunner")
        assert done.returncode == 0, done.stderr[-3000:]
        rows = sorted((r["value"]["payload"]["after"]["id"], r["value"]["payload"]["op"])
                      for r in topic_records(broker.bootstrap, topics[0], timeout=60))
        assert rows == [(1, "r"), (2, "r")], rows  # r: a snapshot read
        assert [p for p in (tmp_path / "dbz-state").iterdir() if "offset" in p.name]
    delete_topics()


@pytest.mark.slow  # a standalone cluster, a metastore service and the driver: minutes
@pytest.mark.timeout(1500)
def test_the_cluster_block_runs_on_a_standalone_cluster(tmp_path: Path) -> None:
    """The `cluster-shell` block (the cluster guide's ingest with `--master spark://...`)
    runs as written on what it names: a standalone cluster on 127.0.0.1
    (`test_spark_cluster.standalone`: a master and two workers, each offering the executor
    memory the block asks for), its lake on moto's S3 server (the bucket it names; the key
    pair and endpoint in the environment, as the storage guide's block sets them, the
    workers started without any) and a metastore service of a local lake of its own
    (`changelake metastore`); the master's and the service's addresses are this run's, and
    `orders/` is a directory holding `examples/orders.jsonl`. Without `--close` its last
    transaction (at 1900) is not final: the table holds the rows before it, the tour's keys
    with their earlier statuses."""
    from changelake.lake import metastore
    from tests.spark.test_spark_cluster import standalone
    from tests.support.s3_server import NO_INSTANCE_METADATA, s3_server

    (block,) = marked("cluster-shell")
    bucket = re.search(r"s3a://([^/]+)/", block.text).group(1)
    memory = re.search(r"spark\.executor\.memory=(\w+)", block.text).group(1)
    base = {**_without_aws(dict(os.environ)), **NO_INSTANCE_METADATA}
    (tmp_path / "cluster").mkdir()
    with s3_server(bucket) as s3, \
            standalone(tmp_path / "cluster", base, memory=memory) as (url, _), \
            metastore.start(tmp_path / "hms") as service:
        _emptied(s3)
        env = {**base, **s3.environment(), "SPARK_LOCAL_IP": "127.0.0.1",
               "PYSPARK_PYTHON": sys.executable,
               "CHANGELAKE_STATE_HOME": str(tmp_path / "state")}
        shell = Shell(tmp_path / "work", env)
        (shell.root / "orders").mkdir()
        shutil.copy(EXAMPLES / "orders.jsonl", shell.root / "orders")
        given = {"spark://spark-master:7077": url,
                 "thrift://127.0.0.1:9083": service.uri}
        for placeholder in given:
            assert placeholder in block.text, f"{block.where}: no {placeholder}"
        (out,) = shell.run(block, given)
        # read through the service on Spark (not pyarrow's S3 reader, whose AWS SDK teardown
        # at exit has aborted the process after a correct output: tests/lake/test_lake_s3.py)
        read = subprocess.run(
            [".venv/bin/changelake", "snapshot", "--lake", f"s3a://{bucket}/lake",
             "--metastore-uri", service.uri, "--table", "shop.orders", "--format", "csv",
             "--engine", "spark"],
            cwd=shell.root, env=env, capture_output=True, timeout=900)
    assert read.returncode == 0, read.stderr.decode()[-3000:]
    assert out.splitlines()[0] == \
        "shop.orders: created, committed 37 updates at times [0, 1900) as version 1", out
    snapshot = ("snapshot", "--lake", "lake", "--table", "shop.orders", "--format", "csv")
    keys = [line.split(",")[0] for line in shown_for(snapshot)]
    assert [line.split(",")[0] for line in read.stdout.decode().splitlines()] == keys, \
        read.stdout.decode()
    assert "1,alice,2500,shipped" in read.stdout.decode().splitlines()  # delivered at 1900
