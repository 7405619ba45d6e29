"""The setup's fetch of Delta Lake's jars (`spark/maven.py`), against a Maven repository
layout served over HTTP on loopback: checked by SHA-1, put in place whole, and one line (with
no password) when the repository cannot be reached or serves a jar its checksum disowns."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from changelake.errors import ChangelakeError
from changelake.spark.maven import ARTIFACTS, fetch


def layout(root: Path, *, corrupt: bool = False) -> None:
    """Every artifact of `ARTIFACTS` under `root` as Maven Central lays it out."""
    for artifact in ARTIFACTS:
        folder = root.joinpath(*artifact.group.split("."), artifact.name, artifact.version)
        folder.mkdir(parents=True)
        body = f"jar of {artifact}".encode()
        (folder / artifact.file).write_bytes(body + (b"!" if corrupt else b""))
        (folder / f"{artifact.file}.sha1").write_text(hashlib.sha1(body).hexdigest() + "\n")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "repo"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_fetch_puts_every_artifact_in_place(served, tmp_path: Path) -> None:
    root, url = served
    layout(root)
    jars = fetch(url, target=tmp_path / "jars")
    assert [p.name for p in jars] == [a.file for a in ARTIFACTS]
    assert all(p.read_bytes().startswith(b"jar of ") for p in jars)
    assert not list((tmp_path / "jars").glob("*.part"))


def test_a_jar_its_checksum_disowns_is_refused_and_not_installed(served, tmp_path) -> None:
    root, url = served
    layout(root, corrupt=True)
    with pytest.raises(ChangelakeError, match="SHA-1") as refused:
        fetch(url, target=tmp_path / "jars")
    assert "\n" not in str(refused.value)
    assert not list((tmp_path / "jars").iterdir())


def test_an_unreachable_repository_is_one_line_without_its_password(tmp_path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ChangelakeError, match="cannot fetch") as refused:
        fetch(f"http://alice:s3cretpw@127.0.0.1:{port}/", target=tmp_path / "jars", timeout=5)
    message = str(refused.value)
    assert "\n" not in message and "s3cretpw" not in message
    assert str(ARTIFACTS[0]) in message
