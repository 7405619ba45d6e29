"""`changelake sql --lake DIR [--port P]`: the lake's tables behind a JDBC/ODBC endpoint.

BI tools, `beeline` and any Hive JDBC/ODBC driver speak HiveServer2's Thrift protocol. Spark's
own Thrift server (`HiveThriftServer2`, in PySpark's jars) speaks it, so we start it inside the
lake's SparkSession, through PySpark's JVM gateway: it then runs on that session's metastore
(the lake's embedded Derby, which admits one JVM, or the `--metastore-uri` service), and every
table is the view a commit publishes, read as any Spark SQL reader reads it. The server is
Spark's own: of the project's jar (`spark.jvm`) it uses only the password check, below.

The promise: the endpoint listens on 127.0.0.1 only and prints one line saying where
(`jdbc:hive2://127.0.0.1:P/default`) once it accepts connections; it serves
until SIGINT or SIGTERM, then stops the server and the session and exits 0. Port 0 (the
default) takes a free port. HiveServer2 lets the environment variables
`HIVE_SERVER2_THRIFT_BIND_HOST` / `..._PORT` override its settings; they are removed before the
JVM starts, and the address actually bound is checked before the line is printed.

Who may connect. Without `--password-file` anyone on the machine may: a client runs any Spark
SQL as the serving user (reading any file it can, `ADD JAR`, `SELECT TRANSFORM ... USING` a
program), which is local code execution for every local account. With `--password-file
FILE` (a file of this user's, mode 0600 or 0400, its first line the password), HiveServer2's
CUSTOM authentication asks the jar's `changelake.jvm.PasswordFile` for every connection: a
client gives any user name and that password (`beeline -n me -w FILE`), over plain SASL on
loopback. That class is in the project's jar (`spark.jvm`), put on the driver's class path.

AS OF over SQL. A client can only send SQL, and a table-valued AS OF needs a function: per
table, a SQL table function (Spark's SQL UDTF, `CREATE TEMPORARY FUNCTION ... RETURNS TABLE`)

    SELECT * FROM orders_as_of(1200)          -- table default.orders
    SELECT * FROM shop_orders_as_of(1200)     -- table shop.orders

gives exactly the rows of `changelake snapshot --table NAME --as-of 1200`: its body is the same
merge on read (`sql.state_sql`, with the time as the function's parameter) over the committed
files, and a time outside `[since, frontier)`, or beyond a captured table's source database's
consistent frontier, raises the error `snapshot` prints (`raise_error`, so the client gets it
as a query error). The functions are temporary, so nothing is written to the metastore: the
server runs one shared SQL session for all its clients
(`spark.sql.hive.thriftServer.singleSession`), where they are registered. A `NAME_history` view
(tables ingested with `--scd2`) is there too, as in any Spark session on the lake.

The functions name the committed files, so they follow the lake: every `REFRESH_SECONDS` the
tables' committed versions are read again and the functions of a changed lake re-registered
(only another process on a shared `--metastore-uri` can commit meanwhile).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from changelake.errors import LakeError
from changelake.lake.api import open_lake
from changelake.lake.catalog import Lake
from changelake.lake.identifier import TableIdentifier
from changelake.lake.layout import TableState
from changelake.lake.schema import live_columns, logical_schema
from changelake.lake.sources import SourceTables, beyond_frontier, group_sources
from changelake.lake.sql import quote, sql_type, state_sql, string_literal

HOST = "127.0.0.1"
LISTENING = ("changelake sql: listening on jdbc:hive2://{host}:{port}/default (loopback only, "
             "{auth}); stop it with Ctrl-C or SIGTERM")
NO_AUTHENTICATION = "no authentication"
PASSWORD_CLASS = "changelake.jvm.PasswordFile"
PASSWORD_PROPERTY = "changelake.sql.password.file"
"""The JVM system property `PasswordFile` reads the file's path from (HiveServer2 makes its
provider from a fresh HiveConf, which reads system properties, not the session's settings)."""
REFRESH_SECONDS = 10.0

