"""`redact`: every notation of a secret that reaches a message, a log or metadata is masked
(or, for what is kept, dropped), and nothing else changes."""

from __future__ import annotations

import psycopg2.extensions
import pytest

from changelake.redact import is_secret_key, redact

PW = "s3cretpw"


@pytest.mark.parametrize(("text", "shown"), [
    ("htp://alice:s3cretpw@h", "htp://alice:***@h"),
    ("https://alice:s3cretpw@registry:8081/x?y=1", "https://alice:***@registry:8081/x?y=1"),
    ("--schema-registry 'http://alice:s3cretpw@h': bad", "--schema-registry 'http://alice:***@h'"
     ": bad"),
    ("postgresql://u:s3c@retpw@h/db", "postgresql://u:***@h/db"),  # a raw @ in the password
    ("postgresql://:s3cretpw@h/db", "postgresql://:***@h/db"),
    ("postgresql://u@h/db?sslpassword=s3cretpw&sslmode=require&password=s3cretpw",
     "postgresql://u@h/db?sslpassword=***&sslmode=require&password=***"),
    ("https://h/x?X-Amz-Signature=s3cretpw&token=s3cretpw#f",
     "https://h/x?X-Amz-Signature=***&token=***#f"),
    ("host=h password=s3cretpw dbname=d", "host=h password=*** dbname=d"),
    ("host=h password = 's3cret pw \\' x' dbname=d", "host=h password = *** dbname=d"),
    ("host=h sslpassword=s3cretpw oauth_client_secret=s3cretpw",
     "host=h sslpassword=*** oauth_client_secret=***"),
    ("--conf spark.hadoop.fs.s3a.secret.key=s3cretpw", "--conf spark.hadoop.fs.s3a.secret.key=***"),
    ('{"user": "a", "password": "s3cretpw"}', '{"user": "a", "password": "***"}'),
    ('password="s3cret pw"', "password=***"),
    ("host=h password=x\\ s3cretpw dbname=d", "host=h password=*** dbname=d"),  # libpq: "x s3c.."
])
def test_each_notation_is_masked(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert "s3cret" not in redact(text)


@pytest.mark.parametrize("text", [
    "http://registry:8081/subjects/t-value", "host=h port=5432 dbname=d sslmode=require",
    "sslkey=/k passfile=/p user=u", "table public.t has no primary key (id=5)",
    "sqlite:////tmp/a b/catalog.db", "thrift://127.0.0.1:9083",
])
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text
    assert redact(text, drop=True) == text


def test_drop_leaves_a_usable_dsn() -> None:
    assert redact("postgresql://u:s3cretpw@h:5/db?sslpassword=x&sslmode=require",
                  drop=True) == "postgresql://u@h:5/db?sslmode=require"
    assert redact("postgresql://u@h/db?password=x", drop=True) == "postgresql://u@h/db"
    assert redact("password=s3cretpw host=h sslpassword='a b' dbname=d", drop=True) == \
        "host=h dbname=d"
    # what make_dsn writes, quotes and backslashes included, parses back without the secrets
    dsn = psycopg2.extensions.make_dsn(host="h", password="p w'\\x", sslpassword="q r",
                                       dbname="d b")
    kept = redact(dsn, drop=True)
    assert psycopg2.extensions.parse_dsn(kept) == {"host": "h", "dbname": "d b"}


def test_known_masks_pieces_a_driver_quotes() -> None:
    """libpq quotes a token of the DSN, not the DSN: the secret is masked wherever it is."""
    dsn = "postgresql://alice:s3cretpw%zz@h/db"
    message = 'invalid dsn: invalid percent-encoded token: "s3cretpw%zz"'
    assert PW not in redact(message, known=dsn)
    assert PW not in redact("could not connect: s3cret pw", known="password='s3cret pw'")
    assert PW not in redact("x s3cretpw", known="host=h password=s3cretpw")


def test_secret_names() -> None:
    for name in ("password", "sslpassword", "oauth_client_secret", "PASSWORD", "api_key",
                 "sasl.password", "token", "Authorization", "fs.s3a.access.key"):
        assert is_secret_key(name), name
    for name in ("user", "host", "sslkey", "passfile", "sslmode", "dbname", "service", "key"):
        assert not is_secret_key(name), name
