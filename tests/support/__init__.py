"""What the tests share besides fixtures (fixtures live in `tests/conftest.py`): the data's
paths, seeded randomness, generators of histories and feeds, helpers for Kafka, PostgreSQL,
S3 and Spark, and the worker scripts tests run as separate processes.

The tests under `tests/` mirror `src/changelake/` (`tests/protocol/` holds the tests of
`changelake.protocol`, and so on; a top-level module's tests are at `tests/`'s top). `tests`
is a package: import as `from tests.support.kafka_helpers import ...` (pytest puts the
checkout's root on `sys.path`; a worker run as a script, or a subprocess, puts it there
itself). A test module imported by another is imported by its full name
(`tests.convert.test_convert_history`).
"""
