"""The Python API examples run as written: extracted from docs/reference/python.md (the blocks
marked `<!-- run: python-api -->`, once the README's API section) and executed one after
another in one namespace, by a fresh Python process (its own Spark, as a user's would be) in a
copy of examples/materialize/ (seed 000's schema and changefeed), as the page says."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.seeds import seed000_changefeed, seed000_schema

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "python.md"
EXAMPLES = ROOT / "examples" / "materialize"
MARK = "<!-- run: python-api -->"

RUNNER = """
import json, re, sys
from pathlib import Path

page = Path(sys.argv[1]).read_text()
namespace = {}
for block in re.findall(sys.argv[2] + r"\\n```python\\n(.*?)```", page, re.S):
    exec(compile(block, sys.argv[1], "exec"), namespace)
result, table = namespace["result"], namespace["table"]
print(json.dumps({
    "frontier": result.frontier.to_json(),
    "as_of_5": [r.asDict() for r in table.as_of(5).collect()],
}))
"""


def api_examples() -> list[str]:
    return re.findall(re.escape(MARK) + r"\n```python\n(.*?)```", PAGE.read_text(), re.S)


def test_the_examples_files_are_seed_000():
    """examples/materialize/ is the Materialize docs' example as the seed text gives it (the
    doubled `{{` that opens the docs' first line made one)."""
    assert json.loads((EXAMPLES / "schema.json").read_text()) == seed000_schema()
    assert (EXAMPLES / "log" / "changefeed.jsonl").read_text() == \
        seed000_changefeed().replace("{{", "{", 1)


def test_the_page_has_one_example_per_package():
    heads = [block.splitlines()[0] for block in api_examples()]
    assert heads == ["from changelake.protocol import Reader, Writer",
                     "from changelake.spark import build_session, decode, encode, register, "
                     "split_messages",
                     "from changelake.lake import Lake, lake_session"]


@pytest.mark.spark
def test_the_api_examples_run_as_written(tmp_path):
    shutil.copytree(EXAMPLES, tmp_path, dirs_exist_ok=True)
    done = subprocess.run([sys.executable, "-c", RUNNER, str(PAGE), re.escape(MARK)],
                          cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    # The protocol example: duplicated and reordered messages, each update once, in order.
    assert lines[:2] == ["Antichain([1]) []",
                         "Antichain([4]) [(('apple', 5), 1, 1), (('apple', 7), 3, 1), "
                         "(('apple', 5), 3, -1)]"], done.stdout
    summary = json.loads(lines[-1])
    assert summary == {"frontier": [10], "as_of_5": [{"id": 5, "price": 10}]}
    written = [p for p in (tmp_path / "copy").iterdir() if p.name[0] not in "._"]
    assert written, "encode's messages were written by the data source"
