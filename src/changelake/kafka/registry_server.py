"""A schema registry in memory, served over HTTP on 127.0.0.1: for tests and the demo.

It speaks the part of the Confluent REST API that `registry.SchemaRegistry` uses, with the
registry's own semantics there: ids start at 1 and are global, the same schema registered again
(under any subject) keeps its id, an unknown id is HTTP 404 with `error_code` 40403 (an unknown
subject: 40401). It is a real server on a real socket, so the client's HTTP path is what the
tests exercise.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import unquote

import orjson

from changelake.kafka.registry import CONTENT_TYPE, SCHEMA_NOT_FOUND, SUBJECT_NOT_FOUND


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[int, str] = {}
        self.ids: dict[str, int] = {}  # normalized schema text -> id
        self.subjects: dict[str, list[int]] = {}

    def register(self, subject: str, text: str) -> int:
        normal = orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS).decode()
        with self.lock:
            schema_id = self.ids.get(normal)
            if schema_id is None:
                schema_id = self.ids[normal] = len(self.by_id) + 1
                self.by_id[schema_id] = text
            versions = self.subjects.setdefault(subject, [])
            if schema_id not in versions:
                versions.append(schema_id)
            return schema_id


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read stderr
        pass

    def _answer(self, status: int, value: Any) -> None:
        body = orjson.dumps(value)
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")
        registry = self.server.registry
        if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
            text = registry.by_id.get(int(parts[2]))
            if text is None:
                self._answer(404, {"error_code": SCHEMA_NOT_FOUND, "message": "Schema not found"})
            else:
                self._answer(200, {"schema": text})
        elif parts == ["subjects"]:
            self._answer(200, sorted(registry.subjects))
        elif (len(parts) == 4 and parts[0] == "subjects" and parts[2:] == ["versions", "latest"]
              and unquote(parts[1]) in registry.subjects):
            subject = unquote(parts[1])
            versions = registry.subjects[subject]
            self._answer(200, {"subject": subject, "version": len(versions), "id": versions[-1],
                               "schema": registry.by_id[versions[-1]]})
        elif len(parts) == 4 and parts[0] == "subjects" and parts[2:] == ["versions", "latest"]:
            self._answer(404, {"error_code": SUBJECT_NOT_FOUND, "message": "Subject not found"})
        else:
            self._answer(404, {"error_code": 404, "message": "not found"})

    def do_POST(self) -> None:
        parts = self.path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "subjects" or parts[2] != "versions":
            self._answer(404, {"error_code": 404, "message": "not found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = orjson.loads(self.rfile.read(length))
            schema_id = self.server.registry.register(unquote(parts[1]), request["schema"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            self._answer(422, {"error_code": 42201, "message": "Invalid schema"})
            return
        self._answer(200, {"id": schema_id})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: _Registry


class RegistryServer:
    """Serves an empty registry at `url` until `close()` (or the `with` block ends)."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.registry = _Registry()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="changelake-registry")
        self._thread.start()

    def subjects(self) -> dict[str, list[int]]:
        """Subject -> schema ids registered under it, in order."""
        with self._server.registry.lock:
            return {k: list(v) for k, v in self._server.registry.subjects.items()}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> RegistryServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
