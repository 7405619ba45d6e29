"""The embedded PostgreSQL in a folder whose name a shell would read: a space, `$(...)` and
backquotes. pg_ctl starts the server through `/bin/sh -c`; no part of the name may run, and
the server must start there (`demo --workdir '/tmp/a b'`), or, where it would run a copy of
the binaries from that folder (its account cannot read the installed ones), be refused in one
line before anything runs."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import psycopg2
import pytest

from changelake.capture.postgres import server as pg_server
from changelake.capture.postgres.server import EmbeddedPostgres, ServerError


def _copies_binaries(server: EmbeddedPostgres) -> bool:
    """Whether `server` would run a copy of the installed binaries in its folder: it runs as
    another account (as root), and that account cannot read them where they are installed."""
    binaries = pg_server.wheel_binaries(server.version) / "postgres"
    return server.account.name is not None and not pg_server._reachable_by_others(binaries)


def test_a_folder_name_with_shell_syntax_starts_the_server_and_runs_nothing() -> None:
    # not under pytest's private (mode 700) root: as root, the server's account must reach it
    root = Path(tempfile.mkdtemp(prefix="changelake-test-pgpath-"))
    root.chmod(0o777)  # so that a `touch` run as the server's account would succeed
    folder = root / "a b $(touch PLANTED) `touch PLANTED2`"
    server = EmbeddedPostgres(folder)
    try:
        if _copies_binaries(server):
            # The server's account cannot read the installed binaries (a clone in a private
            # folder, run as root): their copy would go in this folder, whose name the shell
            # would read, so the start is refused, naming the folder, before anything runs.
            with pytest.raises(ServerError, match=re.escape(f"{folder}: the account")):
                server.start()
            assert sorted(p.name for p in root.rglob("PLANTED*")) == []
            assert [p for p in ("PLANTED", "PLANTED2") if os.path.exists(p)] == []
            return
        server.start()
        conn = psycopg2.connect(server.dsn)
        with conn, conn.cursor() as cursor:
            cursor.execute("SHOW data_directory")
            assert cursor.fetchone()[0] == str(folder / "data")
        conn.close()
        server.stop()
        server.start()  # a second start, of the cluster the first made
        server.stop()
        made = sorted(p.name for p in root.rglob("PLANTED*"))
        cwd_made = [p for p in ("PLANTED", "PLANTED2") if os.path.exists(p)]
        assert made == [] and cwd_made == []
        assert (folder / "server.log").is_file()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