SESSION_CONF: dict[str, str] = {
    # One SQL session for every client: the AS OF functions are registered in it.
    "spark.sql.hive.thriftServer.singleSession": "true",
}
SERVER_CONF: dict[str, str] = {
    "hive.server2.thrift.bind.host": HOST,
    "hive.server2.transport.mode": "binary",
    "hive.server2.authentication": "NONE",
}
ENV_OVERRIDES = ("HIVE_SERVER2_THRIFT_BIND_HOST", "HIVE_SERVER2_THRIFT_PORT",
                 "HIVE_SERVER2_THRIFT_HTTP_PORT", "HIVE_SERVER2_TRANSPORT_MODE")
"""Environment variables HiveServer2 prefers to its configuration (read by the JVM)."""

_SENTINEL = -7_654_321_987  # stands for the function's time inside a message's text


# ------------------------------------------------------------------------ AS OF functions


def function_name(table: str | TableIdentifier) -> str:
    """The AS OF function of a table: `NAME_as_of` in database `default`, else
    `DATABASE_NAME_as_of` (temporary functions have no database)."""
    ident = TableIdentifier.parse(table)
    prefix = "" if ident.database == "default" else f"{ident.database}_"
    return f"{prefix}{ident.name}_as_of"


def _parameter(state: TableState) -> str:
    """The function's parameter: a name none of the table's columns has (a column would
    shadow it inside the body)."""
    taken = {name.lower() for v in state.versions for name in live_columns([v])}
    name = "as_of"
    while name in taken:
        name += "_"
    return name


def _message(text: str, time_sql: str) -> str:
    """A SQL string expression: `text` with the sentinel time replaced by `time_sql`."""
    parts = text.split(str(_SENTINEL))
    pieces: list[str] = []
    for i, part in enumerate(parts):
        if i:
            pieces.append(f"CAST({time_sql} AS STRING)")
        if part:
            pieces.append(string_literal(part))
    return f"concat({', '.join(pieces)})" if len(pieces) > 1 else pieces[0]


def _refusals(state: TableState, frontier: tuple[SourceTables, int] | None, p: str
              ) -> list[tuple[str, str]]:
    """(condition, message) pairs, first match wins: the times `snapshot --as-of` refuses,
    in its order (a captured table's source frontier, then the table's since and frontier)
    and in its words."""
    name, t, upper = state.name, _SENTINEL, state.upper
    out = [(f"{p} IS NULL", string_literal(f"table {name}: AS OF needs a time, not NULL"))]
    if frontier is not None:
        group, limit = frontier
        below = "" if upper is None else f" AND {p} < {upper}"
        out.append((f"{p} >= {limit}{below}",
                    _message(str(beyond_frontier(group, t, f"table {name}")), p)))
    out.append((f"{p} < {state.since}",
                _message(f"table {name}: AS OF {t} is before the table's since "
                         f"({state.since}): its history starts there, or was compacted away "
                         "up to there", p)))
    if upper is not None:
        out.append((f"{p} >= {upper}",
                    _message(f"table {name}: AS OF {t} is not final yet: the table is "
                             f"committed through time {upper - 1}", p)))
    return out


def as_of_body(state: TableState, table_dir: Path, parameter: str) -> str:
    """The rows of the table at time `parameter` (a SQL name), merged on read as `snapshot
    --as-of` merges them. An unkeyed table shows the columns live at the time read, so its
    body has one branch per schema version, chosen by the time."""
    if state.keyed or len(state.versions) == 1:
        live = None if state.keyed else live_columns(state.versions)
        return state_sql(state, table_dir, marker=False, bound=parameter, live=live)
    branches = []
    versions = state.versions
    for i, version in enumerate(versions):
        guards = []
        if i > 0:
            guards.append(f"{parameter} >= {version.from_time}")
        if i + 1 < len(versions):
            guards.append(f"{parameter} < {versions[i + 1].from_time}")
        sql = state_sql(state, table_dir, marker=False, bound=parameter,
                        live=live_columns([version]))
        branches.append(f"SELECT * FROM ({sql}) v{i} WHERE {' AND '.join(guards)}")
    return "\nUNION ALL ".join(branches)


