"""A real Apache Kafka broker on 127.0.0.1: one node, broker and controller in one JVM (KRaft),
for the tests and the demo.

Why one module of over 500 lines: the broker's jars, its settings and its process are one life
(fetch, start, kill, restart).

librdkafka's mock cluster (`cluster.MockCluster`) serves the Kafka protocol in-process, but it
is not a broker: it has no read-committed isolation, no log cleaner (compaction, retention),
no restart, no security. `KafkaBroker` runs Apache Kafka itself, from Maven Central's jars
(`kafka_2.13` and its runtime dependencies, `KAFKA_VERSION`), which `scripts/install.sh`
copies once into this Python environment (`jar_folder()`, beside Delta Lake's jars) with
`mvn dependency:copy-dependencies` on `jvm/kafka-broker/pom.xml` (`fetch_jars`).

What it promises:

* `start()` formats its storage the first time (`kafka.tools.StorageTool format`), starts the
  JVM (`kafka.Kafka server.properties`) and returns once the broker answers a metadata request
  with itself registered; `bootstrap` is then its PLAINTEXT address, `127.0.0.1:PORT`.
* Everything it writes is in one folder of this user's (mode 0700, `private.private_folder`):
  `server.properties`, the log4j2 configuration, the data (`data/`) and the JVM's output,
  `broker.log`. A start that fails raises `BrokerError` in one line naming that log, and the
  folder is kept for it to be read (one the broker made too).
* `stop()` asks the broker to shut down (SIGTERM: a clean shutdown, its logs flushed and
  closed), `kill()` kills it (SIGKILL); `start()` again runs it on the same folder, data and
  ports: a broker restart, as clients see it (connections refused, then the same address back).
* `die_with_parent`: the JVM is killed when the thread that started it ends (Linux), so a
  test run killed outright leaves no broker behind.
* Settings of a test broker: replication factor 1 and min ISR 1 for the offsets and
  transaction-state topics (one partition each), no initial rebalance delay, a small heap, the
  log cleaner and retention checked every `check_interval_ms` (Kafka's defaults are minutes),
  and any `settings` given (broker settings, Kafka's names), which win.
* With `sasl_users` (name -> password), a second listener, SASL_PLAINTEXT with the PLAIN and
  SCRAM-SHA-512 mechanisms, which accepts exactly those users: `sasl_bootstrap` is its
  address (their SCRAM credentials are added through the Admin API at the first start). The
  PLAINTEXT listener stays open beside it (no authorizer, no ACLs): a broker to test clients'
  security settings against, not a secure broker.
* `create_topic`, `delete_topic`, `delete_records`: the Admin API's, on the PLAINTEXT listener,
  the same calls as `MockCluster`'s (so a test can take either).

Its JVM maps the class archive the setup made (`make_archive`, `ARCHIVE_NAME`) where there
is one: a start in about half the time.

What it does not do: more than one node (no replication, no leader election, no ISR shrink);
SSL listeners; run anywhere but 127.0.0.1; outlive its owner: `close()` (the `with`
block's end) kills the JVM and, for a folder it made itself, removes the folder. Without
`die_with_parent`, an owner killed before that leaves a JVM behind, which `broker.pid` in the
folder names.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from changelake.kafka.errors import TopicError
from changelake.private import open_private, private_folder

KAFKA_VERSION = "4.4.0"
"""Apache Kafka's release the broker runs: `kafka_2.13` in `jvm/kafka-broker/pom.xml`
(Kafka 4 brokers run in KRaft mode only, on Java 17 or later)."""

MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
"""`kafka-storage.sh`'s class in Kafka 4 (`kafka_2.13`'s jar)."""

JVM_OPTIONS = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
               "-Djava.awt.headless=true", "-XX:-UsePerfData")
"""A broker of tests on 2 cores: one GC thread, the quick compiler only (seconds off the start,
and a test broker is never CPU-bound), no perf-data file in /tmp."""

ARCHIVE_NAME = "kafka-classes.jsa"
"""The broker's class archive in `jar_folder()` (HotSpot's class-data sharing, as
`spark.class_archive` does for Spark): the classes a broker loads, parsed and verified once
by `make_archive`'s training run; each later JVM maps them (a start in half the time on 2
loaded cores). A JVM that cannot use it (another Java build, other jars) starts without it."""

POM = Path("jvm") / "kafka-broker" / "pom.xml"
"""The pom `fetch_jars` copies the dependencies of, relative to a checkout's root."""


