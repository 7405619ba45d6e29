"""`changelake metastore --port` on a port something already listens on: one line naming the
address and what to do, exit status 2, before the JVM starts or anything is made under the
lake (it was an internal error, the JVM's reason only in its log)."""

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
