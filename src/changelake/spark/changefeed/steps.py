"""How a step of the Spark path runs its Spark jobs: a failure read for what it means, and
each step's time.

A job that fails in `guard` failed on the input (a value Spark refuses), so the batch is
`Unsupported` and goes to the Python path, which converts it or names its bad line. A job that
fails because Spark ran short of memory or disk is no fault of the input, and no other path
would fare better: that is a `ChangelakeError` saying so. `Steps` logs each step's seconds
and Spark jobs at debug level (`benchmarks/bench_ingest.py` prints them).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from changelake.errors import ChangelakeError
from changelake.spark.changefeed.dispatch import Unsupported
from changelake.spark.errors import input_error

log = logging.getLogger(__name__)


class Steps:
    """Seconds and Spark jobs per step, logged at debug level (`benchmarks/bench_ingest.py`
    prints them). Nothing is asked of Spark without it: the job ids come to Python one round
    trip each, up to a thousand (the jobs Spark keeps) per step in a long-lived session."""

    def __init__(self, spark: SparkSession) -> None:
        self._on = log.isEnabledFor(logging.DEBUG)
        self._tracker = spark.sparkContext.statusTracker()
        self._at = time.perf_counter()
        self._job = self._last_job()

    def _last_job(self) -> int:
        return max(self._tracker.getJobIdsForGroup(), default=-1) if self._on else -1

    def done(self, step: str) -> None:
        if not self._on:
            return
        now, job = time.perf_counter(), self._last_job()
        log.debug("step %-22s %6.2f s %2d jobs", step, now - self._at, job - self._job)
        self._at, self._job = now, job


#: What in a failed job's text says that Spark ran short of memory or disk (or went down
#: after that), which no other path would fare better with.
_SHORT_OF = ("OutOfMemoryError", "No space left on device", "SparkContext was shut down")


def guard(action: Any) -> Any:
    """Run one of the path's Spark actions (the parse's job, the images' inference, a
    checkpoint, the lake commit's write of a deferred conversion:
    `conversion.DeferredChecks.write`). A failure in it is a value Spark refuses (`from_json`
    in FAILFAST mode, a cast, base64, a decimal wider than 8 bytes): `Unsupported`, so that
    the Python path converts the batch or names the bad line.

    Spark short of memory or disk is no refusal: the Python path holds more of the batch at once
    (and a JVM out of memory in local mode is going down), so that is a `ChangelakeError`
    saying so, not a switch to the Python path that would hide it."""
    try:
        return action()
    except (Py4JJavaError, PySparkException) as error:
        raise _failure(error) from None


def _failure(error: Exception) -> Exception:
    """What a failed checking action means (see `guard`)."""
    unreadable = input_error(error)  # a file Spark's reader cannot read: no path reads it
    if unreadable is not None:
        return unreadable
    lines = [line.strip() for line in str(error).strip().splitlines()]
    short = next((line for line in lines if any(m in line for m in _SHORT_OF)), None)
    if short is not None:
        return ChangelakeError(
            f"Spark ran short converting the changefeed ({short[:200]}); not a problem of the "
            "input: give Spark more memory (`--conf spark.driver.memory=4g`) or disk, or "
            "convert fewer files at once")
    first = lines[0][:200] if lines else ""
    return Unsupported(f"bad: a value Spark refuses ({first})")
