"""Spark's `file:` URIs and the local paths they name: one rule, for the driver and the executors.

Spark names a local file by a URI (`_metadata.file_path`, the file in a read error): `file:`,
perhaps `//`, then the path percent-encoded (`file:/a%20b`). A `+` stays as it is, as Hadoop
writes it, so it must not be read the way a form decoder reads it (as a space): a `+` in a path
once dropped every line of that file. `local_path` reads a URI on the driver (an error's text);
`local_path_column` is the same rule as a column expression, for a column of URIs on the
executors. `tests/test_spark_uris.py` holds the two to each other.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from pyspark.sql import Column
from pyspark.sql import functions as F

FILE_SCHEME = r"^file:(//)?"
"""What precedes the path in a local file's URI."""


def local_path(uri: str) -> str:
    """The local path a Spark `file:` URI names (percent escapes decoded, `+` kept)."""
    return unquote(re.sub(FILE_SCHEME, "", uri))


def local_path_column(uri: Column) -> Column:
    """`local_path` of each URI in a column (`url_decode` is a form decoder, so a `+` is first
    written as its escape)."""
    path = F.regexp_replace(uri, FILE_SCHEME, "")
    return F.url_decode(F.replace(path, F.lit("+"), F.lit("%2B")))