class BrokerError(TopicError):
    """A Kafka broker that cannot be started here (no jars, no Java, or it failed to start)."""


def jar_folder() -> Path:
    """Where this environment keeps the broker's jars: one folder a Kafka release, under the
    environment's jar folder (`spark.maven.jar_dir()`'s `share/changelake/jars`)."""
    return Path(sys.prefix) / "share" / "changelake" / "jars" / f"kafka-{KAFKA_VERSION}"


def jars_present(target: Path | None = None) -> bool:
    """Whether `fetch_jars` completed in `target` (default `jar_folder()`): it writes
    `.complete` last."""
    return ((jar_folder() if target is None else target) / ".complete").is_file()


def fetch_jars(pom: Path, repository: str | None = None, *, mvn: str = "mvn",
               target: Path | None = None) -> Path:
    """Copy the broker's jars (the runtime dependencies of `pom`) into `target` (default
    `jar_folder()`) with Maven, unless they are there already (then Maven is not needed);
    `repository` (default `CHANGELAKE_MAVEN_REPO`, else Maven Central) is the repository Maven
    resolves them from. A `BrokerError` in one line when Maven is missing or fails (its output
    is kept in a file the message names)."""
    target = jar_folder() if target is None else target
    if jars_present(target):
        return target
    found = shutil.which(mvn)
    if found is None:
        raise BrokerError(f"Maven (`{mvn}`) is required to fetch Apache Kafka's jars and was "
                          "not found on PATH (Debian/Ubuntu: apt-get install maven)")
    from changelake.spark.maven import CENTRAL, REPOSITORY_ENV

    repository = repository or os.environ.get(REPOSITORY_ENV) or CENTRAL
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    log = target.parent / f"{target.name}-mvn.log"
    with open(log, "w") as out:
        done = subprocess.run(
            [found, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={work}",
             f"-Dmaven.repo={repository}"],
            stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        from changelake.redact import redact

        raise BrokerError(f"Maven could not fetch Apache Kafka {KAFKA_VERSION}'s jars from "
                          f"{redact(repository)} (set {REPOSITORY_ENV} to a reachable Maven "
                          f"repository); Maven's output: {log}")
    (work / ".complete").write_text(f"kafka {KAFKA_VERSION}\n")
    work.chmod(0o755)  # mkdtemp made it 0700; the jars are no secret
    try:
        os.rename(work, target)
    except OSError:  # another install finished first
        shutil.rmtree(work, ignore_errors=True)
    log.unlink(missing_ok=True)
    return target


def archive_path() -> Path:
    return jar_folder() / ARCHIVE_NAME


def make_archive() -> Path | None:
    """The class archive, made now by a training run (a broker started, a topic made, stopped
    cleanly: the JVM writes the archive as it exits) unless it is there; None if the run did
    not leave one (the broker then starts without it)."""
    target = archive_path()
    if target.is_file():
        return target
    work = target.with_name(f".{target.name}-{os.getpid()}")
    with KafkaBroker(archive=work) as broker:
        broker.create_topic("training", 2)
        broker.stop(timeout=120)  # a clean exit: the JVM writes the archive then
    if not work.is_file():
        return None
    os.replace(work, target)
    return target


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerError("the Kafka broker needs Java 17 or later, and no `java` was found on "
                          "PATH or in JAVA_HOME")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on now (all bound at once,
    then let go)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def _cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64, as `kafka-storage random-uuid`,
    and, as Kafka's `Uuid.randomUuid`, never one starting with "-": `kafka-storage format -t`
    would take it for an option and refuse to format (one id in 64)."""
    while (text := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode())[0] == "-":
        pass
    return text


LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.config.name = org.apache.kafka.common.config
logger.config.level = WARN
"""
"""The broker's log4j2 configuration: everything to stdout (the JVM's output is `broker.log`),
without the pages of settings each component prints at start."""


class KafkaBroker:
    """One Apache Kafka node (broker and controller) in `folder` (a new temporary folder if
    None, removed by `close()`), on 127.0.0.1 at free ports chosen once. See the module's
    docstring for what it promises."""

    def __init__(self, folder: Path | None = None, *,
                 sasl_users: Mapping[str, str] | None = None,
                 heap: str = "512m", check_interval_ms: int = 1000,
                 settings: Mapping[str, str] | None = None,
                 start_timeout: float = 90.0, die_with_parent: bool = False,
                 archive: Path | None = None) -> None:
        for name, password in (sasl_users or {}).items():
            if not re.fullmatch(r"[\w.\-]+", name) or not password \
                    or any(c in password for c in '"\\\n\r'):
                raise ValueError("a SASL user's name is letters, digits, '_', '.' or '-'; its "
                                 "password non-empty, without quotes, backslashes or line "
                                 "breaks")
        self._owns_folder = folder is None
        if folder is None:
            folder = Path(tempfile.mkdtemp(prefix="changelake-kafka-"))
        self.folder = private_folder(Path(folder))
        self.sasl_users = dict(sasl_users or {})
        self.heap = heap
        self.check_interval_ms = check_interval_ms
        self.settings = dict(settings or {})
        self.start_timeout = start_timeout
        self.die_with_parent = die_with_parent
        self._training = archive  # make_archive's run: the archive the JVM writes at exit
        ports = free_ports(3 if self.sasl_users else 2)
        self.port, self.controller_port = ports[0], ports[1]
        self.sasl_port = ports[2] if self.sasl_users else None
        self._process: subprocess.Popen[bytes] | None = None
        self._admin: object | None = None

    @property
    def bootstrap(self) -> str:
        """The PLAINTEXT listener's address, for any client."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str | None:
        """The SASL_PLAINTEXT (PLAIN) listener's address, or None without `sasl_users`."""
        return None if self.sasl_port is None else f"127.0.0.1:{self.sasl_port}"

    @property
    def log_path(self) -> Path:
        """The JVM's output: the broker's log."""
        return self.folder / "broker.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def properties(self) -> dict[str, str]:
        """The broker's `server.properties`, as written."""
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        out = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.folder / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "log.initial.task.delay.ms": "0",
            # A restarted broker registers again once the controller let its last session go.
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "2000",
            "log.retention.check.interval.ms": str(self.check_interval_ms),
            "log.cleaner.backoff.ms": str(self.check_interval_ms),
            "log.segment.delete.delay.ms": str(self.check_interval_ms),
            "file.delete.delay.ms": str(self.check_interval_ms),
        }
        if self.sasl_port is not None:
            listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}")
            protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
            users = " ".join(f'user_{name}="{password}"'
                             for name, password in self.sasl_users.items())
            out["sasl.enabled.mechanisms"] = "PLAIN,SCRAM-SHA-512"
            out["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};")
            out["listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        out["listeners"] = ",".join([*listeners,
                                     f"CONTROLLER://127.0.0.1:{self.controller_port}"])
        out["advertised.listeners"] = ",".join(listeners)
        out["listener.security.protocol.map"] = ",".join(protocols)
        out.update(self.settings)
        return out

    def _write_config(self) -> Path:
        path = self.folder / "server.properties"
        lines = [f"{key}={_escape(value)}" for key, value in self.properties().items()]
        _write_private(path, "\n".join(lines) + "\n")
        _write_private(self.folder / "log4j2.properties", LOG4J2)
        return path

    def _command(self, main: str, *arguments: str) -> list[str]:
        if not jars_present():
            raise BrokerError(f"Apache Kafka's jars are not in {jar_folder()}: run "
                              "scripts/install.sh (it needs Maven and access to Maven Central)")
        if self._training is not None:
            sharing = [f"-XX:ArchiveClassesAtExit={self._training}"] if main == MAIN_CLASS \
                else []
        else:
            archive = archive_path()
            sharing = [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds=off",
                       "-Xlog:cds+dynamic=off"] if archive.is_file() else []
        return [_java(), f"-Xmx{self.heap}", *JVM_OPTIONS, *sharing,
                f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.folder / 'logs'}",
                "-cp", f"{jar_folder()}/*", main, *arguments]

    def _format(self, config: Path) -> None:
        if (self.folder / "data" / "meta.properties").exists():
            return
        with self._log() as log:
            done = subprocess.run(
                self._command(STORAGE_TOOL, "format", "-t", _cluster_id(), "-c", str(config)),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            raise BrokerError(f"Kafka could not format its storage in {self.folder / 'data'} "
                              f"(exit {done.returncode}); its log: {self.log_path}")

    def _log(self) -> contextlib.AbstractContextManager:
        return os.fdopen(open_private(self.log_path), "ab")

    def start(self) -> KafkaBroker:
        """Start the broker (formatting its storage the first time) and wait until it answers;
        nothing if it runs."""
        if self.running:
            return self
        config = self._write_config()
        self._format(config)
        with self._log() as log:
            self._process = subprocess.Popen(
                self._command(MAIN_CLASS, str(config)), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None)
        _write_private(self.folder / "broker.pid", f"{self._process.pid}\n")
        try:
            self._wait_ready()
            self._add_scram_users()
        except BaseException:
            self.kill()
            raise
        return self

    def _add_scram_users(self) -> None:
        """The SASL users' SCRAM-SHA-512 credentials, once (the cluster's metadata keeps them
        across restarts)."""
        marker = self.folder / "scram-users"
        if not self.sasl_users or marker.exists():
            return
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        upserts = [UserScramCredentialUpsertion(name, info, password.encode())
                   for name, password in self.sasl_users.items()]
        self._await(self.admin().alter_user_scram_credentials(upserts),  # type: ignore
                    "add the SASL users' SCRAM credentials")
        _write_private(marker, "\n".join(self.sasl_users) + "\n")

    def _wait_ready(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.start_timeout
        process = self._process
        assert process is not None
        while True:
            if process.poll() is not None:
                raise BrokerError(f"the Kafka broker exited at start (status "
                                  f"{process.returncode}); its log: {self.log_path}")
            if time.monotonic() > deadline:
                raise BrokerError(f"the Kafka broker did not answer within "
                                  f"{self.start_timeout:g} s; its log: {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        while True:
            with contextlib.suppress(Exception):
                if admin.list_topics(timeout=2).brokers:
                    return
            if process.poll() is not None or time.monotonic() > deadline:
                raise BrokerError(f"the Kafka broker did not answer within "
                                  f"{self.start_timeout:g} s; its log: {self.log_path}")
            time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM), waited for; SIGKILL after `timeout` seconds."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._process = None

    def kill(self) -> None:
        """Kill the broker's JVM (SIGKILL), as a crash would; `start()` runs it again."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        process.wait()
        self._process = None

    def close(self) -> None:
        """Kill the broker and remove its folder if this broker made it."""
        self.kill()
        if self._owns_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        try:
            return self.start()
        except BrokerError:
            self.kill()  # the folder stays, even one it made: the error names its log
            raise
        except BaseException:
            self.close()
            raise

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- the Admin API, as MockCluster's calls -------------------------------------------------

    def admin(self) -> object:
        """An AdminClient of the PLAINTEXT listener (one, kept: a client dropped while its
        requests are out fails them)."""
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        return self._admin

    def create_topic(self, name: str, partitions: int = 1, replication: int = 1,
                     config: Mapping[str, str] | None = None) -> None:
        """A topic of `partitions` partitions (replication is always 1 here), with topic
        settings `config` (`cleanup.policy`, `retention.ms`, ...). A topic of that name being
        deleted (`delete_topic` just now) is waited for."""
        from confluent_kafka import KafkaError
        from confluent_kafka.admin import NewTopic

        topic = NewTopic(name, num_partitions=partitions, replication_factor=1,
                         config=dict(config or {}))
        deadline = time.monotonic() + 30
        while True:
            try:
                self._await(self.admin().create_topics([topic]),  # type: ignore[attr-defined]
                            f"create topic {name!r}")
                return
            except TopicError as error:
                code = getattr(error, "code", None)
                if code != KafkaError.TOPIC_ALREADY_EXISTS or time.monotonic() > deadline:
                    raise
                if name not in self._topics():
                    time.sleep(0.2)  # the deletion is not finished
                    continue
                raise

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its records, waiting until the metadata no longer names it;
        `create_topic` may make it again, its offsets starting at 0."""
        self._await(self.admin().delete_topics([name]),  # type: ignore[attr-defined]
                    f"delete topic {name!r}")
        deadline = time.monotonic() + 30
        while name in self._topics() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _topics(self) -> set[str]:
        return set(self.admin().list_topics(timeout=30).topics)  # type: ignore[attr-defined]

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """The Admin API's DeleteRecords: the partition's first offset becomes `before`."""
        from confluent_kafka import TopicPartition

        admin = self.admin()
        self._await(admin.delete_records(  # type: ignore[attr-defined]
                        [TopicPartition(topic, partition, before)]),
                    f"delete the records of topic {topic!r} partition {partition} before "
                    f"offset {before}")

    @staticmethod
    def _await(futures: Mapping[object, object], what: str) -> None:
        from confluent_kafka import KafkaException

        from changelake.kafka.client import describe

        for future in futures.values():
            try:
                future.result(30)  # type: ignore[attr-defined]
            except Exception as error:  # KafkaException, or a bad argument's
                failure = TopicError(f"cannot {what}: {describe(error)}")
                kafka_error = error.args[0] if isinstance(error, KafkaException) and \
                    error.args else None
                failure.code = getattr(kafka_error, "code", lambda: None)()  # type: ignore
                raise failure from None


def _die_with_parent() -> None:
    """In the child, before `exec`: SIGKILL when the thread that started it ends (Linux's
    PR_SET_PDEATHSIG), so that a test run killed outright leaves no broker behind."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _escape(value: str) -> str:
    """A value for a Java properties file (`=`, `:` and spaces inside are fine after the
    first `=`; backslashes are escapes)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _write_private(path: Path, text: str) -> None:
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def main(argv: list[str] | None = None) -> int:
    """`python -m changelake.kafka.broker [POM]`: fetch the broker's jars and make its class
    archive (scripts/install.sh); each only if missing."""
    arguments = sys.argv[1:] if argv is None else argv
    pom = Path(arguments[0]) if arguments else POM
    try:
        folder = fetch_jars(pom)
    except BrokerError as error:
        print(f"changelake setup: {error}", file=sys.stderr)
        return 1
    print(f"changelake setup: Apache Kafka {KAFKA_VERSION}'s jars in {folder}")
    try:
        made = make_archive()
    except TopicError as error:  # no archive: every broker starts, only slower
        made = None
        print(f"changelake setup: warning: no class archive for the Kafka broker: {error}",
              file=sys.stderr)
    if made is not None:
        print(f"changelake setup: the Kafka broker's class archive: {made}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
