"""Hypothesis fuzzing of the Debezium and YDB changefeed lines (parser and converter) and of the
pgoutput decoder (issue 67), each campaign in a child process under an address-space cap
(`fuzz_lines_worker.py`), so a bomb that gets through fails the test, not the machine: any
input converts or is one line naming its place. The default run draws a few dozen examples
each (seconds); `-m slow` draws thousands."""

from __future__ import annotations

import pytest

from tests.support.capped_campaign import run_campaign


def campaign(kind: str, examples: int) -> None:
    run_campaign("fuzz_lines_worker.py", kind, examples, timeout=3600)


@pytest.mark.parametrize("kind, examples", [("debezium", 60), ("ydb", 60), ("pgoutput", 200)])
def test_lines_fuzz(kind: str, examples: int) -> None:
    campaign(kind, examples)


@pytest.mark.slow
@pytest.mark.parametrize("kind, examples", [("debezium", 3000), ("ydb", 3000),
                                            ("pgoutput", 20000)])
def test_lines_fuzz_long(kind: str, examples: int) -> None:
    campaign(kind, examples)
