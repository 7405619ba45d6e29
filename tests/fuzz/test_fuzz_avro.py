"""Hypothesis fuzzing of the Avro container reader over arbitrary schemas and corrupted bytes,
and of Confluent framing (issue 67), each campaign in a child process under an address-space
cap (`fuzz_avro_worker.py`), so a bomb that gets through fails the test, not the machine.
The default run draws a few dozen examples each (seconds); `-m slow` draws thousands."""

from __future__ import annotations

import pytest

from tests.support.capped_campaign import run_campaign


def campaign(kind: str, examples: int) -> None:
    run_campaign("fuzz_avro_worker.py", kind, examples, timeout=1800)


@pytest.mark.parametrize("kind", ["container", "framed"])
def test_avro_fuzz(kind: str) -> None:
    campaign(kind, 60)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["container", "framed"])
def test_avro_fuzz_long(kind: str) -> None:
    campaign(kind, 3000)
