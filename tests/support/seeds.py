"""The examples of the Materialize CDC docs (seeds 000 and 002), cut out of the seed texts
themselves so the tests follow the specification as written."""

from __future__ import annotations

import orjson

from tests.support.paths import SEEDS


def _seed(prefix: str) -> str:
    (path,) = SEEDS.glob(f"{prefix}_*.txt")
    return path.read_text()


def seed000_schema() -> list:
    text = _seed("000")
    text = text[text.index("The following example schema specifies"):]
    return orjson.loads(text[text.index("["): text.index("As an example")])


def seed000_changefeed() -> str:
    """As printed in the docs, including the doubled `{{` that opens the first line."""
    text = _seed("000")
    start = text.index("might produce this changefeed:") + len("might produce this changefeed:")
    return text[start: text.index("Even if")].strip() + "\n"


def seed002_schema() -> list:
    text = _seed("002")
    text = text[text.index("```[") + 3:]
    return orjson.loads(text[: text.index("```")])


def seed002_changefeed() -> str:
    """The four updates and the progress statement that summarizes them."""
    text = _seed("002")
    updates = text[text.index('{"array"'): text.index("This will be summarized")]
    progress = text[text.index('{"com.materialize.cdc.progress"'):]
    progress = progress[: progress.index("\n")]
    lines = [line for line in updates.splitlines() if line.startswith("{")]
    return "\n".join([*lines, progress]) + "\n"
