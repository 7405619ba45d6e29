"""How commands report on stderr the input they set aside in lenient mode: files' lines and
messages (`decode`, `encode`), and topics' records (`ingest --kafka --lenient`)."""

from __future__ import annotations

from typing import Any

import click


def report_set_aside(set_aside: list, rejected: list) -> None:
    """A line per input set aside or rejected, then their count."""
    for item in set_aside:
        click.echo(f"changelake: set aside: {item.location}: {item.reason}", err=True)
    for item in rejected:
        click.echo(f"changelake: set aside: {item.error}", err=True)
    if set_aside or rejected:
        click.echo(f"changelake: {len(set_aside) + len(rejected)} input(s) set aside "
                   "(lenient mode)", err=True)


def report_topic_set_aside(read: Any, dead_letter_topic: str | None) -> None:
    """`ingest --kafka --lenient`: a line per record set aside (the report's sample), the
    total, and how many went to the dead-letter topic."""
    for item in read.set_aside:
        click.echo(f"changelake: set aside: {item.location}: {item.reason}", err=True)
    if read.set_aside_count:
        more = read.set_aside_count - len(read.set_aside)
        click.echo(f"changelake: {read.set_aside_count} record(s) set aside (lenient mode)"
                   + (f", {more} not listed" if more > 0 else ""), err=True)
    if dead_letter_topic is not None and read.dead_lettered:
        click.echo(f"changelake: {read.dead_lettered} record(s) produced to dead-letter topic "
                   f"{dead_letter_topic}", err=True)
