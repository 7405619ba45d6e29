"""Several processes on one lake: kill -9 of ingest and compaction, and a reader (its own
process, through the metastore service) while another process ingests and compacts.

The workers are `tests/support/lake_worker.py`; each is a separate Python with its own Spark driver.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support.lake_history import write_parts
from tests.support.lake_roots import LAKE_ENV, on_s3
from tests.support.lake_worker import printed
from tests.support.paths import SUPPORT
from tests.support.seeding import seeded

pytestmark = pytest.mark.spark

WORKER = SUPPORT / "lake_worker.py"


class Worker:
    """A worker process whose output lines are collected as they come."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._out = threading.Thread(target=self._pump, args=(self.process.stdout, self.lines))
        self._err = threading.Thread(target=self._pump, args=(self.process.stderr, self.errors))
        self._out.start()
        self._err.start()

    @staticmethod
    def _pump(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float = 300) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(line.startswith(prefix) for line in self.lines):
                return True
            if self.process.poll() is not None:
                self._out.join(5)
                return any(line.startswith(prefix) for line in self.lines)
            time.sleep(0.05)
        return False

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._out.join(5)
        self._err.join(5)

    def result(self, timeout: float = 600) -> dict:
        self.process.wait(timeout)
        self._out.join(5)
        self._err.join(5)
        found = [line for line in self.lines if line.startswith("RESULT ")]
        assert self.process.returncode == 0 and found, (
            f"worker failed ({self.process.returncode}):\n" + "\n".join(self.errors[-40:]))
        return json.loads(found[-1][len("RESULT "):])


def kill_at(args: list[str], marker: str, rng: random.Random) -> Worker:
    """Run a worker, wait for `marker`, let it go on for a random moment, kill -9 it."""
    worker = Worker(*args)
    assert worker.wait_for(marker), "\n".join(worker.errors[-40:])
    time.sleep(rng.uniform(0, 1.5))
    worker.kill()
    return worker


def crash_and_recover(lake: Path | str, seed: int, keyed: bool, kills: list[str]) -> None:
    rng = random.Random(seed)
    args = ["run", "--lake", str(lake), "--table", f"k{uuid.uuid4().hex[:8]}.t",
            "--seed", str(seed), *(["--keyed"] if keyed else [])]
    for marker in kills:
        killed = kill_at(args, marker, rng)
        resumed = [line for line in killed.lines if line.startswith("RESUMED")]
        assert all(line.split()[1] == "true" for line in resumed), killed.lines
    final = Worker(*args)
    result = final.result()
    resumed = [line for line in final.lines if line.startswith("RESUMED")]
    # after each kill the table was readable, and equal to the truth at its frontier
    assert resumed and all(line.split()[1] == "true" for line in resumed), final.lines
    assert result == {"frontier": 30, "since": 29, "ok": True, "as_of_ok": True}


def kill_while_committing_then_compacting(lake: Path | str) -> None:
    seed = random.randrange(1000)  # a new kill point each run, printed to reproduce it
    rng = seeded(seed)
    # Killed while committing one of the first increments, then while compacting after the
    # fifth or the eighth: of the lines this seed's run prints (a history of fewer
    # increments has no `COMPACT 8`; waiting for it would wait for nothing).
    lines = printed(seed, keyed=True)
    commit = rng.choice([line for line in lines if line in {f"COMMIT {n}" for n in range(1, 6)}])
    compacting = [line for line in lines if line in ("COMPACT 5", "COMPACT 8")]
    crash_and_recover(lake, seed, keyed=True,
                      kills=[commit, rng.choice(compacting or ["COMPACT final"])])


@pytest.mark.slow  # 60-85 s: CI's default run has 20 minutes
def test_kill9_during_ingest_and_compaction_then_rerun(lake_root):
    kill_while_committing_then_compacting(lake_root)


@pytest.mark.slow
@pytest.mark.skipif(on_s3(), reason=f"{LAKE_ENV}=s3: the test above, whose S3 run makes "
                    "Delta tables unless CHANGELAKE_TABLE_FORMAT=hive")
def test_kill9_during_ingest_and_compaction_then_rerun_on_delta(tmp_path, monkeypatch):
    """As above, with the worker's table in Delta's format: killed while committing (between
    the append to `updates` and the MERGE into `current`, among other points) and while
    compacting, the re-run finds the table whole and finishes it exactly once."""
    monkeypatch.setenv("CHANGELAKE_TABLE_FORMAT", "delta")
    kill_while_committing_then_compacting(tmp_path / "lake")


