"""A capture's password from where libpq looks for one (issue 67, README): `PGPASSWORD`, a
password file (`PGPASSFILE`) or a service (`PGSERVICE` and its service file), so that it is
in neither `ps` output nor `--dsn`. Against a server of this module's own that asks a role for
its password (scram-sha-256, for its sessions and its replication connections alike): the
capture runs (`--out`, no Spark) with each, and without any it is one error line.

The session's server (`conftest.postgres`) trusts every local connection: a password there
would prove nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from changelake.capture.postgres.server import EmbeddedPostgres
from tests.support.pg_workload import CLI

ROLE, PASSWORD, DATABASE = "secretive", "s3cret pw", "guarded"


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="changelake-test-pg-password-"))
    started = EmbeddedPostgres(root).start()
    admin = psycopg2.connect(started.dsn)
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute(f"CREATE ROLE {ROLE} LOGIN REPLICATION PASSWORD %s", (PASSWORD,))
        c.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
    hba = started.data / "pg_hba.conf"
    # First lines win: this role's connections need its password; the others stay trusted.
    hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n"
                   f"host replication {ROLE} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    with admin.cursor() as c:
        c.execute("SELECT pg_reload_conf()")
    admin.close()
    owner = psycopg2.connect(started.dsn_for(DATABASE).replace("user=postgres", f"user={ROLE}"),
                             password=PASSWORD)
    owner.autocommit = True
    with owner.cursor() as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, s text)")
        c.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        c.execute("CREATE PUBLICATION p FOR TABLE t")
    owner.close()
    yield started
    started.stop()
    shutil.rmtree(root, ignore_errors=True)


def capture(server: EmbeddedPostgres, out: Path, dsn: str, slot: str,
            env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.run([*CLI, "--out", str(out), "--dsn", dsn, "--publication", "p",
                           "--slot", slot, "--create-slot", "--until-idle", "0.5"],
                          capture_output=True, text=True, timeout=300, env={**clean, **env})


def test_without_a_password_the_server_refuses_in_one_line(server: EmbeddedPostgres,
                                                           tmp_path: Path) -> None:
    done = capture(server, tmp_path / "out", f"host=127.0.0.1 port={server.port} user={ROLE} "
                   f"dbname={DATABASE}", "none", {})
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("changelake: error: cannot connect to PostgreSQL (host=127.0.0.1 "), line
    assert "password" in line


@pytest.mark.parametrize("source", ["PGPASSWORD", "PGPASSFILE", "PGSERVICE"])
def test_the_password_comes_from_the_environment(server: EmbeddedPostgres, tmp_path: Path,
                                                 source: str) -> None:
    dsn = f"host=127.0.0.1 port={server.port} user={ROLE} dbname={DATABASE}"
    if source == "PGPASSWORD":
        env = {"PGPASSWORD": PASSWORD}
    elif source == "PGPASSFILE":
        passfile = tmp_path / "pgpass"
        passfile.write_text(f"127.0.0.1:{server.port}:*:{ROLE}:{PASSWORD}\n")
        passfile.chmod(0o600)  # libpq ignores a password file others may read
        env = {"PGPASSFILE": str(passfile)}
    else:
        services = tmp_path / "pg_service.conf"
        services.write_text(f"[lake]\nhost=127.0.0.1\nport={server.port}\nuser={ROLE}\n"
                            f"dbname={DATABASE}\npassword={PASSWORD}\n")
        env = {"PGSERVICE": "lake", "PGSERVICEFILE": str(services)}
        dsn = "application_name=changelake-test"  # all but this from the service
    slot = source.lower()
    done = capture(server, tmp_path / "out", dsn, slot, env)
    assert done.returncode == 0, done.stderr
    assert "captured 0 transactions into 1 logs under" in done.stderr
    assert PASSWORD not in done.stderr
    assert list((tmp_path / "out" / "public.t").glob("*.avro"))
    admin = psycopg2.connect(server.dsn_for(DATABASE))
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    admin.close()
