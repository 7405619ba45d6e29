"""Spark's `file:` URIs and the local paths they name.

Spark names a local file by a URI (`_metadata.file_path`, `DataFrame.inputFiles`, the file in a
read error): `file:`, perhaps `//`, then the path percent-encoded (`file:/a%20b`). A `+` stays
as it is, as Hadoop writes it, so it must not be read the way a form decoder reads it (as a
space): a `+` in a path once dropped every line of that file. `local_path` reads a URI on the
driver; the executors compare URIs, not paths (`changefeed.read`). `tests/spark/test_spark_uris.py`
holds it to what Spark writes.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

FILE_SCHEME = r"^file:(//)?"
"""What precedes the path in a local file's URI."""


def local_path(uri: str) -> str:
    """The local path a Spark `file:` URI names (percent escapes decoded, `+` kept)."""
    return unquote(re.sub(FILE_SCHEME, "", uri))

