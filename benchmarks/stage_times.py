"""Where a Spark run's time went, job by job and stage by stage, from its event log.

Wall time on these 2-core machines moves with the load; what the tasks of each stage took,
summed, moves less, and says which step of a run to work on: a stage's task time against
the baseline's (the plain write's) in the same log. Run a benchmark with Spark's event log on
(uncompressed, or compressed with Spark's default zstd), then read it here:

    python benchmarks/bench_ingest.py --source ydb --events 11000000 \\
        --conf spark.eventLog.enabled=true --conf spark.eventLog.dir=/tmp/events
    python benchmarks/stage_times.py /tmp/events/*/events_1_*

`--from-job` and `--to-job` keep one step's jobs (in a cold `bench_ingest.py` run, job 5 is
the plain write and the jobs after it the ingest), and `--sum` adds their tasks' time and CPU
time summed: a step's cost as one figure, to set against the plain write's.

Printed per job, in order: the driver's gap before it (planning, Python), its wall time, and
per stage the tasks, their summed time (and CPU and GC), the bytes read and written (input,
shuffle, output) and any spill. The jobs are Spark's numbers; which step of the run each is,
the benchmark's step lines say (how many jobs each step ran).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

MIB = 2**20


@dataclass
class Stage:
    """One stage's tasks, summed."""

    tasks: int = 0
    seconds: float = 0.0  # launch to finish, summed over tasks
    cpu: float = 0.0
    gc: float = 0.0
    input_mib: float = 0.0
    shuffle_read_mib: float = 0.0
    shuffle_write_mib: float = 0.0
    output_mib: float = 0.0
    spill_mib: float = 0.0  # to disk

    def add(self, info: dict[str, Any], metrics: dict[str, Any]) -> None:
        read = metrics.get("Shuffle Read Metrics") or {}
        self.tasks += 1
        self.seconds += (info["Finish Time"] - info["Launch Time"]) / 1000
        self.cpu += metrics.get("Executor CPU Time", 0) / 1e9
        self.gc += metrics.get("JVM GC Time", 0) / 1000
        self.input_mib += (metrics.get("Input Metrics") or {}).get("Bytes Read", 0) / MIB
        self.shuffle_read_mib += (read.get("Remote Bytes Read", 0)
                                  + read.get("Local Bytes Read", 0)) / MIB
        self.shuffle_write_mib += (metrics.get("Shuffle Write Metrics") or {}).get(
            "Shuffle Bytes Written", 0) / MIB
        self.output_mib += (metrics.get("Output Metrics") or {}).get("Bytes Written", 0) / MIB
        self.spill_mib += metrics.get("Disk Bytes Spilled", 0) / MIB


@dataclass
class Job:
    start: float  # seconds since the epoch
    stages: list[int]
    end: float | None = None


@dataclass
class Log:
    jobs: dict[int, Job] = field(default_factory=dict)
    stages: dict[int, Stage] = field(default_factory=lambda: defaultdict(Stage))


def event_lines(path: Path) -> list[bytes]:
    """The event log's lines: the file's, or those of its zstd frames (`.zstd`, Spark's
    default codec for event logs). Spark's lz4 and snappy framings are its own: refused."""
    if path.suffix in (".lz4", ".lzf", ".snappy"):
        raise SystemExit(f"{path}: compressed with {path.suffix[1:]}, which this reader does "
                         "not read: run with spark.eventLog.compress=false, or the zstd codec")
    if path.suffix in (".zstd", ".zst"):
        import pyarrow as pa

        with pa.CompressedInputStream(pa.OSFile(str(path)), "zstd") as stream:
            return stream.read().splitlines()
    return path.read_bytes().splitlines()


def read_log(path: Path) -> Log:
    """The jobs and the stages' summed tasks of one event log (JSON lines)."""
    log = Log()
    for number, line in enumerate(event_lines(path), 1):
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise SystemExit(f"{path}: line {number}: not a Spark event ({error})") from None
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            log.jobs[event["Job ID"]] = Job(event["Submission Time"] / 1000,
                                            list(event["Stage IDs"]))
        elif kind == "SparkListenerJobEnd":
            log.jobs[event["Job ID"]].end = event["Completion Time"] / 1000
        elif kind == "SparkListenerTaskEnd":
            log.stages[event["Stage ID"]].add(event["Task Info"],
                                              event.get("Task Metrics") or {})
    return log


def _within(number: int, first_job: int, last_job: int | None) -> bool:
    """Whether job `number` is among `first_job` to `last_job` (None: the last)."""
    return number >= first_job and (last_job is None or number <= last_job)


def report(log: Log, first_job: int = 0, last_job: int | None = None) -> list[str]:
    """One line per job from `first_job` on (to `last_job`), and one per stage of it that ran
    tasks."""
    out: list[str] = []
    previous: float | None = None
    for number in sorted(log.jobs):
        job = log.jobs[number]
        if not _within(number, first_job, last_job):
            continue
        gap = 0.0 if previous is None else job.start - previous
        took = (job.end or job.start) - job.start
        out.append(f"job {number:4}  after {gap:6.2f} s  wall {took:7.2f} s")
        for stage_id in job.stages:
            stage = log.stages.get(stage_id)
            if stage is None or not stage.tasks:
                continue  # skipped: its output was already there
            moved = ", ".join(f"{name} {mib:,.0f} MiB" for name, mib in (
                ("in", stage.input_mib), ("shuffle in", stage.shuffle_read_mib),
                ("shuffle out", stage.shuffle_write_mib), ("out", stage.output_mib),
                ("spilled", stage.spill_mib)) if mib >= 0.5)
            out.append(f"    stage {stage_id:4}  {stage.tasks:4} tasks  {stage.seconds:8.2f} s "
                       f"(cpu {stage.cpu:.2f}, gc {stage.gc:.2f})  {moved}")
        previous = job.end or job.start
    return out


def summed(log: Log, first_job: int, last_job: int | None) -> tuple[float, float]:
    """The task time and CPU time of the jobs `first_job` to `last_job` (None: the last),
    summed over their stages' tasks: a step of several jobs (the ingest's) as one figure."""
    stages = {s for number, job in log.jobs.items() if _within(number, first_job, last_job)
              for s in job.stages}
    ran = [log.stages[s] for s in stages if s in log.stages]
    return sum(s.seconds for s in ran), sum(s.cpu for s in ran)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="an uncompressed Spark event log file")
    parser.add_argument("--from-job", type=int, default=0, help="leave out the jobs before")
    parser.add_argument("--to-job", type=int, default=None, help="and the jobs after")
    parser.add_argument("--sum", action="store_true",
                        help="then the task and CPU time of those jobs, summed")
    args = parser.parse_args()
    log = read_log(args.log)
    print("\n".join(report(log, args.from_job, args.to_job)))
    if args.sum:
        seconds, cpu = summed(log, args.from_job, args.to_job)
        print(f"jobs {args.from_job}..{'' if args.to_job is None else args.to_job}: "
              f"tasks {seconds:.2f} s, cpu {cpu:.2f} s")


if __name__ == "__main__":
    main()
