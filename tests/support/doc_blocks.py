"""The code blocks of the README and of the docs site (docs/**/*.md), and how they are marked.

Every block of a shell or Python language is marked by an HTML comment on the line before its
fence, which the tests read and a reader does not see:

* `<!-- run: cli -->`: `$ .venv/bin/changelake ...` lines, each followed by the output it
  prints (stdout and stderr as a terminal shows them; `> FILE` sends stdout to FILE, and the
  lines shown are then its stderr). `tests/docs/test_docs_examples.py` runs them in-process against
  a copy of `examples/` and compares. An output line `...` stands for any lines, `...` inside
  a line for any text; a command shown without output is only required to succeed, one that
  shows a `changelake: error:` line to fail with exit status 2.
* `<!-- run: sql -->`: the SQL endpoint's example: the slow tier starts `changelake sql` on
  the tour's lake and runs its queries with beeline (each such block has the README's queries).
* `<!-- run: kafka-cli -->`: `cli` blocks whose commands read topics of a broker the page
  calls `broker:9092`: `test_the_kafka_blocks_run_on_a_broker` runs them on the test run's
  Apache Kafka broker, its topics holding the feed of `examples/orders.jsonl`.
* `<!-- run: s3-shell -->`, `<!-- run: metastore-shell -->`, `<!-- run: postgres-shell -->`,
  `<!-- run: cluster-shell -->`: `bash` blocks that `test_docs_examples.py`'s slow tier runs
  a line at a time in bash (`Shell`), as a user types them: on moto's S3 server (the block's
  `export` placeholders given the server's key pair and endpoint), with the metastore service
  started in the background, on an embedded PostgreSQL that holds what the block names (its
  host and `PGPASSWORD` given that server's; the capture stopped by SIGINT once it has
  committed), and on a standalone cluster with the lake on S3 and a metastore service (the
  master's and the service's addresses given this run's).
* `<!-- run: debezium-python -->`: the Debezium guide's `DebeziumRunner` example, which the
  slow tier runs in a fresh Python on an embedded PostgreSQL and the run's Kafka broker (its
  `...` given a wait for the table's snapshot in Kafka).
* `<!-- run: python-api -->`, `<!-- run: kafka-python -->`, `<!-- run: broker-python -->`:
  Python examples that `tests/docs/test_readme_api.py` and `tests/docs/test_kafka_readme.py`
  run in fresh processes.
* `<!-- file: PATH -->`: a JSON block that shows a file of the repository: it must be that
  file's content.
* `<!-- not run: REASON -->`: a block that needs what a test run does not have (a fresh
  checkout, for the set-up itself); counted, so they stay few.

The README's first block (the two set-up commands, which CI itself runs: `.ci/run`) is the one
block left unmarked.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"

#: Languages whose blocks are commands or code: each must be marked.
CODE = {"bash", "console", "python", "sh", "shell"}
RUN_KINDS = {"cli", "kafka-cli", "sql", "python-api", "kafka-python", "broker-python",
             "s3-shell", "metastore-shell", "postgres-shell", "debezium-python",
             "cluster-shell"}
PROMPT = "$ .venv/bin/changelake "

_FENCE = re.compile(r"^```([\w-]*)\s*$")
_MARK = re.compile(r"^<!--\s*(run|not run|file):\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    mark: str | None  # "run" or "not run"
    detail: str  # the run kind, or the reason

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README first, then the site's pages in a fixed order: the README's tour and
    getting-started's run first, the guides after."""
    first = [README, DOCS / "getting-started.md"]
    rest = sorted(p for p in DOCS.rglob("*.md") if p not in first)
    return [*first, *rest]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        mark = _MARK.match(lines[i - 1]) if i else None
        found.append(Block(path, i + 1, opening.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           mark.group(1) if mark else None, mark.group(2) if mark else ""))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]  # after `changelake`
    stdout_to: str | None  # `> FILE`
    expected: tuple[str, ...]  # the output lines shown after it


def commands(block: Block) -> list[Command]:
    """The `$ .venv/bin/changelake ...` lines of a `cli` block with the output shown below
    each. Anything else after a prompt is refused: the tests run changelake only."""
    out: list[Command] = []
    current: list | None = None
    for line in block.text.splitlines():
        if line.startswith("$ "):
            if not line.startswith(PROMPT):
                raise AssertionError(f"{block.where}: only {PROMPT!r} commands run: {line}")
            words = shlex.split(line[len(PROMPT):])
            stdout_to = None
            if ">" in words:
                at = words.index(">")
                stdout_to = words[at + 1]
                words = words[:at] + words[at + 2:]
            current = [tuple(words), stdout_to, []]
            out.append(current)  # type: ignore[arg-type]
        elif current is None:
            raise AssertionError(f"{block.where}: output before any command: {line}")
        else:
            current[2].append(line)
    return [Command(argv, to, tuple(expected)) for argv, to, expected in out]


def _data_runs_sorted(lines: list[str]) -> list[str]:
    """Lines with each run of `{"data": ...}` lines sorted: the order of the updates within a
    frontier step is not part of the output's meaning (Spark's partitions decide it)."""
    out: list[str] = []
    run: list[str] = []
    for line in [*lines, None]:
        if line is not None and line.startswith('{"data"'):
            run.append(line)
            continue
        out.extend(sorted(run))
        run = []
        if line is not None:
            out.append(line)
    return out


def matches(expected: tuple[str, ...], actual: str) -> bool:
    """Whether the output `actual` is what the block shows (see the module docstring)."""
    got = [line for line in actual.splitlines() if line.strip()]
    want = [line for line in expected if line.strip()]
    if not any("..." in line for line in want):
        return _data_runs_sorted(got) == _data_runs_sorted(want)
    pattern = "".join(r"(?:.*\n)*?" if line == "..." else
                      ".*".join(map(re.escape, line.split("..."))) + r"\n" for line in want)
    return re.fullmatch(pattern, "".join(f"{line}\n" for line in got)) is not None


def sql_statements(block: Block) -> list[str]:
    """The queries of a `sql` block: the `-e '...'` of its beeline command."""
    (queries,) = re.findall(r"-e '([^']*)'", block.text)
    return [q.strip() for q in queries.split(";") if q.strip()]