@pytest.mark.slow
@pytest.mark.parametrize("case", range(1))  # one case: CI's time is shared
def test_kill9_more(lake_root, case):
    rng = random.Random(case)
    markers = [f"COMMIT {rng.randint(0, 10)}", f"COMPACT {rng.choice([2, 5, 8, 11])}",
               "COMPACT final"]
    lines = printed(100 + case, keyed=case % 2 == 0)
    assert set(markers) <= set(lines), (markers, lines)  # each kill point is one it reaches
    crash_and_recover(lake_root, 100 + case, keyed=case % 2 == 0,
                      kills=sorted(rng.sample(markers, 2), key=markers.index))


def listen_addresses(port: int) -> set[str]:
    """The local addresses of every socket listening on `port`, from the kernel's tables
    (IPv4 and IPv6; an IPv4-mapped IPv6 address is reported as its IPv4 form)."""
    import ipaddress

    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width // 2, 4))
            ip = ipaddress.ip_address(raw)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            found.add(str(ip))
    return found


@pytest.mark.slow  # about a minute: CI's default run has 20
def test_reader_in_another_process_during_ingest_and_compaction(tmp_path):
    from changelake.lake import metastore

    lake = tmp_path / "lake"
    table = f"r{uuid.uuid4().hex[:8]}.t"
    stop = tmp_path / "stop"
    with metastore.start(lake) as service:
        # The service has no authentication: it must listen on loopback only, and say so.
        assert listen_addresses(service.port) == {"127.0.0.1"}
        # The port accepts connections a moment before the service prints its line.
        said = f"listening on 127.0.0.1:{service.port} (loopback only)"
        deadline = time.monotonic() + 60
        while said not in service.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert said in service.log.read_text()
        common = ["--lake", str(lake), "--table", table, "--seed", "7", "--keyed",
                  "--metastore-uri", service.uri]
        writer = Worker("run", *common, "--compact-every", "2")
        assert writer.wait_for("COMMIT 2"), "\n".join(writer.errors[-40:])
        reader = Worker("read", *common, "--stop", str(stop))
        written = writer.result()
        stop.touch()
        read = reader.result()
    assert written["ok"] and written["as_of_ok"]
    assert read["reads"] > 0 and read["bad"] == 0, read
    assert read["versions"] >= 2, read  # the reader saw commits happen while it read


def concurrent_ingests_and_compaction(tmp_path: Path, seed: int) -> None:
    """Two processes ingest overlapping parts of one keyed Debezium feed (without
    before-images, so each conversion reads the table's current rows) into a table neither has
    created yet, while a third compacts it: the table must be one exactly-once application of
    the union, whatever the interleaving."""
    from changelake.lake import metastore
    from changelake.simulate import ORDER_COLUMNS

    feed, (p1, p2, p3) = write_parts(tmp_path, seeded(seed))
    lake = tmp_path / "lake"
    table = f"c{uuid.uuid4().hex[:8]}.orders"
    stop = tmp_path / "stop"
    with metastore.start(lake) as service:
        common = ["--lake", str(lake), "--table", table, "--seed", str(seed),
                  "--metastore-uri", service.uri]
        compactor = Worker("compact", *common, "--stop", str(stop))
        first = Worker("ingest", *common, "--inputs", p1, "--inputs", f"{p1},{p2}")
        second = Worker("ingest", *common, "--inputs", f"{p1},{p2}",
                        "--inputs", f"{p1},{p2},{p3}")
        one, two = first.result(), second.result()
        stop.touch()
        final = compactor.result()
    # every commit continued the one before it: no time range was committed twice or skipped
    commits = sorted(c[:2] for c in one["commits"] + two["commits"] if not c[3])
    assert commits[0][0] == 0, commits
    assert all(a[1] == b[0] for a, b in itertools.pairwise(commits)), commits
    assert commits[-1][1] == final["upper"], (commits, final)
    assert final["sums_ok"], final
    upper = final["upper"]
    state = next(s for t, s in reversed(feed.states) if t < upper)
    truth = [{c: row[c] for c in ORDER_COLUMNS} for _, row in sorted(state.items())]
    assert [{c: r[c] for c in ORDER_COLUMNS} for r in final["rows"]] == truth, (commits, final)


# Four JVMs at once (the service, two ingests, a compaction) take minutes on 2 busy cores: the
# default suite races threads on the shared session instead (tests/lake/test_lake_writers.py).
@pytest.mark.slow
@pytest.mark.parametrize("case", range(1))  # one case: CI's time is shared
def test_concurrent_ingests_and_compaction_in_processes(tmp_path, case):
    concurrent_ingests_and_compaction(tmp_path, 500 + case)
