"""Kafka security settings (SASL, SSL) for every Kafka client a command makes, never printed.

A command takes them as a properties file (`--kafka-config FILE`, the Java clients'
`client.properties` format) and as repeated `--kafka-conf KEY=VALUE` (which win over the
file). Keys are librdkafka's (`security.protocol`, `sasl.mechanism`, `sasl.username`,
`sasl.password`, `ssl.ca.location`, ...); the Java clients' names that librdkafka spells
otherwise are translated (`JAVA_NAMES`, `translate`):

* `sasl.jaas.config` with the PLAIN or SCRAM login module (`... required username="u"
  password="p";`) becomes `sasl.username` and `sasl.password`;
* `ssl.truststore.location` of type PEM becomes `ssl.ca.location`; a JKS truststore is
  refused (librdkafka reads PEM), and so is a JKS keystore (PKCS#12 keeps its names);
* `ssl.endpoint.identification.algorithm` empty (the Java way to turn it off) becomes `none`.

Any other key goes to librdkafka as it is, which refuses one it does not know: the settings
are checked when given (`KafkaSecurity.check`), so a typo is one line before anything runs.

Where they go: `use` makes them the settings of this process, which `client.client_config`
(every producer, consumer and admin client changelake makes) adds to each client's; the
schema registry is not a Kafka client and takes none of them. Spark's executors are other
processes: `kafka_source.reader_options` names a file of this user's (mode 0600, in a 0700
folder, removed when the command ends: `shared_file`) in the `securityFile` option; the
planner, on the driver's machine, reads it into the reader it sends to the executors, so the
settings travel inside Spark's tasks and never as an option Spark would show (plans, the UI's
properties, logs).

Never printed: messages name keys, never values; each secret value (`SECRET_KEYS`, and the
password inside `sasl.jaas.config`) is also given to `redact.remember`, so that any text
changelake shows through `redact` (error lines, warnings) masks it even where a library quoted
it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from changelake.errors import ChangelakeError
from changelake.redact import is_secret_key, remember

SECRET_KEYS = frozenset({"sasl.jaas.config", "ssl.key.pem", "ssl_key", "ssl.certificate.pem",
                         "sasl.oauthbearer.config", "ssl.keystore.password",
                         "ssl.key.password", "ssl.truststore.password", "sasl.password"})
"""Keys whose values are secrets, besides every key `redact.is_secret_key` says so of."""


class SecurityError(ChangelakeError):
    """Kafka settings that cannot be used: a file that cannot be read, a line or key that is
    not a setting. The message names the file, line and key, never a value."""


def is_secret(key: str) -> bool:
    return key in SECRET_KEYS or is_secret_key(key)


@dataclass(frozen=True)
class KafkaSecurity:
    """librdkafka settings for every client (`settings`: key -> value, translated). Its
    `repr` names the keys only."""

    settings: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"KafkaSecurity(keys={sorted(self.settings)})"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self.settings)

    def config(self) -> dict[str, str]:
        return dict(self.settings)

    def check(self) -> KafkaSecurity:
        """These settings as librdkafka takes them, or a `SecurityError` in one line (its
        message redacted): a client is made with them (no connection is opened) and closed."""
        from confluent_kafka import KafkaException, Producer

        try:
            Producer({**self.settings, "log_level": 0})
        except (KafkaException, ValueError, TypeError) as error:
            from changelake.kafka.client import describe
            from changelake.redact import redact

            raise SecurityError(f"Kafka settings (--kafka-conf, --kafka-config): "
                                f"{redact(describe(error))}") from None
        return self


# ------------------------------------------------------------------------ reading them


def parse_properties(text: str, origin: str) -> list[tuple[str, str]]:
    """A Java properties file's pairs, in order: `key=value`, `key: value` or `key value`,
    `#` and `!` comments, a line ending in a backslash continued on the next, the escapes
    `\\t \\n \\r \\f \\uXXXX` and any other escaped character as itself. A line with no key
    is a `SecurityError` naming `origin` and its line."""
    pairs = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        number = index + 1
        line = lines[index].lstrip(" \t\f")
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continued(line) and index < len(lines):
            line = line[:-1] + lines[index].lstrip(" \t\f")
            index += 1
        if _continued(line):
            line = line[:-1]
        key, value = _split(line)
        if not key:
            raise SecurityError(f"{origin}: line {number}: no key")
        pairs.append((_unescape(key), _unescape(value)))
    return pairs


def _continued(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t\f":
            break
        i += 1
    key, rest = line[:i], line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":") and (i == len(line) or line[i] in " \t\f=:"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        c = m[1]
        if c.startswith("u"):
            return chr(int(c[1:], 16))
        return _ESCAPES.get(c, c)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", one, text)


def parse_items(items: Iterable[str]) -> list[tuple[str, str]]:
    """`--kafka-conf KEY=VALUE` items; one without `=` is named by its place, never shown (it
    may be a value typed without its key)."""
    pairs = []
    for number, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SecurityError(f"--kafka-conf: expected KEY=VALUE (the {_ordinal(number)} "
                                "--kafka-conf has no key before '=')")
        pairs.append((key, value))
    return pairs


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# --------------------------------------------------------------------- translating them

JAVA_NAMES = {"sasl.jaas.config", "ssl.truststore.location", "ssl.truststore.type",
              "ssl.truststore.password", "ssl.keystore.type"}
"""The Java clients' keys `translate` turns into librdkafka's (the module docstring)."""

_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)"
                   r"(?P<options>.*?);?\s*$", re.DOTALL)
_JAAS_OPTION = re.compile(r"(?P<key>[\w.\-]+)\s*=\s*(?:\"(?P<quoted>(?:[^\"\\]|\\.)*)\"|"
                          r"(?P<bare>[^\s;\"]+))")
_LOGIN_MODULES = ("org.apache.kafka.common.security.plain.PlainLoginModule",
                  "org.apache.kafka.common.security.scram.ScramLoginModule")


def translate(pairs: Iterable[tuple[str, str]], origin: str) -> dict[str, str]:
    """The pairs as librdkafka settings (later pairs win), the Java names translated."""
    given: dict[str, str] = {}
    for key, value in pairs:
        given[key] = value
    out: dict[str, str] = {}
    truststore_type = given.pop("ssl.truststore.type", "JKS").strip().upper()
    keystore_type = given.pop("ssl.keystore.type", "PKCS12").strip().upper()
    for key, value in given.items():
        if key == "sasl.jaas.config":
            out.update(_jaas(value, origin))
        elif key == "ssl.truststore.location":
            if truststore_type != "PEM":
                raise SecurityError(f"{origin}: ssl.truststore.location: librdkafka reads "
                                    f"certificates in PEM, not a {truststore_type} truststore: "
                                    "give ssl.ca.location (a PEM file), or "
                                    "ssl.truststore.type=PEM")
            out["ssl.ca.location"] = value
        elif key == "ssl.truststore.password":
            continue  # a PEM file has none
        elif key == "ssl.endpoint.identification.algorithm" and not value.strip():
            out[key] = "none"
        else:
            out[key] = value
    if "ssl.keystore.location" in out and keystore_type != "PKCS12":
        raise SecurityError(f"{origin}: ssl.keystore.location: librdkafka reads a PKCS12 "
                            f"keystore, not {keystore_type}")
    return out


def _jaas(value: str, origin: str) -> dict[str, str]:
    found = _JAAS.match(value)
    if found is None:
        raise SecurityError(f"{origin}: sasl.jaas.config: expected `LoginModule required "
                            "username=\"...\" password=\"...\";`")
    module = found["module"]
    if module not in _LOGIN_MODULES:
        raise SecurityError(f"{origin}: sasl.jaas.config: the login module {module} has no "
                            "librdkafka equivalent here; PLAIN and SCRAM "
                            f"({', '.join(m.rsplit('.', 1)[1] for m in _LOGIN_MODULES)}) have "
                            "(sasl.username, sasl.password), OAUTHBEARER takes librdkafka's "
                            "sasl.oauthbearer.* settings")
    options = {}
    for m in _JAAS_OPTION.finditer(found["options"]):
        text = m["quoted"] if m["quoted"] is not None else m["bare"]
        options[m["key"]] = re.sub(r"\\(.)", r"\1", text)
    out = {}
    for name in ("username", "password"):
        if name not in options:
            raise SecurityError(f"{origin}: sasl.jaas.config: no {name}")
        out[f"sasl.{name}"] = options[name]
    return out


# ------------------------------------------------------------ for Spark's Kafka connector


_JAVA_SAME = frozenset({"security.protocol", "sasl.kerberos.service.name",
                        "ssl.endpoint.identification.algorithm", "ssl.cipher.suites",
                        "ssl.keystore.password", "ssl.key.password",
                        "client.id", "client.rack"})
"""librdkafka keys the Java clients spell alike (and take alike)."""

_SCRAM = {"SCRAM-SHA-256", "SCRAM-SHA-512"}


def java_config(settings: Mapping[str, str]) -> dict[str, str]:
    """librdkafka security settings (`KafkaSecurity.settings`) as the Java clients' (Spark's
    Kafka connector's `kafka.*` options), or a `SecurityError` naming the key that has no
    Java equivalent here: `sasl.username`/`sasl.password` become `sasl.jaas.config` with the
    PLAIN or SCRAM login module of `sasl.mechanism` (librdkafka's `sasl.mechanisms` too),
    `ssl.ca.location` a PEM truststore, `ssl.endpoint.identification.algorithm=none` empty.
    Values are never in a message."""
    given = dict(settings)
    out: dict[str, str] = {}
    mechanism = (given.pop("sasl.mechanism", None) or given.pop("sasl.mechanisms", None)
                 or "").strip().upper()
    given.pop("sasl.mechanisms", None)
    username = given.pop("sasl.username", None)
    password = given.pop("sasl.password", None)
    if mechanism:
        out["sasl.mechanism"] = mechanism
    if username is not None or password is not None:
        if mechanism not in {"PLAIN", *_SCRAM}:
            raise SecurityError(f"Spark's Kafka connector: sasl.username and sasl.password "
                                f"with sasl.mechanism {mechanism or '(none)'}: PLAIN and "
                                "SCRAM-SHA-256/512 are translated, give sasl.jaas.config in "
                                "a Java client's terms for another")
        module = _LOGIN_MODULES[0] if mechanism == "PLAIN" else _LOGIN_MODULES[1]

        def quoted(text: str | None) -> str:
            return '"' + (text or "").replace("\\", "\\\\").replace('"', '\\"') + '"'

        out["sasl.jaas.config"] = (f"{module} required username={quoted(username)} "
                                   f"password={quoted(password)};")
    for key, value in given.items():
        if key == "ssl.ca.location":
            out["ssl.truststore.location"] = value
            out["ssl.truststore.type"] = "PEM"
        elif key == "ssl.keystore.location":  # librdkafka's keystore is PKCS#12
            out[key] = value
            out["ssl.keystore.type"] = "PKCS12"
        elif key == "ssl.endpoint.identification.algorithm" and value.strip() == "none":
            out[key] = ""
        elif key in _JAVA_SAME:
            out[key] = value
        else:
            raise SecurityError(f"Spark's Kafka connector: the setting {key} has no Java "
                                "client equivalent changelake knows; read with the kafka-cdc "
                                "reader, which takes librdkafka's settings")
    return out


# ---------------------------------------------------------------------- the process's own


def from_command_line(items: Iterable[str] = (), file: Path | None = None) -> KafkaSecurity:
    """`--kafka-config FILE` then `--kafka-conf` items (which win), translated, each secret
    value remembered by `redact`, and checked by librdkafka."""
    pairs: list[tuple[str, str]] = []
    if file is not None:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or type(error).__name__
            raise SecurityError(f"--kafka-config {file}: cannot read it: {reason}") from None
        pairs += parse_properties(text, f"--kafka-config {file}")
    items = list(items)
    pairs += parse_items(items)
    origin = "--kafka-config" if not items else "--kafka-conf"
    settings = translate(pairs, origin)
    for key, value in pairs:
        if is_secret(key):
            remember(value)
    for key, value in settings.items():
        if is_secret(key):
            remember(value)
    return KafkaSecurity(settings).check() if settings else KafkaSecurity()


_CURRENT = KafkaSecurity()
_FILE: Path | None = None


def use(security: KafkaSecurity | None) -> None:
    """Make `security` the settings of every Kafka client this process makes from now on
    (None: none); a file `shared_file` wrote for the last ones is removed."""
    global _CURRENT
    _CURRENT = security or KafkaSecurity()
    _remove_file()


def current() -> KafkaSecurity:
    """The settings `use` set (empty: none)."""
    return _CURRENT


def shared_file() -> Path | None:
    """The current settings in a file only this user can read (None without settings), for
    Spark's planner (`load_file`): written once, removed at `use` or when the process exits."""
    global _FILE
    if not _CURRENT:
        return None
    if _FILE is not None and _FILE.exists():
        return _FILE
    from changelake.private import open_private, private_folder, temporary_folder

    folder = private_folder(temporary_folder("changelake-kafka"))
    path = folder / f"settings-{os.getpid()}-{id(_CURRENT):x}.json"
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as out:
        json.dump(_CURRENT.config(), out)
    _FILE = path
    return path


def load_file(path: str) -> KafkaSecurity:
    """The settings `shared_file` wrote, or a `SecurityError` naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError) as error:
        reason = getattr(error, "strerror", None) or type(error).__name__
        raise SecurityError(f"the Kafka settings file {path} cannot be read: {reason} (it "
                            "lives as long as the command that wrote it)") from None
    return KafkaSecurity({str(k): str(v) for k, v in settings.items()})


def _remove_file() -> None:
    global _FILE
    if _FILE is not None:
        with contextlib.suppress(OSError):
            _FILE.unlink()
        _FILE = None


atexit.register(_remove_file)
