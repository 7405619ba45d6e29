"""The README's Python API examples run as written: extracted from the README itself and
executed one after another in one namespace, by a fresh Python process (its own Spark, as a
user's would be) in a directory holding seed 000's schema and changefeed, as the README
says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from seeds import seed000_changefeed, seed000_schema

README = Path(__file__).resolve().parents[1] / "README.md"

RUNNER = """
import json, re, sys
from pathlib import Path

section = Path(sys.argv[1]).read_text()
section = section[section.index("## Python API"):]
section = section[: section.index("\\n## ", 1)]
namespace = {}
for block in re.findall(r"```python\\n(.*?)```", section, re.S):
    exec(compile(block, sys.argv[1], "exec"), namespace)
result, table = namespace["result"], namespace["table"]
print(json.dumps({
    "frontier": result.frontier.to_json(),
    "as_of_5": [r.asDict() for r in table.as_of(5).collect()],
}))
"""


def api_examples() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Python API"):]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_has_one_example_per_package():
    heads = [block.splitlines()[0] for block in api_examples()]
    assert heads == ["from changelake.protocol import Reader, Writer",
                     "from changelake.spark import build_session, decode, encode, register, "
                     "split_messages",
                     "from changelake.lake import Lake, lake_session"]


@pytest.mark.spark
def test_the_readme_api_examples_run_as_written(tmp_path):
    (tmp_path / "schema.json").write_text(json.dumps(seed000_schema()))
    (tmp_path / "log").mkdir()
    # The docs print the changefeed's first line with a doubled `{{`; a real log has one.
    changefeed = seed000_changefeed().replace("{{", "{", 1)
    (tmp_path / "log" / "changefeed.jsonl").write_text(changefeed)
    done = subprocess.run([sys.executable, "-c", RUNNER, str(README)], cwd=tmp_path,
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
