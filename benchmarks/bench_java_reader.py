"""Java's reading of Debezium lines: this checkout's `DebeziumLine.java` against a revision's,
in one JVM, alternating.

The ingest's parse (`parse.java_items`) calls `DebeziumLine` once per line, inside a Spark job
whose other work (reading the text, the facts, the checkpoint) hides a change of
the reader's own speed in the machine's noise. This times the reader alone: both versions'
classes (compiled with `javac` against PySpark's jars, each in a class loader of its own) read
the same lines held in memory, in turns, `--rounds` rounds each (the first `--warm` not
counted, the JIT's warm-up). Printed: each version's median and least time a round, and the
ratio of this checkout's to the revision's.

The lines are `bench_ingest.py`'s feed (PostgreSQL, `--events` events). As a check, both
versions must read every line (none left to the Spark functions).

    python benchmarks/bench_java_reader.py --against 01eb334 --events 300000
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import write_feed

HARNESS = r"""
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.api.java.UDF1;

public class Harness {
    public static void main(String[] args) throws Exception {
        List<byte[]> lines = new ArrayList<>();
        for (String line : Files.readAllLines(Paths.get(args[0]), StandardCharsets.UTF_8)) {
            if (!line.isBlank()) lines.add(line.getBytes(StandardCharsets.UTF_8));
        }
        int rounds = Integer.parseInt(args[3]);
        UDF1<byte[], ?>[] readers = new UDF1[2];
        for (int v = 0; v < 2; v++) {
            URL classes = Paths.get(args[1 + v]).toUri().toURL();
            ClassLoader loader = new URLClassLoader(new URL[] {classes},
                                                    Harness.class.getClassLoader());
            readers[v] = (UDF1<byte[], ?>) loader.loadClass("changelake.jvm.DebeziumLine")
                .getConstructor().newInstance();
        }
        for (int round = 0; round < rounds; round++) {
            for (int turn = 0; turn < 2; turn++) {
                int v = round % 2 == 0 ? turn : 1 - turn;
                long start = System.nanoTime();
                int read = 0;
                for (byte[] line : lines) if (readers[v].call(line) != null) read++;
                long took = System.nanoTime() - start;
                System.out.println(v + " " + took + " " + read + " " + lines.size());
            }
        }
    }
}
"""


def _jars() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "jars" / "*")


def _compile(sources: list[Path], out: Path, classpath: str) -> None:
    out.mkdir(parents=True)
    subprocess.run(["javac", "-nowarn", "-cp", classpath, "-d", str(out), *map(str, sources)],
                   check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warm", type=int, default=4)
    args = parser.parse_args()
    if shutil.which("javac") is None:
        sys.exit("no javac: a JDK is needed")
    root = Path(__file__).resolve().parents[1]
    jvm = root / "src" / "changelake" / "spark" / "jvm"
    work = Path(tempfile.mkdtemp(prefix="bench-java-reader-"))
    try:
        archive = subprocess.run(["git", "-C", str(root), "archive", args.against,
                                  "src/changelake/spark/jvm"], check=True,
                                 capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(work / "rev", filter="data")
        jars = _jars()
        _compile(sorted(jvm.glob("*.java")), work / "now", jars)
        _compile(sorted((work / "rev" / "src/changelake/spark/jvm").glob("*.java")),
                 work / "then", jars)
        (work / "Harness.java").write_text(HARNESS)
        subprocess.run(["javac", "-nowarn", "-cp", jars, "-d", str(work / "harness"),
                        str(work / "Harness.java")], check=True, capture_output=True)
        feed = work / "feed.jsonl"
        write_feed(feed, args.events)
        done = subprocess.run(["java", "-cp", f"{work / 'harness'}:{jars}", "Harness",
                               str(feed), str(work / "now"), str(work / "then"),
                               str(args.rounds)], check=True, capture_output=True, text=True)
        times: dict[int, list[float]] = {0: [], 1: []}
        for i, line in enumerate(done.stdout.split("\n")):
            if not line:
                continue
            version, took, read, lines = map(int, line.split())
            assert read == lines, f"version {version} left {lines - read} of {lines} lines"
            if i // 2 >= args.warm:
                times[version].append(took / 1e6)
        print(f"{lines:,} Debezium lines, {args.rounds - args.warm} rounds each after "
              f"{args.warm} warm-up rounds")
        for version, name in ((0, "this checkout"), (1, args.against)):
            t = times[version]
            print(f"  {name:>14}: median {statistics.median(t):7.1f} ms, least "
                  f"{min(t):7.1f} ms a round")
        print(f"  this checkout / {args.against}: median "
              f"{statistics.median(times[0]) / statistics.median(times[1]):.2f}x, least "
              f"{min(times[0]) / min(times[1]):.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
