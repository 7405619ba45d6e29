"""The `changelake` command group, and how every command ends: errors the user can act on
(`ChangelakeError`) as one line on stderr and exit status 2, no traceback; our warnings as one
line; the JVM's start-up log removed when the command succeeds."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from changelake.errors import ChangelakeError
from changelake.redact import redact

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str) -> None:
    click.echo(f"changelake: error: {message}", err=True)
    sys.exit(2)


def user_errors(func: F) -> F:
    """Turn `ChangelakeError` (and unreadable files) into one line and exit status 2.

    Anything else is a bug in changelake, not bad input (input errors are translated where the
    input is parsed, with its location): one "internal error" line and exit status 1, with the
    traceback only when CHANGELAKE_DEBUG is set.
    """

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ChangelakeError as error:  # one line, whatever the input held, no secret
            _fail(redact(" ".join(str(error).splitlines())))
        except BrokenPipeError:
            sys.exit(0)  # the reader went away (e.g. `| head`)
        except OSError as error:
            if error.errno == 32:  # broken pipe, raised as a plain OSError
                sys.exit(0)
            # An OSError raised with a message alone (delta-rs's, pyarrow's) has no strerror.
            detail = error.strerror or " ".join(str(error).split()) or type(error).__name__
            _fail(redact(f"{error.filename or ''}: {detail}".lstrip(": ")))
        except click.ClickException:
            raise  # usage errors: click prints them
        except Exception as error:
            import os

            if os.environ.get("CHANGELAKE_DEBUG"):
                raise
            text = redact(" ".join(str(error).split()))[:300]
            click.echo(f"changelake: internal error: {type(error).__name__}: {text} (a bug: "
                       "please report it; CHANGELAKE_DEBUG=1 shows the traceback)", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


class _Main(click.Group):
    """The command group, which removes the JVM's log it named (`main`) when the command
    succeeds; a failed command's is kept (its error line may name it) until `private.
    sweep_logs` removes it, a week later."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        except SystemExit as done:
            if done.code in (None, 0) and _OWN_LOG:
                import os

                for log in _OWN_LOG:
                    with contextlib.suppress(OSError):
                        os.unlink(log)
            raise
        finally:
            if "pyarrow._s3fs" in sys.modules and not _S3_AT_EXIT:
                import atexit

                atexit.register(_finalize_s3)  # after pyarrow's own hook: so run before it
                _S3_AT_EXIT.append(True)


_S3_AT_EXIT: list[bool] = []


def _finalize_s3() -> None:
    """pyarrow's S3 subsystem (the AWS C++ SDK, which the reads without a JVM use: `files.
    arrow_s3`) shut down at exit with its file systems collected first. pyarrow's own `atexit`
    hook finalizes it without collecting them, and a process could then abort after its
    output ("terminate called without an active exception", exit 134): seen once in 30 runs
    of a JVM-free `snapshot` on S3, none in 100 with this."""
    import gc

    from pyarrow.fs import finalize_s3

    gc.collect()
    finalize_s3()


_OWN_LOG: list[str] = []


def _show_warning(message: Any, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """Our own warnings as one line, `changelake: warning: ...`; others as Python shows them."""
    from changelake.errors import ChangelakeWarning

    if issubclass(category, ChangelakeWarning):
        click.echo(f"changelake: warning: {redact(' '.join(str(message).split()))}", err=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="changelake")
def main() -> None:
    """Changefeeds to exactly-once CDCv2 (Materialize CDC) and lake tables on Spark.

    Debezium, YDB and Materialize CDC feeds (files or Kafka topics) and PostgreSQL
    databases into lake tables (Delta or Hive format, local or s3a://) that read AS OF
    any time, each update exactly once whatever the log duplicated, reordered or
    re-batched.

    \b
    Example (the tour of README.md and docs/getting-started.md):
      changelake ingest --lake lake --table shop.orders --from debezium --key id \\
        --close examples/orders.jsonl
      changelake snapshot --lake lake --table shop.orders --as-of 1250
    Docs: docs/index.md (a MkDocs site: .venv/bin/mkdocs serve); every command and
    option: docs/reference/cli.md; a command's own: changelake COMMAND --help."""
    import os

    from changelake.private import temporary_folder

    warnings.showwarning = _show_warning
    # Spark's JVM talks on stderr at start-up; keep that in a log so that our stderr is ours:
    # in this user's private folder (the session makes it), removed if the command succeeds.
    if not os.environ.get(JVM_LOG_ENV):
        log = str(temporary_folder("changelake") / f"spark-{os.getpid()}.log")
        os.environ[JVM_LOG_ENV] = log
        _OWN_LOG.append(log)


JVM_LOG_ENV = "CHANGELAKE_JVM_LOG"
"""`changelake.spark.session.JVM_LOG_ENV`, not imported from there: that would import pyspark,
which the lake reads on the Arrow path do without (a test checks that the two agree)."""
