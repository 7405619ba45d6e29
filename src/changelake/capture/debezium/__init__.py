"""Real Debezium: its PostgreSQL connector, in changelake's Java runner (`jvm/debezium-runner`),
writing a database's changes to Kafka for `changelake ingest --kafka --from debezium`.

`DebeziumRunner(config).start()` runs it as a process of its own; see `runner.py`."""

from changelake.capture.debezium.runner import (
    DebeziumConfig,
    DebeziumError,
    DebeziumRunner,
    runner_classpath,
)

__all__ = ["DebeziumConfig", "DebeziumError", "DebeziumRunner", "runner_classpath"]
