"""`changelake metastore --lake DIR`: the lake's Derby metastore served to many processes.

Embedded Derby admits one JVM, so concurrent commands (an ingest while someone queries, a reader
during compaction) go through a Hive metastore service over the same Derby database that the
embedded mode uses (`LAKE/metastore/metastore_db`): run this, then pass `--metastore-uri
thrift://127.0.0.1:PORT` to every command (one at a time may also go on using the embedded
mode whenever the service is stopped).

The service runs from PySpark's own jars (see ../shared/PLATFORM.md). Hive 2.3's own
`HiveMetaStore` main binds every interface; a lake's metastore has no authentication, so we
serve the same handler from a small launcher bound to loopback only (`LOOPBACK_SOURCE`, run by
Java's single-file source launcher, which needs a JDK; with only a JRE the stock main is used
and a warning says that it listens on all interfaces).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from changelake.errors import LakeError
from changelake.spark.session import check_java

DEFAULT_PORT = 9083
HOST = "127.0.0.1"

LOOPBACK_SOURCE = """\
import java.net.InetSocketAddress;
import org.apache.hadoop.hive.conf.HiveConf;
import org.apache.hadoop.hive.metastore.HiveMetaStore;
import org.apache.hadoop.hive.metastore.api.ThriftHiveMetastore;
import org.apache.thrift.protocol.TBinaryProtocol;
import org.apache.thrift.server.TThreadPoolServer;
import org.apache.thrift.transport.TServerSocket;
import org.apache.thrift.transport.TTransportFactory;

public class LoopbackMetastore {
    public static void main(String[] args) throws Exception {
        String host = args[0];
        int port = Integer.parseInt(args[1]);
        HiveConf conf = new HiveConf(HiveMetaStore.HMSHandler.class);
        ThriftHiveMetastore.Iface handler =
            HiveMetaStore.newRetryingHMSHandler("changelake", conf, false);
        TServerSocket socket = new TServerSocket(new InetSocketAddress(host, port));
        TThreadPoolServer.Args serverArgs = new TThreadPoolServer.Args(socket)
            .processor(new ThriftHiveMetastore.Processor<ThriftHiveMetastore.Iface>(handler))
            .protocolFactory(new TBinaryProtocol.Factory())
            .transportFactory(new TTransportFactory())
            .minWorkerThreads(2)
            .maxWorkerThreads(64);
        System.out.println("changelake metastore listening on " + host + ":" + port);
        System.out.flush();
        new TThreadPoolServer(serverArgs).serve();
    }
}
"""


def spark_jars() -> Path:
    import pyspark

    home = os.environ.get("SPARK_HOME")
    jars = Path(home) / "jars" if home else Path(pyspark.__file__).parent / "jars"
    if not jars.is_dir():
        raise LakeError(f"no Spark jars at {jars}; is PySpark installed?")
    return jars


def hive_site(lake: Path) -> str:
    db = lake / "metastore" / "metastore_db"
    props = {
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={db};create=true",
        "hive.metastore.warehouse.dir": str(lake / "warehouse"),
        "datanucleus.schema.autoCreateAll": "true",
        "hive.metastore.schema.verification": "false",
    }
    body = "\n".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>"
        for k, v in props.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{body}\n</configuration>\n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def command(lake: Path, port: int) -> list[str]:
    """The java command line serving `lake`'s metastore on loopback `port`."""
    lake = lake.resolve()
    conf = lake / "metastore" / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (lake / "warehouse").mkdir(parents=True, exist_ok=True)
    (conf / "hive-site.xml").write_text(hive_site(lake))
    java = check_java()
    classpath = f"{conf}{os.pathsep}{spark_jars()}/*"
    base = [java,
            "-Dlog4j2.contextSelector="
            "org.apache.logging.log4j.core.selector.ClassLoaderContextSelector",
            f"-Dderby.system.home={lake / 'metastore'}", "-Xmx512m", "-cp", classpath]
    javac = Path(java).resolve().parent / "javac"
    if javac.exists():
        source = conf / "LoopbackMetastore.java"
        source.write_text(LOOPBACK_SOURCE)
        return [*base, str(source), HOST, str(port)]
    print("warning: no JDK found; the Hive metastore service listens on all interfaces",
          file=sys.stderr)
    return [*base, "org.apache.hadoop.hive.metastore.HiveMetaStore", "-p", str(port)]


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
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> MetastoreService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_listening(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise LakeError(f"the metastore service exited with status {process.returncode}:"
                            f" {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}"
                            f" (log: {log})")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.3)
    raise LakeError(f"the metastore service did not listen on port {port} within {timeout:.0f}"
                    f" s (log: {log})")


def start(lake: Path | str, port: int | None = None, *, timeout: float = 180.0
          ) -> MetastoreService:
    """Start the service in the background and wait until it accepts connections.

    Nothing else may hold the lake's embedded Derby meanwhile (one JVM per database).
    """
    lake = Path(lake).resolve()
    port = port or free_port()
    log = lake / "metastore" / "service.log"
    cmd = command(lake, port)
    with open(log, "ab") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=lake / "metastore")
    service = MetastoreService(process, port, log)
    try:
        wait_listening(port, process, log, timeout)
    except BaseException:
        service.stop()
        raise
    return service


def serve(lake: Path | str, port: int = DEFAULT_PORT) -> int:
    """Run the service in the foreground (the CLI's `changelake metastore`); returns the exit
    status. Output goes to the terminal."""
    lake = Path(lake).resolve()
    cmd = command(lake, port)
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).exists():
        raise LakeError(f"java not found: {cmd[0]}")
    process = subprocess.Popen(cmd, cwd=lake / "metastore")
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait()
