"""Secrets out of every text changelake shows or keeps: one function, `redact`, for each URL,
libpq DSN and message that may hold one (an error line, a log, a table's metadata).

What counts as a secret, wherever it is written:

* a URL's password: `scheme://user:PASSWORD@host` (the user stays: it names the account);
* a query parameter whose name says secret: `?password=...&sslpassword=...&token=...`;
* a `key=value` pair (libpq's key/value DSN, `--conf`) whose key says secret, its value
  unquoted or in libpq's single quotes (`password='a b\\'c'`);
* a JSON member whose name says secret: `"password": "..."`.

A name "says secret" (`is_secret_key`) when it is one of libpq's password options
(`password`, `sslpassword`, `oauth_client_secret`: the ones `PQconndefaults` marks for hiding)
or ends in password, passwd, passphrase, pwd, secret, token, credential(s), api/access/private
key, signature or auth(orization), or is `pass` (not a bare `key`: a Kafka message's key, a
column of that name, would be hidden in every message that shows a row).

Messages of a driver that quote a piece of the DSN, not the DSN (libpq: `invalid
percent-encoded token: "s3cret%zz"`), are covered by `known`: every secret the DSN holds, by
the rules above, is masked wherever it appears in the text.

The password of a DSN belongs in the environment (`PGPASSWORD`), a password file
(`PGPASSFILE`, `~/.pgpass`) or a service file (`PGSERVICE`); `redact(dsn, drop=True)` is the
DSN to keep, which libpq completes from those again.

Secrets a process was given apart from any DSN (a Kafka password in `--kafka-conf`) are
`remember`ed: every later `redact` masks each of them wherever it appears.

Only the standard library: every layer may import this module.
"""

from __future__ import annotations

import re
import urllib.parse

MASK = "***"

LIBPQ_SECRET_KEYS = frozenset({"password", "sslpassword", "oauth_client_secret"})
"""libpq's connection options whose values are secrets (display flag "*" in libpq)."""

_SECRET_NAME = re.compile(
    r"(?:.*(?:password|passwd|passphrase|pwd|secret|token|credentials?|"
    r"(?:api|access|private|secret)[_.\-]?key|signature|auth|authorization)|pass)",
    re.IGNORECASE)

_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s/?#@:]*):(?P<secret>[^\s/?#]*)@")
"""A URL's `user:password@`; the password runs to the last `@` of the authority, as
`urllib.parse.urlsplit` reads it (a raw `@` in a password)."""

_QUERY = re.compile(r"\?(?P<body>[^#\s\"]*)")

_PAIR = re.compile(
    r"(?<![\w.\-&?;])(?P<key>[A-Za-z_][\w.\-]*)(?P<eq>[ \t]*=[ \t]*)"
    r"(?P<secret>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|(?:\\.|\S)*)")
"""`key=value` as libpq reads it: a value in single quotes (backslash escapes; double quotes
too, as other notations write them), or up to the next whitespace that no backslash escapes
(libpq reads `password=a\\ b` as `a b`); after `?`, `&` or `;`
it is a query parameter (`_QUERY`)."""

_JSON = re.compile(
    r"\"(?P<key>[^\"\\]{1,100})\"(?P<colon>\s*:\s*)\"(?P<secret>(?:[^\"\\]|\\.)*)\"")

_DROPPED = "\0"

_REMEMBERED: set[str] = set()
MIN_REMEMBERED = 3
"""Shorter secrets are not remembered: masking every `ab` would garble the text and hide
nothing a guess would not find."""


def remember(secret: str) -> None:
    """A secret value this process holds: every later `redact` masks it wherever it is."""
    if len(secret) >= MIN_REMEMBERED and secret != MASK:
        _REMEMBERED.add(secret)


def is_secret_key(name: str) -> bool:
    """Whether a parameter called `name` holds a secret (see the module docstring)."""
    return name.lower() in LIBPQ_SECRET_KEYS or _SECRET_NAME.fullmatch(name) is not None


def redact(text: str, *, known: str | None = None, drop: bool = False) -> str:
    """`text` with every secret it holds replaced by `***` (see the module docstring), and
    with `known` (a DSN or URL the text may quote pieces of) every secret of `known` too.

    `drop`: the secrets removed instead of masked, `user:password@` as `user@` and a secret
    parameter or pair gone whole: a DSN or URL still usable, whose password libpq (or the
    caller) finds elsewhere. For what is kept (a table's metadata)."""
    if known:
        for secret in sorted(_secrets(known), key=len, reverse=True):
            text = text.replace(secret, MASK)
    for secret in sorted(_REMEMBERED, key=len, reverse=True):
        text = text.replace(secret, MASK)

    def userinfo(m: re.Match[str]) -> str:
        if drop:
            return m["scheme"] + (m["user"] + "@" if m["user"] else "")
        return f"{m['scheme']}{m['user']}:{MASK}@"

    def query(m: re.Match[str]) -> str:
        kept = []
        for part in m["body"].split("&"):
            name, eq, _ = part.partition("=")
            if eq and is_secret_key(urllib.parse.unquote_plus(name)):
                if drop:
                    continue
                part = f"{name}={MASK}"
            kept.append(part)
        body = "&".join(kept)
        return "?" + body if body or not drop else ""

    def pair(m: re.Match[str]) -> str:
        if not is_secret_key(m["key"]):
            return m[0]
        return _DROPPED if drop else f"{m['key']}{m['eq']}{MASK}"

    def member(m: re.Match[str]) -> str:
        if not is_secret_key(m["key"]):
            return m[0]
        return f"\"{m['key']}\"{m['colon']}\"{MASK}\""

    text = _USERINFO.sub(userinfo, text)
    text = _QUERY.sub(query, text)
    text = _JSON.sub(member, text)
    text = _PAIR.sub(pair, text)
    if drop and _DROPPED in text:
        text = re.sub(r"^[ \t]*\0[ \t]*|[ \t]*\0[ \t]*$", "", text)
        text = re.sub(r"[ \t]*\0[ \t]*", " ", text)
    return text


def _secrets(text: str) -> set[str]:
    """The secret values `text` holds (each as written, and decoded where the notation
    encodes), by the rules of `redact`."""
    found: set[str] = set()
    for m in _USERINFO.finditer(text):
        found |= {m["secret"], urllib.parse.unquote(m["secret"])}
    for m in _QUERY.finditer(text):
        for part in m["body"].split("&"):
            name, eq, value = part.partition("=")
            if eq and is_secret_key(urllib.parse.unquote_plus(name)):
                found |= {value, urllib.parse.unquote_plus(value)}
    for m in _PAIR.finditer(text):
        if is_secret_key(m["key"]):
            value = m["secret"]
            found.add(value)
            if value[:1] in ("'", '"'):
                inner = value[1:-1] if len(value) > 1 and value[-1] == value[0] else value[1:]
                found |= {inner, re.sub(r"\\(.)", r"\1", inner)}
    for m in _JSON.finditer(text):
        if is_secret_key(m["key"]):
            found.add(m["secret"])
    return {s for s in found if s and s != MASK}


__all__ = ["LIBPQ_SECRET_KEYS", "MASK", "is_secret_key", "redact"]