def as_of_function_sql(state: TableState, table_dir: Path, name: str,
                       frontier: tuple[SourceTables, int] | None = None) -> str:
    """`CREATE OR REPLACE TEMPORARY FUNCTION name(as_of BIGINT) RETURNS TABLE (...)`: the
    table AS OF a time; `frontier` (source group, time) bounds a captured table's times."""
    logical = logical_schema(state.versions)
    p = _parameter(state)
    typed = ", ".join(f"{quote(f.name)} {sql_type(f.dataType)}" for f in logical.fields)
    cols = ", ".join(quote(f.name) for f in logical.fields)
    nulls = ", ".join(f"CAST(NULL AS {sql_type(f.dataType)}) AS {quote(f.name)}"
                      for f in logical.fields)
    cases = " ".join(f"WHEN {cond} THEN raise_error({msg})"
                     for cond, msg in _refusals(state, frontier, p))
    comment = string_literal(f"table {state.name} as of a time, as `changelake snapshot "
                             f"--as-of` reads it (committed version {state.version})")
    return (
        f"CREATE OR REPLACE TEMPORARY FUNCTION {quote(name)}({p} BIGINT) "
        f"RETURNS TABLE ({typed}) COMMENT {comment} RETURN "
        f"SELECT {cols} FROM (\n{as_of_body(state, table_dir, p)}\n) rows_as_of "
        # One row that raises for a refused time (and is filtered out otherwise), so an empty
        # table refuses too.
        f"UNION ALL SELECT {nulls} FROM (SELECT CASE {cases} END AS _refused) refusal "
        f"WHERE _refused IS NOT NULL"
    )


@dataclass(frozen=True, slots=True)
class Registered:
    """What `register_as_of` registered: table -> function, and the tables left without
    one (their names collide)."""

    functions: dict[str, str]
    skipped: list[str] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)


def register_as_of(lake: Lake, *, previous: Registered | None = None) -> Registered:
    """Register (replacing) every table's AS OF function in `lake.spark`'s session, and drop
    those of tables gone since `previous`. Two tables whose function names collide (`a_b.c`
    and `a.b_c`) get none; they are listed in `skipped`."""
    spark = lake.spark
    states = [lake.handle(name).state() for name in lake.tables()]
    groups = {g.source: g for g in group_sources(states)}
    by_name: dict[str, list[TableState]] = {}
    for state in states:
        by_name.setdefault(function_name(state.name), []).append(state)
    functions: dict[str, str] = {}
    skipped: list[str] = []
    for name, owners in sorted(by_name.items()):
        if len(owners) > 1:
            skipped.extend(s.name for s in owners)
            continue
        (state,) = owners
        frontier = None
        if state.origin is not None:
            group = groups[state.origin.source]
            if group.frontier is not None and (state.upper is None
                                               or group.frontier < state.upper):
                frontier = (group, group.frontier)
        table_dir = lake.handle(state.name).directory
        spark.sql(as_of_function_sql(state, table_dir, name, frontier))
        functions[state.name] = name
    if previous is not None:
        for gone in set(previous.functions.values()) - set(functions.values()):
            spark.sql(f"DROP TEMPORARY FUNCTION IF EXISTS {quote(gone)}")
    return Registered(functions, sorted(skipped), {s.name: s.version for s in states})


def lake_versions(lake: Lake) -> dict[str, int]:
    """Each table's committed version: what the functions were made from."""
    return {name: lake.handle(name).state().version for name in lake.tables()}


# ---------------------------------------------------------------------------- the server


@dataclass
class Endpoint:
    """A running Thrift server on `lake`'s session; `url` is what JDBC clients connect to."""

    lake: Lake
    server: Any  # the JVM's HiveThriftServer2
    port: int
    registered: Registered

    @property
    def url(self) -> str:
        return f"jdbc:hive2://{HOST}:{self.port}/default"

    def refresh(self) -> bool:
        """Re-register the AS OF functions if any table's committed version changed (or a
        table came or went); whether it did."""
        if lake_versions(self.lake) == self.registered.versions:
            return False
        self.registered = register_as_of(self.lake, previous=self.registered)
        return True

    def stop(self) -> None:
        _stop_quietly(self.server.stop)


def _thrift_service(server: Any) -> Any:
    for service in server.getServices():
        if "ThriftBinaryCLIService" in service.getClass().getName():
            return service
    raise LakeError("the Spark Thrift server has no binary Thrift service")


