"""Where the repository's test data is. Every fixture lives in the repository: the format
samples (public examples of Debezium and YDB messages, each with its origin in `.source.txt`)
and the seed documents the examples are cut from. A clone with nothing beside it runs the
whole suite."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
ROOT = TESTS.parent
DATA = TESTS / "data"
SAMPLES = DATA / "samples"
SEEDS = DATA / "seeds"
