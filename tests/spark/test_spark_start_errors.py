"""A Spark master or setting the JVM refuses (`--master bogus`, `--conf
spark.driver.memory=lots`): one `changelake: error:` line with the JVM's own reason (it was an
internal error, the reason only in the JVM's log), exit status 2, and no lake directory left
half-made. Each run is a JVM that stops at once: seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = [str(Path(sys.executable).parent / "changelake")]


@pytest.mark.parametrize(("args", "reason"), [
    (["--master", "bogus"], "Master must either be yarn or start with spark, k8s, or local"),
    (["--master", "local[1]", "--conf", "spark.driver.memory=lots"],
     "Invalid maximum heap size: -Xmxlots"),
])
def test_a_refused_master_or_setting_is_one_line(tmp_path: Path, args: list[str],
                                                 reason: str) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"data": {"a": 1}, "time": 0, "diff": 1}\n')
    lake = tmp_path / "lake"
    done = subprocess.run([*CLI, "ingest", "--lake", str(lake), "--table", "t", *args,
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("changelake: error: Spark did not start (--master ") and \
        reason in line and "the JVM's log: " in line, line
    assert not lake.exists()
