"""The `changelake` command line: the command group (`group.py`) and a module per command or
group of commands, each registering its commands on `main` when imported here. Commands parse
options and call the modules that do the work."""

from changelake.cli import capture, decode, demo, encode, ingest, maintain, read, sql
from changelake.cli.group import JVM_LOG_ENV, main, user_errors

COMMAND_MODULES = (capture, decode, demo, encode, ingest, maintain, read, sql)
"""Imported for what importing them does: each registers its commands on `main`."""

__all__ = ["JVM_LOG_ENV", "main", "user_errors"]
