"""The names users import are the functions and classes the Python API page shows
(docs/reference/python.md), and using the package leaves the caller's process environment
alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_public_names_are_the_functions_and_classes():
    import inspect

    from changelake.lake import Lake
    from changelake.protocol import Antichain, Reader, Writer
    from changelake.spark import Decoded, decode, encode, register, split_messages

    for function in (decode, encode, register, split_messages):
        assert inspect.isfunction(function), function
    for cls in (Decoded, Lake, Reader, Writer, Antichain):
        assert inspect.isclass(cls), cls
    assert decode.__module__ == "changelake.spark.decoder"
    assert encode.__module__ == "changelake.spark.encoder"


def test_importing_every_module_leaves_the_environment_alone():
    """In a fresh interpreter, so nothing this test session did can hide a change."""
    script = (
        "import os, pkgutil, importlib, changelake\n"
        "before = dict(os.environ)\n"
        "for m in pkgutil.walk_packages(changelake.__path__, 'changelake.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "keys = set(before) | set(os.environ)\n"
        "changed = {k for k in keys if before.get(k) != os.environ.get(k)}\n"
        "assert not changed, sorted(changed)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.spark
def test_build_session_restores_the_environment(spark):
    from changelake.spark.session import LAUNCH_ENVIRONMENT, build_session

    before = dict(os.environ)
    assert build_session("local[2]") is spark  # the running session, through the same path
    assert dict(os.environ) == before
    # The session's Python workers still run this interpreter.
    assert spark.sparkContext.pythonExec == os.environ.get(
        "PYSPARK_PYTHON", LAUNCH_ENVIRONMENT["PYSPARK_PYTHON"])


@pytest.mark.parametrize("since", [4, [4]])
def test_frontier_arguments_take_plain_values(since):
    """`since=4` and `since=[4]` mean the Antichain [4] wherever a frontier is taken."""
    from changelake.protocol import Antichain, Progress, Reader, Updates, Writer, collect

    assert Reader(since).frontier == Antichain([4])
    assert Writer(since=since).frontier == Antichain([4])
    messages = [Updates([("a", 5, 1)]), Progress.make([4], [6], [(5, 1)])]
    assert collect(messages, since).updates == [("a", 5, 1)]
    assert Reader([]).is_closed


def test_a_frontier_that_is_not_one_is_refused():
    from changelake.protocol import Reader

    for bad in ("4", -1, [1.5], {"t": 4}):
        with pytest.raises(ValueError, match=r"frontier|time"):
            Reader(bad)
