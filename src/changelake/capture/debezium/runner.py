"""Start, stop and kill changelake's Debezium runner: Debezium's embedded engine with its
PostgreSQL connector (`pgoutput`), writing the table topics and the transaction topic to Kafka
(`jvm/debezium-runner`, built by `scripts/install.sh` into this Python environment).

The promise of the runner: nothing is acknowledged to PostgreSQL (the slot's confirmed
position, through Debezium's stored offsets) before Kafka holds it (`acks=all`, an idempotent
producer, every send of a batch checked before the batch is marked processed), and the offsets
file is replaced whole (written aside, forced, renamed). So a SIGKILL at any point, then a start
with the same `state` folder, re-sends from the last stored offsets: duplicates, never a gap;
`ingest --kafka --from debezium` absorbs the duplicates.

The DSN's password (or `PGPASSWORD`'s) goes to Debezium in a properties file only this user
can read (`private.py`), in the state folder, never on a command line; every message that
names the DSN is redacted (`redact.py`).

Here rather than in the demo: the runner is a product piece (a user points it at their own
PostgreSQL and Kafka), which the demo and the tests use like any other.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from changelake.errors import ChangelakeError
from changelake.private import open_private, private_folder
from changelake.redact import redact

MAIN_CLASS = "dev.changelake.debezium.Runner"
DEBEZIUM_VERSION = "3.6.1.Final"
"""The Debezium release the runner is built with (`jvm/debezium-runner/pom.xml`)."""


class DebeziumError(ChangelakeError):
    """The Debezium runner could not start, or stopped with an error."""


def runner_dir() -> Path:
    """Where `scripts/install.sh` puts the runner's jar and its dependencies: beside the Delta
    jars (`spark.maven.jar_dir()`), in this environment."""
    return Path(sys.prefix) / "share" / "changelake" / "debezium"


def runner_classpath() -> str:
    """The runner's Java class path, or a DebeziumError in one line saying how to build it."""
    folder = runner_dir()
    if not (folder / "debezium-runner.jar").is_file():
        raise DebeziumError(f"the Debezium runner is not built in {folder}: run "
                            "scripts/install.sh (it needs Maven: apt-get install maven)")
    return f"{folder}/*"


@dataclass(frozen=True)
class DebeziumConfig:
    """One connector: the database (`dsn`, libpq's key/value or URI form), what to capture,
    and where to write it.

    `tables`: `schema.table` names (Debezium's `table.include.list`; empty: every table the
    publication has). `publication` is made by Debezium for `tables` unless it exists
    (`publication.autocreate.mode=filtered`); `slot` is made at the first start. `schemas`:
    the JSON converter's `schemas.enable`. `partitions`: the partitions of a topic the runner
    creates (0: the broker's automatic creation). `truncates`: a `TRUNCATE` is written as a
    truncate event (op t; `skipped.operations=none`), which `ingest --kafka --from debezium`
    converts into the retraction of every row; False keeps Debezium's own default, which
    skips truncates (`skipped.operations=t`: a truncated table then keeps its rows in the
    lake). `properties`: any other Debezium property, which wins over what this class sets."""

    dsn: str
    bootstrap: str
    state: Path
    topic_prefix: str = "changelake"
    slot: str = "debezium"
    publication: str = "dbz_publication"
    tables: tuple[str, ...] = ()
    schemas: bool = True
    partitions: int = 1
    snapshot_mode: str = "initial"
    truncates: bool = True
    properties: Mapping[str, str] = field(default_factory=dict)

    def debezium_properties(self) -> dict[str, str]:
        """The properties file's contents (the password included)."""
        from psycopg2.extensions import parse_dsn

        try:
            parts = parse_dsn(self.dsn)
        except Exception as error:  # psycopg2.ProgrammingError: the DSN quoted in it
            raise DebeziumError(f"invalid DSN: {redact(str(error), known=self.dsn)}") from None
        password = parts.get("password") or os.environ.get("PGPASSWORD")
        props = {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "plugin.name": "pgoutput",
            "database.hostname": parts.get("host", "127.0.0.1"),
            "database.port": parts.get("port", "5432"),
            "database.user": parts.get("user", os.environ.get("PGUSER", "postgres")),
            "database.dbname": parts.get("dbname", "postgres"),
            "topic.prefix": self.topic_prefix,
            "slot.name": self.slot,
            "publication.name": self.publication,
            "publication.autocreate.mode": "filtered",
            "snapshot.mode": self.snapshot_mode,
            "provide.transaction.metadata": "true",
        }
        if self.truncates:
            props["skipped.operations"] = "none"
        if password:
            props["database.password"] = password
        if parts.get("sslmode"):
            props["database.sslmode"] = parts["sslmode"]
        if self.tables:
            props["table.include.list"] = ",".join(_quote_regex(t) for t in self.tables)
        props.update(self.properties)
        return props

    def command(self, java: str = "java") -> list[str]:
        """The runner's command line: no secret on it (the properties file holds them)."""
        return [java, "-cp", runner_classpath(), MAIN_CLASS,
                "--properties", str(self.state / "debezium.properties"),
                "--bootstrap", self.bootstrap, "--state", str(self.state),
                "--schemas", "true" if self.schemas else "false",
                "--partitions", str(self.partitions)]


