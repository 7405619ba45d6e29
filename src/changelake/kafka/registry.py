"""A Confluent schema registry client: the two calls a CDCv2 topic needs, over plain HTTP.

A Confluent-framed Kafka message carries a 4-byte schema id instead of its schema; the registry
maps ids to schemas. The sink registers its schema under the subject `<topic>-value` (the
registry's TopicNameStrategy, what Materialize and Kafka Connect use) and frames every message
with the id it gets back; registering the same schema again returns the same id, so a re-run
sink writes the same bytes. The source looks ids up (once each).

confluent-kafka's own client needs its `schemaregistry` extra, whose pinned dependencies do not
install everywhere (certifi releases newer than some package indexes carry); the REST API is two
JSON calls (three with `latest`, which a reader without a schema file uses to type its rows
before reading any frame), so this client uses the standard library.
`http://user:password@host` URLs send basic authentication, and so does `AUTH_ENV`
(`user:password`) for a URL without a user: a password kept off the command line, where `ps`
shows it. The credentials go only to the registry's own host: a redirect elsewhere is followed
without them. Messages name the registry without its password (`redact`).
"""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson

from changelake.errors import SchemaError
from changelake.formats.materialize import CdcSchema
from changelake.kafka.errors import RegistryError
from changelake.redact import redact
from changelake.text import short

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_NOT_FOUND = 40403  # the registry's error_code for an unknown schema id
SUBJECT_NOT_FOUND = 40401  # ... and for an unknown subject

AUTH_ENV = "CHANGELAKE_SCHEMA_REGISTRY_AUTH"
"""`user:password` for the registry's basic authentication when its URL names no user."""


def value_subject(topic: str) -> str:
    """The subject of a topic's message values (TopicNameStrategy)."""
    return f"{topic}-value"


class SchemaRegistry:
    """A registry at `url` (`http://host:port`, optionally with a path prefix)."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port  # ValueError for a port that is not a number
        except ValueError:
            parts, port = None, None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise RegistryError("--schema-registry: expected http(s)://HOST[:PORT], got "
                                f"{redact(url, known=url)!r}")
        self._auth: str | None = None
        if parts.username is not None:
            token = f"{urllib.parse.unquote(parts.username)}:" \
                    f"{urllib.parse.unquote(parts.password or '')}"
        else:
            token = os.environ.get(AUTH_ENV) or None
            if token is not None and ":" not in token:
                raise RegistryError(f"{AUTH_ENV}: expected USER:PASSWORD (its value is not "
                                    "shown)")
        if token is not None:
            self._auth = "Basic " + base64.b64encode(token.encode()).decode()
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        netloc = host + (f":{port}" if port else "")
        self.url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_CredentialsStayHome)
        self._by_id: dict[int, CdcSchema | None] = {}

    def register(self, subject: str, schema: CdcSchema) -> int:
        """Register `schema` under `subject` (or find it there) and return its id."""
        body = orjson.dumps({"schema": orjson.dumps(schema.avro).decode()})
        answer = self._call("POST", f"/subjects/{urllib.parse.quote(subject, safe='')}/versions",
                            body)
        schema_id = answer.get("id") if isinstance(answer, dict) else None
        if type(schema_id) is not int or not 0 <= schema_id < 2**31:
            raise RegistryError(f"{self.url}: registering under {subject!r} answered no schema "
                                f"id: {short(answer, 120)}")
        self._by_id[schema_id] = schema
        return schema_id

    def schema(self, schema_id: int) -> CdcSchema | None:
        """The Materialize CDC schema with this id; None if the registry has no such id. A
        schema that is not a Materialize CDC schema is a `SchemaError` naming the id."""
        if schema_id in self._by_id:
            return self._by_id[schema_id]
        answer = self._call("GET", f"/schemas/ids/{schema_id}", None, missing_ok=True)
        if answer is None:
            self._by_id[schema_id] = None
            return None
        if not isinstance(answer, dict) or not isinstance(answer.get("schema"), str):
            raise RegistryError(f"{self.url}: schema id {schema_id}: the answer has no schema: "
                                f"{short(answer, 120)}")
        if answer.get("schemaType", "AVRO") != "AVRO":
            raise SchemaError(f"schema id {schema_id} is a {answer['schemaType']} schema, not "
                              "Avro")
        schema = CdcSchema.from_json(answer, f"schema id {schema_id} of {self.url}")
        self._by_id[schema_id] = schema
        return schema

    def latest(self, subject: str) -> CdcSchema | None:
        """The schema of `subject`'s latest version; None if the registry has no such subject.
        What a reader that must know its rows' type before reading a frame (Spark plans the
        schema first) takes as the type; each frame is still decoded by its own id."""
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
        answer = self._call("GET", path, None, missing_ok=True)
        if answer is None:
            return None
        schema_id = answer.get("id") if isinstance(answer, dict) else None
        if type(schema_id) is not int or not isinstance(answer.get("schema"), str):
            raise RegistryError(f"{self.url}: subject {subject!r}: the answer has no schema id "
                                f"and schema: {short(answer, 120)}")
        return self.schema(schema_id)

    def _call(self, method: str, path: str, body: bytes | None, *,
              missing_ok: bool = False) -> Any:
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers={"Accept": CONTENT_TYPE,
                                                  "Content-Type": CONTENT_TYPE})
        if self._auth is not None:
            request.add_header("Authorization", self._auth)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read()[:300]
            try:
                code = orjson.loads(detail).get("error_code")
            except (orjson.JSONDecodeError, AttributeError):
                code = None
            if missing_ok and error.code == 404 and code in (SCHEMA_NOT_FOUND,
                                                             SUBJECT_NOT_FOUND, None):
                return None
            raise RegistryError(f"{self.url}: {method} {path}: HTTP {error.code}: "
                                f"{detail.decode('utf-8', 'replace')}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise RegistryError(f"{self.url}: cannot reach the schema registry: "
                                f"{redact(str(reason))}") from None
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            raise RegistryError(f"{self.url}: {method} {path}: the answer is not JSON") from None



def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = None
    return parts.scheme, (parts.hostname or "").lower(), port


class _CredentialsStayHome(urllib.request.HTTPRedirectHandler):
    """urllib's redirects, except that the Authorization header is not carried to another
    scheme, host or port (urllib copies every header but the body's to the new request)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) != _origin(req.full_url):
            new.remove_header("Authorization")
        return new
