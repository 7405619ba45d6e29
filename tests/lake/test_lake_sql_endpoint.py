"""`changelake sql`: the lake's tables over JDBC, and AS OF through SQL table functions.

In process: each table's AS OF function, queried in the test session, gives exactly the rows
`snapshot --as-of T` gives, and refuses the times it refuses with its words (a keyed table in
the default run; every refusal, an unkeyed table across a schema change, a refresh and
colliding function names in the slow tier, ~3 min on a loaded 2-core machine).

End to end (slow: a lake, a server and beeline are three JVMs, ~3 min on a loaded 2-core
machine): `changelake sql` serves a lake made by another process, on 127.0.0.1 only;
beeline (Hive's JDBC client from PySpark's jars) reads the tables and the AS OF functions,
equal to `snapshot`; SIGTERM stops it with exit status 0.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import StructType

from changelake.errors import LakeError
from changelake.lake.api import snapshot
from changelake.lake.arrow import plain
from changelake.lake.catalog import Lake
from changelake.lake.layout import Origin
from changelake.lake.sql_endpoint import Endpoint, function_name, register_as_of, start
from tests.support.paths import SUPPORT
from tests.support.sql_endpoint_lake import META, ORDERS, TIMES, build
from tests.support.sql_endpoint_lake import as_of_answers as snapshot_answers

CLI = [str(Path(sys.executable).parent / "changelake")]


def multiset(rows: list[dict[str, Any]], columns: list[str]) -> Counter:
    """Rows as beeline's csv2 prints them: NULL for null, everything else as text."""
    return Counter(tuple("NULL" if r[c] is None else str(r[c]) for c in columns)
                   for r in rows)


@pytest.mark.parametrize("storage", [
    "hive", "delta"])
def test_as_of_function_is_snapshot_as_of(spark, lake_root, storage: str) -> None:
    """The quick case: a keyed table updated once, read before and after, and refused at its
    frontier; the session a server needs. Both table formats."""
    lake = Lake(spark, lake_root, storage=storage)
    db = f"sqlq_{storage}"
    table = lake.create_table(f"{db}.orders", ORDERS, key=["id"], buckets=1)
    schema = StructType([*ORDERS.fields, *META])
    table.commit(spark.createDataFrame([(1, "apple", 1, 2, 1), (2, "pear", None, 3, 1)],
                                       schema), 0, 10)
    table.commit(spark.createDataFrame([(1, "apple", 1, 12, -1), (1, "apple", 5, 12, 1)],
                                       schema), 10, 20)
    registered = register_as_of(lake)
    try:
        assert registered.functions == {f"{db}.orders": f"{db}_orders_as_of"}
        columns = ["id", "item", "qty"]
        for t, qty in ((5, "1"), (15, "5")):
            got = [plain(r.asDict()) for r in spark.sql(f"SELECT * FROM {db}_orders_as_of({t})")
                   .collect()]
            want = list(snapshot(lake, f"{db}.orders", as_of=t))
            assert multiset(got, columns) == multiset(want, columns)
            assert multiset(got, columns) == Counter({("1", "apple", qty): 1,
                                                      ("2", "pear", "NULL"): 1})
        with pytest.raises(Exception, match=re.escape(
                f"table {db}.orders: AS OF 20 is not final yet: the table is committed "
                "through time 19")):
            spark.sql(f"SELECT * FROM {db}_orders_as_of(20)").collect()
        # the endpoint needs a session whose clients share the functions' session
        with pytest.raises(LakeError, match="singleSession"):
            start(lake)
    finally:
        spark.sql(f"DROP TEMPORARY FUNCTION IF EXISTS {db}_orders_as_of")


