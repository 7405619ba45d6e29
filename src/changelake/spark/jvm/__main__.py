"""`python -m changelake.spark.jvm`: build the packaged jar (`PACKAGED`) with Maven, the JUnit
tests of the Java rules included, unless it is of these sources already. `scripts/install.sh`
runs it; run it alone after changing the Java code. One line and status 1 where the build
fails."""

from __future__ import annotations

import sys
import time

from changelake.errors import ChangelakeError
from changelake.spark.jvm import PACKAGED, _digest, build, is_current, recorded_digest


def main() -> int:
    """Build the packaged jar if it is missing or stale; the exit status."""
    digest = _digest()
    if is_current(recorded_digest(PACKAGED), digest):
        print(f"changelake setup: {PACKAGED.name} is of these sources already ({digest})")
        return 0
    started = time.monotonic()
    try:
        build(PACKAGED, digest, tests=True)
    except ChangelakeError as e:
        print(f"changelake setup: {e}", file=sys.stderr)
        return 1
    print(f"changelake setup: built {PACKAGED} ({digest}, JUnit tests passed) in "
          f"{time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
