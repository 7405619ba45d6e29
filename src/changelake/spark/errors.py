"""Input errors raised inside Spark, brought back to the driver as `InputError`.

An executor (the `materialize-cdc` and `kafka-cdc` data sources, a decode check) cannot raise
our exception types across the JVM: it raises with its message wrapped in a mark
(`INPUT_ERROR_MARK<<...>>`), or the data source's planner raises a `ValueError` whose text
starts with `materialize-cdc:` or `kafka-cdc:`. Spark wraps either in its own exception; this
finds the message again, so the CLI prints one line naming the input instead of a JVM stack trace.
"""

from __future__ import annotations

import re
from typing import Any

from changelake.errors import InputError

INPUT_ERROR_MARK = "changelake-input-error"
"""Marks an input error raised in an executor, so the driver can turn it back into one line."""
_INPUT_ERROR = re.compile(re.escape(INPUT_ERROR_MARK) + r"<<(.*?)>>", re.S)
_SOURCE_ERROR = re.compile(r"ValueError: ((?:materialize|kafka)-cdc: [^\n]*)")


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
    found = _INPUT_ERROR.search(str(error)) or _SOURCE_ERROR.search(str(error))
    return None if found is None else InputError(found.group(1).strip())