@pytest.mark.slow
def test_as_of_functions_give_snapshot_as_of(spark, lake_root) -> None:
    """Every refusal and both kinds of table: since, frontier, NULL, a captured table's
    database frontier, an empty table, an unkeyed table across a schema change, a refresh
    after a commit, colliding names."""
    lake = Lake(spark, lake_root)
    names = {"orders": "sqlep.orders", "events": "sqlep_events"}
    build(lake, **names)
    lake.create_table("sqlep_empty", lake.table(names["orders"]).schema, key=["id"])
    # two tables whose functions would share one name: neither gets one
    lake.create_table("sqlepx.y_z", lake.table(names["orders"]).schema)
    lake.create_table("sqlepx_y.z", lake.table(names["orders"]).schema)
    # two tables captured from one database: the one ahead is read only up to the other's
    # frontier (the database's consistent frontier)
    origin = Origin("postgres", "postgres:7:8", "shopdb")
    for name, upper in (("sqlepc.ahead", 30), ("sqlepc.behind", 10)):
        captured = lake.create_table(name, ORDERS, key=["id"], origin=origin)
        captured.commit(spark.createDataFrame([(1, "apple", 1, 2, 1)],
                                              StructType([*ORDERS.fields, *META])), 0, upper)
    expected = snapshot_answers(lake, names)
    with pytest.raises(LakeError) as beyond:
        list(snapshot(lake, "sqlepc.ahead", as_of=12))
    registered = register_as_of(lake)
    try:
        assert registered.functions == {"sqlep.orders": "sqlep_orders_as_of",
                                        "sqlep_events": "sqlep_events_as_of",
                                        "sqlep_empty": "sqlep_empty_as_of",
                                        "sqlepc.ahead": "sqlepc_ahead_as_of",
                                        "sqlepc.behind": "sqlepc_behind_as_of"}
        assert registered.skipped == ["sqlepx.y_z", "sqlepx_y.z"]
        answered = refused = 0
        for table, by_time in expected.items():
            columns = lake.table(table).schema.fieldNames()
            for t, want in by_time.items():
                query = f"SELECT * FROM {registered.functions[table]}({t})"
                if isinstance(want, dict):
                    with pytest.raises(Exception, match=re.escape(want["error"])):
                        spark.sql(query).collect()
                    refused += 1
                    continue
                got = [plain(r.asDict(recursive=True)) for r in spark.sql(query).collect()]
                assert spark.sql(query).columns == columns
                assert multiset(got, columns) == multiset(want, columns), (table, t)
                answered += 1
        assert (answered, refused) == (8, 3)  # the history: what each time must answer
        # the schema change at 10: `n` shows before it and reads null after it
        assert [r["n"] for r in expected["sqlep_events"]["9"]].count(1) == 2
        assert all(r["n"] is None for r in expected["sqlep_events"]["10"])
        assert "consistent frontier of database shopdb" in str(beyond.value)
        with pytest.raises(Exception, match=re.escape(str(beyond.value))):
            spark.sql("SELECT * FROM sqlepc_ahead_as_of(12)").collect()
        assert spark.sql("SELECT id FROM sqlepc_ahead_as_of(9)").collect()[0][0] == 1
        # an empty table refuses too (its frontier is 0)
        with pytest.raises(Exception, match="AS OF 0 is not final yet"):
            spark.sql("SELECT * FROM sqlep_empty_as_of(0)").collect()
        with pytest.raises(Exception, match="AS OF needs a time, not NULL"):
            spark.sql("SELECT * FROM sqlep_orders_as_of(NULL)").collect()
        # a commit after registration (another process, on a shared metastore): a refresh
        # re-registers, and the function answers up to the new frontier
        endpoint = Endpoint(lake, server=None, port=0, registered=registered)
        assert not endpoint.refresh()
        orders = lake.table(names["orders"])
        orders.commit(spark.createDataFrame([(4, "fig", 4, 30, -1)],
                                            "id long, item string, qty long, _time long, "
                                            "_diff long"), 30, 40)
        assert endpoint.refresh()
        registered = endpoint.registered
        got = [plain(r.asDict()) for r in spark.sql("SELECT * FROM sqlep_orders_as_of(30)")
               .collect()]
        want = list(snapshot(lake, names["orders"], as_of=30))
        assert multiset(got, ["id", "item", "qty"]) == multiset(want, ["id", "item", "qty"])
        assert len(want) == 2  # fig deleted at 30
    finally:
        for name in registered.functions.values():
            spark.sql(f"DROP TEMPORARY FUNCTION IF EXISTS {name}")


