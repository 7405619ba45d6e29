"""`ingest`'s table of ways to read (`cli/ingest_sources.py`): each row is found for its call,
and a call that does not fit its row gets the row's first refusal, before Spark starts."""

from __future__ import annotations

import click
import pytest

from changelake.cli.ingest_sources import SOURCES, ingest_source

CALLS = {  # a call each row takes: (options given, INPUT arguments, --from)
    "files": ((), 1, "materialize"),
    "changefeed files": (("--close",), 2, "ydb"),
    "topics": (("--kafka", "--topic", "--schema"), 0, "materialize"),
    "changefeed topics": (("--kafka", "--topic", "--group", "--close"), 0, "debezium"),
    "followed directory": (("--follow", "--checkpoint", "--until-idle"), 1, "materialize"),
    "followed topics": (("--follow", "--kafka", "--topic", "--schema-registry",
                         "--no-fail-on-data-loss"), 0, "materialize"),
    "followed changefeed topics": (("--follow", "--kafka", "--topic", "--until-idle"), 0,
                                   "ydb"),
}


def test_each_way_of_reading_is_found_for_a_call_that_fits_it() -> None:
    assert [row.name for row in SOURCES] == list(CALLS)
    for name, (given, inputs, source) in CALLS.items():
        assert ingest_source(given, inputs, source=source).name == name


@pytest.mark.parametrize(("given", "inputs", "source", "message"), [
    # two faults: the row's first refusal is the one named
    (("--checkpoint", "--topic"), 1, "materialize",
     "--checkpoint, --max-files-per-trigger, --max-records-per-trigger and --until-idle go "
     "with --follow"),
    (("--kafka",), 0, "materialize", "--kafka needs --topic T"),
    (("--follow", "--topic"), 0, "debezium",
     "--topic, --schema-registry and --group go with --kafka"),
    (("--follow",), 1, "ydb",
     "--follow --from ydb follows changefeed topics (--kafka --topic), not files"),
    (("--follow", "--kafka", "--topic", "--schema-registry"), 0, "debezium",
     "--schema-registry is for Avro topics (--from materialize); debezium topics are JSON"),
    (("--follow",), 2, "materialize",
     "--follow follows one INPUT directory (no more than one INPUT as well), or --kafka topics"),
    ((), 0, "ydb", "no INPUT given (files or directories, or --kafka/--topic)"),
])
def test_a_call_that_does_not_fit_gets_its_rows_first_refusal(
        given: tuple[str, ...], inputs: int, source: str, message: str) -> None:
    with pytest.raises(click.UsageError) as refused:
        ingest_source(given, inputs, source=source)
    assert refused.value.message == message
