"""Reader throughput against the least any deduplicating, ordering reader must do.

1M distinct updates are written by the Writer (batches of 1,000, a progress statement every
10,000 updates), every message is delivered twice, and the log is shuffled. Baseline, on the
same log in the same run: put every update into a `set()` and sort the set by time. The Reader
does that plus protocol checking and frontier tracking; the figure to watch is the ratio
(aim: at least 0.5).

    .venv/bin/python benchmarks/bench_reader.py [--updates N] [--repeat R]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from changelake.protocol import Reader, Updates, Writer
from changelake.values import Record


def make_log(n: int, seed: int = 1) -> list:
    writer = Writer(batch_size=1000)
    log: list = []
    per_time = 10_000
    for start in range(0, n, per_time):
        t = start // per_time
        writer.extend((Record((("id", i), ("v", i % 7))), t, 1)
                      for i in range(start, min(n, start + per_time)))
        log += writer.finish_through(t)
    log += writer.close()
    log = log + log
    random.Random(seed).shuffle(log)
    return log


def baseline(log: list) -> int:
    seen: set = set()
    for m in log:
        if isinstance(m, Updates):
            seen.update(m.updates)
    return len(sorted(seen, key=lambda u: u[1]))


def reader(log: list) -> int:
    r = Reader()
    n = 0
    for m in log:
        for updates, _ in r.push(m):
            n += len(updates)
    assert r.is_closed
    return n


def timed(fn, log: list, repeat: int) -> tuple[float, int]:
    runs = []
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        n = fn(log)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    log = make_log(args.updates)
    delivered = sum(len(m.updates) for m in log if isinstance(m, Updates))
    base_s, base_n = timed(baseline, log, args.repeat)
    read_s, read_n = timed(reader, log, args.repeat)
    assert base_n == read_n == args.updates, (base_n, read_n)
    print(f"updates: {args.updates:,} distinct, {delivered:,} delivered, "
          f"{len(log):,} messages (shuffled), median of {args.repeat}")
    print(f"baseline set()+sort: {base_s:.3f} s  {delivered / base_s / 1e6:.2f} M updates/s")
    print(f"Reader:              {read_s:.3f} s  {delivered / read_s / 1e6:.2f} M updates/s")
    print(f"ratio Reader/baseline rate: {base_s / read_s:.2f} (aim >= 0.50)")


if __name__ == "__main__":
    main()