def test_a_busy_port_is_refused_before_spark_starts(tmp_path: Path) -> None:
    (tmp_path / "lake").mkdir()  # a lake, empty (a missing one is refused first)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([*CLI, "sql", "--lake", str(tmp_path / "lake"), "--port",
                              str(port)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"changelake: error: port {port} on 127.0.0.1 is not free for the SQL endpoint: "
        "Address already in use; pick another --port, or 0 for any free one"]
    assert not any((tmp_path / "lake").iterdir())  # nothing started, nothing made


def test_function_names() -> None:
    assert function_name("orders") == "orders_as_of"
    assert function_name("Shop.Orders") == "shop_orders_as_of"


# ------------------------------------------------------------------------------ end to end


def jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def beeline(port: int, script: Path) -> subprocess.CompletedProcess:
    """Run the statements of `script` through Hive's JDBC client, each despite the errors of
    the others; rows as csv2."""
    from changelake.spark.session import check_java

    return subprocess.run(
        [check_java(), "-cp", f"{jars()}/*", "org.apache.hive.beeline.BeeLine",
         "-u", f"jdbc:hive2://127.0.0.1:{port}/default", "--outputformat=csv2",
         "--silent=true", "--showHeader=true", "--force=true", "-f", str(script)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


PROMPT = re.compile(r"^\d+: jdbc:hive2://\S*> ?")


def results(stdout: str) -> dict[str, list[tuple[str, ...]]]:
    """Each query's rows by its tag: every query selects its tag as column `q` first."""
    out: dict[str, list[tuple[str, ...]]] = {}
    lines = [PROMPT.sub("", line) for line in stdout.splitlines()]
    for row in csv.reader(line for line in lines if line.strip()):
        if row[0] == "q":
            continue  # a header
        out.setdefault(row[0], []).append(tuple(row[1:]))
    return out


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as the kernel lists them) of sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
                found.add(address)
    return found


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


@contextlib.contextmanager
def sql_server(lake: str, tmp_path: Path, env: dict[str, str] | None = None,
               options: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """`changelake sql --lake LAKE [OPTIONS]` in a process group of its own, given once it
    says it is listening: the process, and the files its stdout and stderr go to. Whatever is
    left of the group when the block ends is killed (its JVM too)."""
    out, err = tmp_path / "sql.out", tmp_path / "sql.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        server = subprocess.Popen([*CLI, "sql", "--lake", lake, "--master", "local[1]",
                                   *options],
                                  stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=env,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while "listening" not in out.read_text() and server.poll() is None:
            assert time.monotonic() < deadline, "the endpoint did not start in time"
            time.sleep(0.5)
        assert server.poll() is None, err.read_text()[-3000:]
        yield server, out, err
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_sql_endpoint_serves_the_lake_over_jdbc(tmp_path: Path, lake_root) -> None:
    lake_dir = lake_root
    made = subprocess.run([sys.executable, str(SUPPORT / "sql_endpoint_lake.py"), str(lake_dir)],
                          capture_output=True, text=True, timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    truth = json.loads(next(line for line in made.stdout.splitlines()
                            if line.startswith("RESULT "))[len("RESULT "):])

    with sql_server(str(lake_dir), tmp_path) as (server, out, err):
        (line,) = out.read_text().splitlines()
        match = re.fullmatch(r"changelake sql: listening on jdbc:hive2://127\.0\.0\.1:(\d+)"
                             r"/default \(loopback only, no authentication\); stop it with "
                             r"Ctrl-C or SIGTERM", line)
        assert match, line
        port = int(match.group(1))
        assert "shop.orders: shop_orders_as_of(time)" in err.read_text()
        assert "events: events_as_of(time)" in err.read_text()
        bound = listening_addresses(port)
        assert bound and bound <= LOOPBACK, bound

        queries = ["SELECT 'now' AS q, * FROM shop.orders;"]
        for table, function in (("shop.orders", "shop_orders_as_of"),
                                ("events", "events_as_of")):
            for t in TIMES["orders" if table == "shop.orders" else "events"]:
                queries.append(f"SELECT '{table}@{t}' AS q, * FROM {function}({t});")
        script = tmp_path / "queries.sql"
        script.write_text("\n".join(queries) + "\n")
        run = beeline(port, script)
        got = results(run.stdout)
        columns = {"shop.orders": ["id", "item", "qty"], "events": ["kind", "n", "note"]}

        def rows(want: list[dict[str, Any]], table: str) -> Counter:
            return multiset(want, columns[table])

        assert Counter(got.get("now", [])) == rows(truth["now"]["shop.orders"], "shop.orders")
        refused = 0
        for table, by_time in truth["as_of"].items():
            for t, want in by_time.items():
                tag = f"{table}@{t}"
                if isinstance(want, dict):
                    assert tag not in got
                    assert want["error"] in run.stdout + run.stderr, (tag, run.stderr[-2000:])
                    refused += 1
                else:
                    assert Counter(got.get(tag, [])) == rows(want, table), (tag, run.stderr)
        assert refused == 3
        assert got["shop.orders@12"] != got["shop.orders@25"]  # AS OF reads differ

        server.send_signal(signal.SIGTERM)
        assert server.wait(120) == 0, err.read_text()[-3000:]
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # no longer listening


# --------------------------------------------------------------------------- --password-file


@pytest.mark.parametrize(("mode", "text", "says"), [
    (0o644, "s3cret\n", "others may read or write it (mode 0644); chmod 600 it"),
    (0o600, "\nsecond\n", "its first line, the password, is empty"),
    (None, "", "No such file or directory"),
])
def test_a_password_file_others_can_read_is_refused_before_spark_starts(
        tmp_path: Path, mode: int | None, text: str, says: str) -> None:
    (tmp_path / "lake").mkdir()
    password = tmp_path / "pw"
    if mode is not None:
        password.write_text(text)
        password.chmod(mode)
    run = subprocess.run([*CLI, "sql", "--lake", str(tmp_path / "lake"), "--password-file",
                          str(password)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"changelake: error: --password-file {password}: {says}"]
    assert not any((tmp_path / "lake").iterdir())  # nothing started, nothing made
    assert "s3cret" not in run.stderr


def beeline_as(port: int, script: Path, password_file: Path | None
               ) -> subprocess.CompletedProcess:
    from changelake.spark.session import check_java

    login = ["-n", "anyone", "-w", str(password_file)] if password_file else []
    return subprocess.run(
        [check_java(), "-cp", f"{jars()}/*", "org.apache.hive.beeline.BeeLine",
         "-u", f"jdbc:hive2://127.0.0.1:{port}/default", *login, "--outputformat=csv2",
         "--silent=true", "-f", str(script)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_with_a_password_file_only_its_password_connects(tmp_path: Path) -> None:
    """`sql --password-file`: beeline with the file's password runs a query; with another
    password, or none, it cannot connect (the Thrift server's CUSTOM authentication with the
    jar's PasswordFile); a changed file takes effect at the next connection."""
    lake_dir = tmp_path / "lake"
    lake_dir.mkdir()
    password, wrong = tmp_path / "pw", tmp_path / "wrong"
    for path, text in ((password, "s3cret-pass\n"), (wrong, "s3cret\n")):
        path.write_text(text)
        path.chmod(0o600)
    script = tmp_path / "q.sql"
    script.write_text("SELECT 'asked' AS q, 41 + 1 AS answer;\n")
    with sql_server(str(lake_dir), tmp_path,
                    options=("--password-file", str(password))) as (server, out, err):
        (line,) = out.read_text().splitlines()
        match = re.fullmatch(r"changelake sql: listening on jdbc:hive2://127\.0\.0\.1:(\d+)"
                             rf"/default \(loopback only, password from {re.escape(str(password))}"
                             r"\); stop it with Ctrl-C or SIGTERM", line)
        assert match, line
        port = int(match.group(1))

        right = beeline_as(port, script, password)
        assert results(right.stdout) == {"asked": [("42",)]}, right.stderr[-2000:]
        for login in (wrong, None):
            refused = beeline_as(port, script, login)
            assert "asked" not in results(refused.stdout)
            assert "Error validating the login" in refused.stdout + refused.stderr
        password.write_text("s3cret\n")  # read at each connection: the old one no longer works
        assert results(beeline_as(port, script, wrong).stdout) == {"asked": [("42",)]}
        assert "s3cret" not in out.read_text() + err.read_text()

        server.send_signal(signal.SIGTERM)
        assert server.wait(120) == 0, err.read_text()[-3000:]