def _quote_regex(name: str) -> str:
    """A table name as the exact regular expression Debezium's include list takes."""
    return "".join("\\" + c if c in ".^$*+?()[]{}|\\" else c for c in name)


def properties_text(props: Mapping[str, str]) -> str:
    """`props` in Java's properties-file format (read as ISO-8859-1: other characters as
    `\\uXXXX`; separators, comment marks and leading spaces escaped)."""
    def escape(text: str, key: bool) -> str:
        out = []
        for i, c in enumerate(text):
            if c == "\\":
                out.append("\\\\")
            elif c in "=:#!" or (c == " " and (key or i == 0)):
                out.append("\\" + c)
            elif c == "\n":
                out.append("\\n")
            elif c == "\r":
                out.append("\\r")
            elif c == "\t":
                out.append("\\t")
            elif ord(c) < 0x20 or ord(c) > 0x7E:
                out.extend(f"\\u{unit:04x}" for unit in _utf16(c))
            else:
                out.append(c)
        return "".join(out)

    return "".join(f"{escape(k, True)}={escape(v, False)}\n" for k, v in props.items())


def _utf16(c: str) -> list[int]:
    data = c.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


class DebeziumRunner:
    """The runner as a child process: `start()` (returns once Debezium reads the log, its
    initial snapshot read: Debezium's streaming metrics say `Connected`; the snapshot's last
    records may still be on their way to Kafka), `stop()` (SIGTERM: the batch in flight is
    finished and its offsets stored, nothing later is sent; the stored offsets are those of
    what Kafka holds), `kill()` (SIGKILL), and again `start()`, resuming from the
    same `state`. A context manager kills what is left at its end. Debezium's log goes to
    `state/debezium.log`."""

    def __init__(self, config: DebeziumConfig) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def log(self) -> Path:
        return self.config.state / "debezium.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def lines(self) -> list[str]:
        """The runner's own lines on stdout since the last start (`changelake-debezium: ...`)."""
        return list(self._lines)

    def start(self, timeout: float = 180.0) -> DebeziumRunner:
        if self.running:
            raise DebeziumError("the Debezium runner is already running")
        java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) \
            if os.environ.get("JAVA_HOME") else shutil.which("java")
        if java is None:
            raise DebeziumError("the Debezium runner needs Java 17+ (java not found)")
        state = self.config.state
        state.mkdir(parents=True, exist_ok=True)
        private_folder(state)
        props = state / "debezium.properties"
        with contextlib.suppress(FileNotFoundError):
            props.unlink()
        descriptor = open_private(props, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(descriptor, "w", encoding="ascii") as f:
            f.write(properties_text(self.config.debezium_properties()))
        self._lines = []
        with open(self.log, "ab") as err:
            err.write(f"\n--- start {time.strftime('%H:%M:%S')}\n".encode())
            err.flush()
            self.process = subprocess.Popen(
                self.config.command(java), stdout=subprocess.PIPE, stderr=err,
                stdin=subprocess.DEVNULL, start_new_session=True)
        self._reader = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while "changelake-debezium: streaming" not in self._lines:
            if self.process.poll() is not None:
                self._reader.join(5)
                raise DebeziumError(f"the Debezium runner stopped at its start "
                                    f"({self.process.returncode}): {self._tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise DebeziumError(f"the Debezium runner was not streaming after {timeout:g} "
                                    f"s: {self._tail()}")
            time.sleep(0.05)
        return self

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            self._lines.append(raw.decode(errors="replace").rstrip("\n"))

    def _tail(self, size: int = 2000) -> str:
        try:
            text = self.log.read_text(errors="replace")[-size:]
        except OSError:
            text = ""
        return redact(text, known=self.config.dsn).strip() or "(no log)"

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: the runner finishes the batch in flight (sent, acknowledged,
        its offsets stored), sends nothing after it, and stops the engine. Returns the exit
        status (0: stopped cleanly); SIGKILL after `timeout`."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._join()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, as a machine's end would: whatever the engine had not stored is re-sent
        by the next start."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._join()

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(5)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> DebeziumRunner:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.kill()
