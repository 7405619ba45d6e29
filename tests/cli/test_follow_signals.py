"""`ingest --follow` stops on SIGINT (Ctrl-C) as on SIGTERM: the round or micro-batch in
flight commits, then the command exits 0 (`cli/follow.py`).

Starting a SparkContext sets its own SIGINT handler (cancel every job, raise
KeyboardInterrupt), over the follow's: found with real Debezium
(`benchmarks/bench_debezium_freshness.py` stops its `ingest --follow --kafka --from debezium`
with SIGINT), where a Ctrl-C'd follow ended mid-round with exit 1 and a traceback. The follow
sets its handlers again once the lake is open. Here without Spark: a stand-in lake that sets a
handler as a SparkContext does, and a stand-in follow loop that gets a SIGINT mid-round."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import changelake.cli.follow as cli_follow
import changelake.lake.follow_changefeed as follow_changefeed
from changelake.lake.follow import FollowReport
from changelake.lake.identifier import TableIdentifier


def spark_like_lake(*_args: Any, **_kwargs: Any) -> Any:
    """A lake whose opening sets a SIGINT handler as `SparkContext` does."""
    def cancel_and_interrupt(_signal: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, cancel_and_interrupt)
    return SimpleNamespace(spark=SimpleNamespace(stop=lambda: None))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_round_stops_the_changefeed_follow_after_the_round(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sig: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    rounds: list[bool] = []

    def one_round(lake: Any, table: Any, bootstrap: str, topics: Any, *, control: Any,
                  **_options: Any) -> FollowReport:
        os.kill(os.getpid(), sig)  # mid-round: the handler only asks the loop to stop
        rounds.append(control.stopping.is_set())
        return FollowReport(str(table), 1, 1, "")

    monkeypatch.setattr(cli_follow, "open_lake", spark_like_lake)
    monkeypatch.setattr(cli_follow, "check_topics", lambda *_args: None)
    monkeypatch.setattr(follow_changefeed, "follow_changefeed_topics", one_round)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    cli_follow.follow_changefeed(tmp_path / "lake", None, "local[1]", {},
                                 TableIdentifier.parse("t"), ("id",), "debezium", None, False,
                                 "127.0.0.1:9", ("cdc", "cdc.transaction"), None, 1.0, None,
                                 False, None)
    assert rounds == [True]
    assert "stopped after 1 round(s), 1 committed" in capsys.readouterr().err
    assert {s: signal.getsignal(s) for s in before} == before  # put back
