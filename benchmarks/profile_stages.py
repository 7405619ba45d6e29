"""Where each Spark stage's CPU went, by kind of work, from a Java Flight Recorder profile.

`stage_times.py` says which stage of a run takes the time; this says what its tasks were
doing: each execution sample of an executor thread (in local mode, the driver's JVM) is put
in the stage running when it was taken (by the event log's stage submission and completion
times) and named by the first frame, from the top of its stack, that one of `KINDS` claims
(or by one of `OWNERS`, anywhere in it).
Run a benchmark with the recorder and the event log on, then read both:

    python benchmarks/bench_ingest.py --source ydb --events 11000000 \\
        --conf "spark.driver.extraJavaOptions=-XX:+UseParallelGC \\
                -XX:StartFlightRecording=filename=/tmp/run.jfr,settings=profile" \\
        --conf spark.eventLog.enabled=true --conf spark.eventLog.dir=/tmp/events
    python benchmarks/profile_stages.py /tmp/run.jfr /tmp/events/*/events_1_*

(The option replaces the session's own `spark.driver.extraJavaOptions`, so the collector the
session picks, `-XX:+UseParallelGC`, is named again.) Stages running at the same time share
their samples; the ingest's run one after another. Samples are a share of the stage's, not
seconds: set them against `stage_times.py`'s task time.
"""

from __future__ import annotations

import argparse
import subprocess
from collections import Counter
from datetime import datetime
from pathlib import Path

import orjson

from stage_times import event_lines

#: Kinds of work, each by the substrings of the frames it claims; the first kind whose
#: pattern a frame holds, from the top of the stack down, names the sample.
KINDS: dict[str, tuple[str, ...]] = {
    "parquet": ("parquet",),
    "kryo": ("kryo", "Kryo"),
    "lz4": ("lz4", "LZ4"),
    "keyed conversion": ("KeyedConversion",),
    "sort": ("Sorter", "TimSort", "sort_addToSorter", "RadixSort", "UnsafeSorterSpill"),
    "shuffle write": ("ShuffleWriter", "DiskBlockObjectWriter"),
    "shuffle read": ("ShuffleBlockFetcher", "BlockStoreShuffleReader"),
    "json parse (java)": ("YdbLine", "DebeziumLine", "DebeziumImage", "jackson"),
    "text read": ("LineReader",),
    "decimal": ("Decimal", "BigInteger", "BigDecimal"),
    "xxhash": ("XXH64",),
    "murmur3": ("Murmur3",),
    "hash join": ("HashedRelation", "BytesToBytesMap"),
    "row checksum": ("RowBasedChecksum", "UnsafeRowChecksum"),
    "generated code": ("GeneratedClass", "UnsafeRowWriter", "UnsafeWriter"),
}


#: Kinds that own whatever they call (a row checksum hashes with XXH64): anywhere in the
#: stack, they name the sample first.
OWNERS = ("row checksum",)


def kind_of(frames: list[str]) -> str:
    for kind in OWNERS:
        if any(p in frame for frame in frames for p in KINDS[kind]):
            return kind
    for frame in frames:
        for kind, patterns in KINDS.items():
            if any(p in frame for p in patterns):
                return kind
    return "other"


def stage_windows(event_log: Path) -> dict[int, tuple[float, float]]:
    """Each completed stage's (submission, completion) in epoch milliseconds."""
    windows = {}
    for line in event_lines(event_log):
        event = orjson.loads(line)
        if event["Event"] == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            windows[info["Stage ID"]] = (info["Submission Time"], info["Completion Time"])
    return windows


def samples(recording: Path) -> list[tuple[float, list[str]]]:
    """The executor threads' execution samples: (epoch milliseconds, frames from the top)."""
    text = subprocess.run(["jfr", "print", "--json", "--stack-depth", "64", "--events",
                           "jdk.ExecutionSample", str(recording)],
                          check=True, capture_output=True).stdout
    out = []
    for event in orjson.loads(text)["recording"]["events"]:
        values = event["values"]
        thread = (values.get("sampledThread") or {}).get("javaName") or ""
        if "Executor task launch" not in thread:
            continue
        at = datetime.fromisoformat(values["startTime"].replace("Z", "+00:00"))
        trace = values.get("stackTrace") or {"frames": []}
        out.append((at.timestamp() * 1000, [f["method"]["type"]["name"] + "." + f["method"]["name"]
                                            for f in trace["frames"]]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path, help="a Flight Recorder file (.jfr)")
    parser.add_argument("log", type=Path, help="the run's Spark event log")
    parser.add_argument("--least", type=int, default=200,
                        help="leave out stages with fewer samples (default 200)")
    args = parser.parse_args()
    windows = stage_windows(args.log)
    taken = samples(args.recording)
    for stage, (start, end) in sorted(windows.items()):
        kinds = Counter(kind_of(frames) for at, frames in taken if start <= at <= end)
        total = sum(kinds.values())
        if total < args.least:
            continue
        shares = "  ".join(f"{kind} {100 * n / total:.0f}%" for kind, n in kinds.most_common()
                           if 100 * n / total >= 0.5)
        print(f"stage {stage:4}  {total:6} samples  {shares}")


if __name__ == "__main__":
    main()
