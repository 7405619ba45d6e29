"""The Performance page's plots (docs/performance.md), drawn from the figures the benchmarks
printed into the measurement log `benchmarks/README.md`, so a new run logged there gives new
plots: `python benchmarks/plot_figures.py` (matplotlib: `pip install -e '.[plots]'`) writes
`docs/img/startup.png` and `docs/img/ingest.png`.

The figures are read from the log's blocks as the scripts print them: `bench_startup.py`'s
lines (`  ingest --from debezium     with  13.65 s   without  18.53 s    0.74x the time`) and
the table of the Delta ingest on a quiet machine (`| 1.1M | 6.14 s | 22.49 s | ...`).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "benchmarks" / "README.md"
OUT = ROOT / "docs" / "img"

STARTUP = re.compile(r"^\s+(\S.*?\S)\s+with\s+([\d.]+) s\s+without\s+([\d.]+) s", re.M)
INGEST_SECTION = "Debezium ingest into Delta on a quiet machine"
INGEST_ROW = re.compile(r"^\| ([\d.]+M) \| ([\d.]+) s \| ([\d.]+) s \|", re.M)


def startup_figures(log: str) -> list[tuple[str, float, float]]:
    """(command, seconds with the class archive, seconds without), from the last block of
    `bench_startup.py` output in the log."""
    section = log[log.index("## Spark command start-up"):]
    section = section[: section.index("\n## ", 1)]
    return [(name, float(w), float(wo)) for name, w, wo in STARTUP.findall(section)]


def ingest_figures(log: str) -> list[tuple[str, float, float]]:
    """(events, plain Delta write seconds, ingest seconds) of the last quiet-machine Delta
    run logged."""
    section = log[log.rindex(INGEST_SECTION):]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    return [(n, float(plain), float(ingest)) for n, plain, ingest in INGEST_ROW.findall(section)]


def plot(out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = LOG.read_text()
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def bars(name: str, title: str, xlabel: str, labels: list[str],
             upper: tuple[str, list[float], str], lower: tuple[str, list[float], str]) -> None:
        """Two bars a row (`upper` above `lower`: label, values, colour), saved as NAME.png."""
        fig, ax = plt.subplots(figsize=(7, 3.4))
        ys = range(len(labels))
        for shift, (label, values, color) in ((0.2, upper), (-0.2, lower)):
            ax.barh([y + shift for y in ys], values, height=0.4, label=label, color=color)
        ax.set_yticks(list(ys), labels)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, fontsize=8,
                  frameon=False)
        fig.tight_layout()
        written.append(out / f"{name}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    figures = startup_figures(log)
    bars("startup", "Spark command start-up", "seconds, a tiny input (median of 5, 2 cores)",
         [n for n, _, _ in figures],
         ("without the class archive", [wo for _, _, wo in figures], "#bbbbbb"),
         ("with it (changelake jvm-archive)", [w for _, w, _ in figures], "#3f6fb5"))
    figures = ingest_figures(log)
    bars("ingest", "Debezium ingest into a new Delta table",
         "seconds (2 cores, a quiet machine)", [f"{n} events" for n, _, _ in figures],
         ("changelake ingest --from debezium (Delta)", [i for _, _, i in figures], "#3f6fb5"),
         ("a plain Delta write of the same rows", [p for _, p, _ in figures], "#bbbbbb"))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where the PNG files go")
    args = parser.parse_args()
    for path in plot(args.out):
        print(path)


if __name__ == "__main__":
    main()