def _field(obj: Any, declaring: str, name: str) -> Any:
    """A non-public field of a JVM object (declared by class `declaring` or a superclass)."""
    cls = obj.getClass()
    while cls is not None and cls.getName() != declaring:
        cls = cls.getSuperclass()
    if cls is None:
        raise LakeError(f"{obj.getClass().getName()} is no {declaring}")
    field_ = cls.getDeclaredField(name)
    field_.setAccessible(True)
    return field_.get(obj)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def check_port(port: int) -> None:
    """Refuse a port that something on 127.0.0.1 already holds, before anything starts (the
    Thrift server itself would only log that it could not bind)."""
    if port == 0:
        return
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError as error:
            raise LakeError(f"port {port} on {HOST} is not free for the SQL endpoint: "
                            f"{error.strerror}; pick another --port, or 0 for any free "
                            "one") from None


def check_password_file(path: Path | str) -> Path:
    """The password file `--password-file` names, checked before anything starts: a regular
    file owned by this user, readable by no one else, whose first line is not empty."""
    import stat

    path = Path(path).absolute()
    name = f"--password-file {path}"
    try:
        info = os.stat(path)
    except OSError as error:
        raise LakeError(f"{name}: {error.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise LakeError(f"{name}: not a file")
    if info.st_uid != os.geteuid():
        raise LakeError(f"{name}: owned by uid {info.st_uid}, not by you (uid "
                        f"{os.geteuid()}); use a file of your own")
    if info.st_mode & 0o077:
        raise LakeError(f"{name}: others may read or write it (mode "
                        f"{stat.S_IMODE(info.st_mode):04o}); chmod 600 it")
    with path.open("rb") as f:
        first = f.readline(1 << 16).rstrip(b"\r\n")
    if not first:
        raise LakeError(f"{name}: its first line, the password, is empty")
    return path


def _bound_socket(service: Any) -> Any:
    """The server socket the Thrift service listens on, once it does (else None): what it
    actually bound, whatever its settings said."""
    server = _field(service, "org.apache.hive.service.cli.thrift.ThriftBinaryCLIService",
                    "server")
    if server is None:
        return None
    transport = _field(server, "org.apache.thrift.server.TServer", "serverTransport_")
    sock = transport.getServerSocket() if transport is not None else None
    return sock if sock is not None and sock.isBound() else None


def _start_server(spark: Any) -> Any:
    """HiveThriftServer2.startWithSparkSession, called on a fresh thread: the server takes its
    settings from a Hive session state, and a thread that has already used the metastore has
    one of its own (without them), which it would reuse."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(spark._jvm.org.apache.spark.sql.hive.thriftserver.HiveThriftServer2
                          .startWithSparkSession(spark._jsparkSession, False))
        except BaseException as error:
            result.append(error)

    worker = threading.Thread(target=run, name="changelake sql start", daemon=True)
    worker.start()
    worker.join()
    if not result or isinstance(result[0], BaseException):
        raise LakeError(f"the Spark Thrift server did not start: {result[0] if result else ''}")
    return result[0]


def start(lake: Lake, port: int = 0, *, timeout: float = 60.0,
          password_file: Path | None = None) -> Endpoint:
    """Register the AS OF functions and start the Thrift server on `lake`'s session, bound to
    127.0.0.1:`port` (0: a free port); returns once it accepts connections there.

    The session must have been built with `SESSION_CONF` (one SQL session for all clients),
    and, for `password_file`, with the project's jar on its driver's class path."""
    import time

    spark = lake.spark
    if spark.conf.get("spark.sql.hive.thriftServer.singleSession", "false") != "true":
        raise LakeError("the SQL endpoint needs a session built with "
                        "spark.sql.hive.thriftServer.singleSession=true (its AS OF functions "
                        "live in the one session all clients share)")
    for variable in ENV_OVERRIDES:
        if os.environ.get(variable):
            raise LakeError(f"environment variable {variable} is set: HiveServer2 would "
                            "prefer it to the loopback address and port; unset it")
    check_port(port)
    registered = register_as_of(lake)
    server_conf = {**SERVER_CONF, "hive.server2.thrift.port": str(port)}
    if password_file is not None:
        system = spark._jvm.java.lang.System
        system.setProperty(PASSWORD_PROPERTY, str(check_password_file(password_file)))
        system.setProperty("hive.server2.custom.authentication.class", PASSWORD_CLASS)
        server_conf.update({"hive.server2.authentication": "CUSTOM",
                            "hive.server2.custom.authentication.class": PASSWORD_CLASS})
    for key, value in server_conf.items():
        spark.conf.set(key, value)
    server = _start_server(spark)
    try:
        service = _thrift_service(server)
        deadline = time.monotonic() + timeout
        while (sock := _bound_socket(service)) is None or not _listening(sock.getLocalPort()):
            if time.monotonic() > deadline:
                raise LakeError(f"the Spark Thrift server did not listen on {HOST}:"
                                f"{port or 'any port'} within {timeout:.0f} s")
            time.sleep(0.2)
        address = sock.getInetAddress()
        if not address.isLoopbackAddress() or (port and sock.getLocalPort() != port):
            raise LakeError(f"the Spark Thrift server bound {address.getHostAddress()}:"
                            f"{sock.getLocalPort()} instead of {HOST}:{port or 'any port'}; "
                            "stopped")
    except BaseException:
        server.stop()
        raise
    return Endpoint(lake, server, int(sock.getLocalPort()), registered)


def serve(lake: Lake, port: int = 0, *, out: TextIO, err: TextIO,
          refresh_seconds: float = REFRESH_SECONDS, password_file: Path | None = None) -> int:
    """Start the endpoint, print where it listens (`out`) and its AS OF functions (`err`),
    serve until SIGINT or SIGTERM, then stop; the exit status."""
    stop = threading.Event()

    def interrupt(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        endpoint = start(lake, port, password_file=password_file)
        auth = (NO_AUTHENTICATION if password_file is None
                else f"password from {Path(password_file).absolute()}")
        try:
            print(LISTENING.format(host=HOST, port=endpoint.port, auth=auth), file=out,
                  flush=True)
            print(_functions_line(endpoint.registered), file=err, flush=True)
            while not stop.wait(refresh_seconds):
                try:
                    if endpoint.refresh():
                        print(_functions_line(endpoint.registered), file=err, flush=True)
                except Exception as error:  # a refresh failing must not end the service
                    print(f"changelake sql: note: AS OF functions not refreshed: "
                          f"{' '.join(str(error).split())[:300]}", file=err, flush=True)
        finally:
            endpoint.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _functions_line(registered: Registered) -> str:
    if not registered.functions:
        text = "no tables yet"
    else:
        text = ", ".join(f"{table}: {name}(time)"
                         for table, name in sorted(registered.functions.items()))
    line = f"changelake sql: AS OF functions: {text}"
    if registered.skipped:
        line += (f"; none for {', '.join(registered.skipped)} (their function names "
                 "collide)")
    return line


def serve_lake(lake_dir: Path | str, port: int = 0, *, master: str = "local[*]",
               metastore_uri: str | None = None, conf: Mapping[str, str] | None = None,
               password_file: Path | str | None = None, out: TextIO, err: TextIO) -> int:
    """What `changelake sql` runs: the lake's session (built for the endpoint), served until
    interrupted, then stopped; the exit status. With `password_file`, a client must give
    the file's password (see the module docstring)."""
    check_port(port)  # before Spark starts
    settings = {**(conf or {}), **SESSION_CONF}
    checked = None
    if password_file is not None:
        from changelake.spark.jvm import jar

        checked = check_password_file(password_file)
        key = "spark.driver.extraClassPath"  # the system class loader's, which HiveConf uses
        settings[key] = os.pathsep.join(p for p in (settings.get(key), str(jar())) if p)
    for variable in ENV_OVERRIDES:
        os.environ.pop(variable, None)  # before the JVM starts: it would read them
    lake = open_lake(lake_dir, master=master, metastore_uri=metastore_uri, conf=settings)
    lake.spark.sparkContext.setLogLevel("ERROR")
    try:
        return serve(lake, port, out=out, err=err, password_file=checked)
    finally:
        _stop_quietly(lake.spark.stop)


def _stop_quietly(stop: Callable[[], object]) -> None:
    """Stop something in the JVM, which may be gone already: a SIGTERM sent to the whole
    process group (as `kill -- -PGID` or `timeout` send it) ends the JVM too, and then there
    is nothing left to stop."""
    from py4j.protocol import Py4JError

    with contextlib.suppress(Py4JError, OSError):
        stop()
