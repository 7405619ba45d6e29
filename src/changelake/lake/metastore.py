"""`changelake metastore --lake DIR`: the lake's Derby metastore served to many processes.

Embedded Derby admits one JVM, so concurrent commands (an ingest while someone queries, a reader
during compaction) go through a Hive metastore service over the same Derby database that the
embedded mode uses (`LAKE/metastore/metastore_db`): run this, then pass `--metastore-uri
thrift://127.0.0.1:PORT` to every command (one at a time may also go on using the embedded
mode whenever the service is stopped).

The promise: the service listens on 127.0.0.1 only, with whatever Java 17+ is installed (a JRE
is enough), and says so when it starts. A lake's metastore has no authentication, so it must
never be reachable from another host. Hive 2.3's own `HiveMetaStore` main binds every
interface and has no setting to change that, so we assemble the same Thrift server ourselves,
bound to loopback: the handler, processor and server are Hive's and Thrift's classes from
PySpark's own jars, created through PySpark's JVM gateway (py4j), so no Java source is compiled
and no JDK is needed.

The serving process is a Python process holding that JVM: the JVM exits when the Python side
goes away (PySpark's gateway watches its standard input), and `MetastoreService.stop` ends the
whole process group, so a stopped service never keeps Derby locked.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from changelake.errors import LakeError
from changelake.spark.session import check_java, java_property

DEFAULT_PORT = 9083
HOST = "127.0.0.1"
LISTENING = "changelake metastore listening on {host}:{port} (loopback only)"


def hive_settings(lake: Path) -> dict[str, str]:
    """The metastore's configuration: the lake's Derby database and warehouse."""
    db = lake / "metastore" / "metastore_db"
    return {
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={db};create=true",
        "hive.metastore.warehouse.dir": str(lake / "warehouse"),
        "datanucleus.schema.autoCreateAll": "true",
        "hive.metastore.schema.verification": "false",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def check_port(port: int) -> None:
    """Refuse a port something already listens on (another metastore, most likely), in one
    line: the JVM's refusal came back as an internal error, its reason in the JVM's log. Bound
    as the JVM's server socket binds it (address reuse on: a port whose last connection is
    in TIME_WAIT is free)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as error:
            raise LakeError(f"cannot serve the metastore on {HOST}:{port}: {error.strerror} "
                            "(another metastore of this or another lake? stop it, or pass "
                            "another --port)") from None


def loopback_server(lake: Path, port: int) -> tuple[Any, Any]:
    """(gateway, Thrift server) serving `lake`'s metastore on HOST:`port`, not yet serving.

    The JVM is PySpark's gateway JVM (PySpark's jars on its class path, Derby's home in the
    lake's metastore directory, so its `derby.log` lands there and not in the working
    directory)."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    check_java()
    home = lake / "metastore"
    home.mkdir(parents=True, exist_ok=True)
    (lake / "warehouse").mkdir(parents=True, exist_ok=True)
    conf = SparkConf().set("spark.driver.extraJavaOptions",
                           java_property("derby.system.home", str(home))) \
        .set("spark.driver.memory", "512m").set("spark.driver.bindAddress", HOST) \
        .set("spark.driver.host", HOST)
    gateway = launch_gateway(conf)
    jvm = gateway.jvm
    hive_conf = jvm.org.apache.hadoop.hive.conf.HiveConf()
    for key, value in hive_settings(lake).items():
        hive_conf.set(key, value)
    handler = jvm.org.apache.hadoop.hive.metastore.HiveMetaStore.newRetryingHMSHandler(
        "changelake", hive_conf, False)
    processor = getattr(
        jvm, "org.apache.hadoop.hive.metastore.api.ThriftHiveMetastore$Processor")(handler)
    server_socket = jvm.org.apache.thrift.transport.TServerSocket(
        jvm.java.net.InetSocketAddress(HOST, port))
    args = (jvm.org.apache.thrift.server.TThreadPoolServer.Args(server_socket)
            .processor(processor)
            .protocolFactory(jvm.org.apache.thrift.protocol.TBinaryProtocol.Factory())
            .minWorkerThreads(2).maxWorkerThreads(64))
    return gateway, jvm.org.apache.thrift.server.TThreadPoolServer(args)


def serve(lake: Path | str, port: int = DEFAULT_PORT) -> int:
    """Serve in the foreground until interrupted (the CLI's `changelake metastore`); returns
    the exit status. Prints one line on stdout once it accepts connections."""
    lake = Path(lake).resolve()
    check_port(port)  # before the JVM starts and anything is made under the lake
    gateway, server = loopback_server(lake, port)
    signal.signal(signal.SIGTERM, _interrupt)
    print(LISTENING.format(host=HOST, port=port), flush=True)
    try:
        server.serve()  # returns once stopped
    except KeyboardInterrupt:
        server.stop()
    finally:
        gateway.shutdown()
    return 0


def _interrupt(_signum: int, _frame: object) -> None:
    """SIGTERM ends the service as Ctrl-C does: stop serving, shut the JVM down."""
    raise KeyboardInterrupt


@dataclass
class MetastoreService:
    """A running service; `uri` goes to every command's `--metastore-uri`."""

    process: subprocess.Popen
    port: int
    log: Path

    @property
    def uri(self) -> str:
        return f"thrift://{HOST}:{self.port}"

    def stop(self) -> None:
        """End the service and its JVM (the whole process group), and wait for both."""
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                _signal_group(self.process, signal.SIGKILL)
                self.process.wait()
        _signal_group(self.process, signal.SIGKILL)  # a JVM left behind, if any
        deadline = time.monotonic() + 20
        while _listening(self.port) and time.monotonic() < deadline:
            time.sleep(0.2)

    def __enter__(self) -> MetastoreService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def wait_listening(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise LakeError(f"the metastore service exited with status {process.returncode}:"
                            f" {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}"
                            f" (log: {log})")
        if _listening(port):
            return
        time.sleep(0.3)
    raise LakeError(f"the metastore service did not listen on port {port} within {timeout:.0f}"
                    f" s (log: {log})")


def start(lake: Path | str, port: int | None = None, *, timeout: float = 180.0
          ) -> MetastoreService:
    """Start the service in the background (its own process group) and wait until it accepts
    connections. Nothing else may hold the lake's embedded Derby meanwhile."""
    lake = Path(lake).resolve()
    port = port or free_port()
    log = lake / "metastore" / "service.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "changelake.lake.metastore", "--lake", str(lake),
           "--port", str(port)]
    with open(log, "ab") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=lake / "metastore",
                                   start_new_session=True)
    service = MetastoreService(process, port, log)
    try:
        wait_listening(port, process, log, timeout)
    except BaseException:
        service.stop()
        raise
    return service


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m changelake.lake.metastore --lake DIR --port P`: what `start` runs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", required=True, type=Path)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    return serve(args.lake, args.port)


if __name__ == "__main__":
    sys.exit(main())
