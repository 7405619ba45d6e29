"""Capture from PostgreSQL logical replication (pgoutput) into lake tables.

`database_as_of(lake, database, time=None)` reads every lake table captured from one database
as of one of its transactions (see `consistency.py`)."""

from changelake.capture.postgres.consistency import database_as_of

__all__ = ["database_as_of"]
