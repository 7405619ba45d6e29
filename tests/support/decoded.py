"""What a `decode` printed, split into the parts a test can compare."""

from __future__ import annotations


def decoded_history(output: str | bytes) -> tuple[list, str | bytes]:
    """What a `decode` printed: its update lines and its last line (the final frontier). The
    frontiers it passes on the way depend on how the progress statements cut time and how the
    partitions' records arrived; the updates and the last line do not."""
    lines = output.splitlines()
    frontier: str | bytes = b'{"frontier"' if isinstance(output, bytes) else '{"frontier"'
    return [line for line in lines if not line.startswith(frontier)], lines[-1]
