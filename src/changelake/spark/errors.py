"""Input errors raised inside Spark, brought back to the driver as `InputError`.

An executor (the `materialize-cdc` and `kafka-cdc` data sources, a decode check) cannot raise
our exception types across the JVM: it raises with its message wrapped in a mark
(`INPUT_ERROR_MARK<<...>>`), or the data source's planner raises a `ValueError` whose text
starts with `materialize-cdc:` or `kafka-cdc:`. Spark wraps either in its own exception; this
finds the message again, so the CLI prints one line naming the input instead of a JVM stack trace.
A file Spark's own reader cannot read (a truncated `.gz`, say) is named the same way, with the
first cause Java gives.
"""

from __future__ import annotations

import re
from typing import Any

from changelake.errors import InputError, Location
from changelake.spark.uris import local_path

INPUT_ERROR_MARK = "changelake-input-error"
"""Marks an input error raised in an executor, so the driver can turn it back into one line."""
_INPUT_ERROR = re.compile(re.escape(INPUT_ERROR_MARK) + r"<<(.*?)>>", re.S)
_SOURCE_ERROR = re.compile(r"ValueError: ((?:materialize|kafka)-cdc: [^\n]*)")
_READ_FAILED = re.compile(r"\[FAILED_READ_FILE[.\w]*\] Encountered error while reading file "
                          r"(\S+?)\.?\s+SQLSTATE")
_CAUSE = re.compile(r"Caused by: [\w.$]+: ([^\n]*)")


def translate_errors(action: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a Spark action; an input error raised in an executor comes back as `InputError`."""
    try:
        return action(*args, **kwargs)
    except Exception as error:  # Py4JJavaError, PySparkException, AnalysisException ...
        found = input_error(error)
        if found is None:
            raise
        raise found from None


def input_error(error: BaseException) -> InputError | None:
    """The input error a Spark exception carries (see the module docstring), or None."""
    text = str(error)
    found = _INPUT_ERROR.search(text) or _SOURCE_ERROR.search(text)
    if found is not None:
        return InputError(found.group(1).strip())
    unread = _READ_FAILED.search(text)
    if unread is None:
        return None
    cause = _CAUSE.search(text, unread.end())
    return InputError(f"cannot read: {cause.group(1).strip() if cause else 'Spark failed'}",
                      Location(local_path(unread.group(1))))
