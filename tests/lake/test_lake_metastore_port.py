"""`changelake metastore`: where it listens. `--port` on a port something already listens on:
one line naming the address and what to do, exit status 2, before the JVM starts or anything
is made under the lake (it was an internal error, the JVM's reason only in its log). And it
listens on 127.0.0.1 only."""

from __future__ import annotations

import socket

from click.testing import CliRunner

from changelake.cli import main


def test_a_port_in_use_is_named(tmp_path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["metastore", "--lake", str(lake), "--port",
                                           str(port)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"changelake: error: cannot serve the metastore on 127.0.0.1:{port}")
    assert "--port" in line
    assert list(lake.iterdir()) == []


def test_the_service_listens_on_loopback_only(tmp_path) -> None:
    """It has no authentication (Hive's metastore protocol has no password mode, README):
    the one protection is that no other interface reaches it. The kernel's own table of
    listening sockets says where it listens (in the slow tier, `test_lake_processes` checks
    it too, under load)."""
    from changelake.lake import metastore
    from tests.lake.test_lake_processes import listen_addresses

    with metastore.start(tmp_path / "lake") as service:
        assert listen_addresses(service.port) == {"127.0.0.1"}
