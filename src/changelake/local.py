"""The local (pure-Python) engine behind `changelake decode` and `changelake encode`.

They stream: input is read message by message and output is written as soon as it is final,
so memory stays bounded by what the protocol holds unfinished, not by the size of the log.
"""

from __future__ import annotations

import gc
import io
import os
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, islice, repeat
from operator import le
from pathlib import Path
from typing import IO, Any

import orjson

from changelake.durable import replaced_whole
from changelake.errors import ChangelakeError, InputError, Location
from changelake.formats import avro_values as av
from changelake.formats import lines as jsonl
from changelake.formats.materialize import (
    CdcSchema,
    SetAside,
    UpdateTooLarge,
    expand_paths,
    read_all,
    write_json_lines,
    write_ocf,
)
from changelake.formats.tableschema import TableSchema, read_table_json
from changelake.protocol import Antichain, Message, Reader, Rejected, Update, Writer
from changelake.protocol.time import MAX_TIME, check_time
from changelake.text import short
from changelake.values import Record, freeze, thaw

_PLAIN = frozenset({str, int, bool, type(None)})


def _plain_row(data: Any) -> dict[str, Any] | None:
    """`thaw(data, json_safe=True)` for the common row, a Record of scalars with no NaN or
    infinity, without a call per value; None for any other value."""
    if type(data) is not Record:
        return None
    row = dict(data)
    for value in row.values():
        kind = type(value)
        if kind is float:
            if value - value != 0.0:  # NaN or an infinity: thaw spells those as text
                return None
        elif kind not in _PLAIN:
            return None
    return row


def update_line(update: Update) -> bytes:
    """One update as `decode` prints it: `{"data": ..., "time": T, "diff": D}`."""
    data, time, diff = update
    row = _plain_row(data)
    if row is None:
        row = thaw(data, json_safe=True)
    return orjson.dumps({"data": row, "time": time, "diff": diff})


_NEWLINE = orjson.Fragment(b"\n")
"""Between two lines in `update_lines`' one array: compact orjson output has no other newline
byte (a newline in a string is written escaped), so the array splits back exactly."""


_LINE_KEYS = ("data", "time", "diff")


def _thaw_nested(value: Any) -> Any:
    """orjson's `default` in `update_lines`: a Record inside a row, as `thaw` writes it."""
    if type(value) is Record:
        return thaw(value, json_safe=True)
    raise TypeError


def update_lines(updates: Sequence[Update]) -> list[bytes]:
    """`[update_line(u) for u in updates]`, with one `orjson.dumps` for them all: the lines
    in one array separated by raw newlines (`_NEWLINE`), split back. A row's nested Records
    are thawed by orjson's `default`; orjson writes NaN and the infinities as null, where
    `update_line` writes their text, so a line with a null is made again by `update_line`."""
    if not updates:
        return []
    datas, times, diffs = zip(*updates, strict=True)
    if set(map(type, datas)) == {Record}:
        rows = map(dict, datas)
    else:
        rows = (dict(d) if type(d) is Record else thaw(d, json_safe=True) for d in datas)
    lines = map(dict, map(zip, repeat(_LINE_KEYS), zip(rows, times, diffs, strict=True)))
    items = list(chain.from_iterable(zip(lines, repeat(_NEWLINE))))
    blob = orjson.dumps(items, default=_thaw_nested)
    lines = blob[1:-3].split(b",\n,")  # "[" line ",\n," ... line ",\n]"
    if b"null" in blob:
        for i, line in enumerate(lines):
            if b"null" in line:
                lines[i] = update_line(updates[i])
    return lines


def frontier_line(frontier: Antichain) -> bytes:
    return orjson.dumps({"frontier": frontier.to_json()})


@dataclass(slots=True)
class DecodeReport:
    """What a decode saw besides the history: for the summary on stderr."""

    frontier: Antichain
    updates: int = 0
    set_aside: list[SetAside] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    waiting_for: str | None = None


def write_history(out: IO[bytes], batches: Iterable[tuple[list[Update], Antichain]],
                  start: Antichain) -> tuple[Antichain, int]:
    """The decode output contract: each batch's updates in time order (ties broken by the
    serialized line, so output is deterministic), then its frontier; always a final frontier."""
    frontier, count, last_was_frontier = start, 0, False
    for updates, new_frontier in batches:
        if updates:
            lines = update_lines(updates)
            times = [update[1] for update in updates]
            if not all(map(le, times, islice(times, 1, None))):  # in time order, stably
                order = sorted(range(len(times)), key=times.__getitem__)
                lines = [lines[i] for i in order]
                times = [times[i] for i in order]
            start_at = 0
            for n in Counter(times).values():  # one pass; a time's lines are consecutive
                group = lines[start_at:start_at + n]
                start_at += n
                group.sort()
                group.append(b"")
                out.write(b"\n".join(group))
            count += len(lines)
        out.write(frontier_line(new_frontier) + b"\n")
        frontier, last_was_frontier = new_frontier, True
    if not last_was_frontier:
        out.write(frontier_line(frontier) + b"\n")
    out.flush()
    return frontier, count


def load_reader(state: Path, *, strict: bool) -> Reader:
    """A Reader restored from a state file written by `save_reader`."""
    try:
        saved = jsonl.loads(state.read_bytes())
        reader = Reader.restore(saved, data_from_json=freeze)
    except ValueError as error:  # JsonError too
        raise InputError(f"not a reader state file: {error}", Location(str(state))) from None
    reader.strict = strict
    return reader


def sync_output(out: IO[bytes]) -> None:
    """Flush `out` to the disk if it is a regular file (stdout redirected to one), so a state
    saved after it never says "printed" of history a power loss took back. A pipe, a terminal
    or an in-memory buffer has nothing to sync."""
    out.flush()
    try:
        fd = out.fileno()
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fsync(fd)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass


def save_reader(reader: Reader, state: Path) -> None:
    """Write the state atomically (temp file, then rename): a crash leaves the old state."""
    with replaced_whole(state) as fo:
        fo.write(orjson.dumps(reader.save(data_to_json=thaw)))


def decode_local(
    paths: list[str],
    out: IO[bytes],
    *,
    schema: CdcSchema | None = None,
    lenient: bool = False,
    since: Antichain | None = None,
    state: Path | None = None,
) -> DecodeReport:
    """Read Materialize CDC files with the reference Reader and write the recovered history.

    With `state`, the Reader resumes from that file (if it exists) and saves itself there at
    the end, so the next run prints only what is newly finished.
    """
    set_aside: list[SetAside] = []
    reader = start_reader(since=since, state=state, lenient=lenient)
    messages = read_all(paths, schema=schema, set_aside=set_aside.append if lenient else None)
    with young_collections_only():
        return decode_messages(reader, messages, out, state=state, set_aside=set_aside)


@contextmanager
def young_collections_only() -> Iterator[None]:
    """Python's cyclic garbage collector without its full collections, for a file's decode.

    The Reader holds every unfinished row, a `Record` (a tuple subclass, which the collector
    tracks for good), and rows accumulate for as long as no statement finishes their time (on
    a shuffled log: most of the file). Every full collection walks all of them: about a
    quarter of a decode's CPU time (300k rows, messages of 50, shuffled). Rows make no
    reference cycles; the young generations are still collected, so a cycle that is garbage
    while young goes as before, and an older one waits for the first full collection after
    the decode, when the thresholds are restored."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, 2**31 - 1)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, old)


def start_reader(*, since: Antichain | None, state: Path | None, lenient: bool) -> Reader:
    """The Reader a decode starts with: from `since`, or resumed from an existing `state`."""
    if since is not None:
        try:
            for time in since:
                check_time(time)
        except ValueError as error:
            raise InputError(f"--since: {error}") from None
    if state is not None and state.exists():
        if since is not None:
            raise InputError("--since and an existing --state file both say where to start")
        return load_reader(state, strict=not lenient)
    return Reader(since, strict=not lenient)


def decode_messages(
    reader: Reader,
    messages: Iterable[Message],
    out: IO[bytes],
    *,
    state: Path | None = None,
    set_aside: list[SetAside] | None = None,
) -> DecodeReport:
    """Push `messages` (from any source) through `reader`, write the history to `out` as the
    decode contract says (`write_history`), and save the reader to `state` at the end."""

    def batches() -> Iterator[tuple[list[Update], Antichain]]:
        for message in messages:
            yield from reader.push(message)

    frontier, count = write_history(out, batches(), reader.frontier)
    if state is not None:
        sync_output(out)  # what the state says was printed is on the disk before it is
        save_reader(reader, state)
    return DecodeReport(frontier, count, list(set_aside or []), reader.rejected,
                        reader.waiting_for())


def _changes_from_lines(
    paths: list[str], schema: CdcSchema, sink: Callable[[SetAside], None] | None,
    stdin: IO[bytes] | None,
) -> Iterator[tuple[str, Any, Location, int]]:
    """("change", (data, time, diff)) and ("finished", T) items from JSON lines, read within
    the bounds of `formats.lines`, with where each was read and its line's length."""
    sources: list[tuple[str, Callable[[], IO[bytes]]]] = []
    if not paths:
        if stdin is None:
            raise InputError("no input files and no standard input")
        sources.append(("<stdin>", lambda: stdin))
    for path in expand_paths(paths):
        sources.append((str(path), lambda path=path: path.open("rb")))  # type: ignore[misc]
    for name, open_ in sources:
        fo = open_()
        try:
            for number, line in jsonl.numbered_lines(fo):
                origin = Location(name, number)
                try:
                    if line is None:
                        raise ValueError(jsonl.TOO_LONG)
                    yield (*_parse_change(line, schema, origin), len(line))
                except ValueError as error:  # JsonError too
                    if sink is None:
                        raise InputError(str(error), origin) from None
                    sink(SetAside(origin, str(error),
                                  (line or b"").decode("utf-8", "replace")[:200]))
        finally:
            if fo is not stdin:
                fo.close()


def _parse_change(line: bytes, schema: CdcSchema, origin: Location) -> tuple[str, Any, Location]:
    obj = jsonl.loads(line)
    if isinstance(obj, dict) and set(obj) == {"finished"}:
        finished = check_time(obj["finished"])
        if finished == MAX_TIME:  # the frontier after it, MAX_TIME + 1, is not a long
            raise ValueError(f"finished must be below {MAX_TIME}, got {finished}")
        return "finished", finished, origin
    if not isinstance(obj, dict) or set(obj) != {"data", "time", "diff"}:
        raise ValueError('expected {"data": {...}, "time": T, "diff": D} or {"finished": T}')
    diff = obj["diff"]
    low, high = av.LONG_RANGE
    if type(diff) is not int or not low <= diff <= high:
        raise ValueError(f"diff must be a 64-bit integer, got {short(diff)}")
    av.to_avro_json(obj["data"], schema.data_type, schema.named, "data")  # type check
    data = freeze(obj["data"], schema.data_fields)
    return "change", (data, check_time(obj["time"]), diff), origin



#: An input line this long or longer is remembered (`EncodeReport.large`) until its time is
#: written, so that a refusal of its update as too large for a message can name the line. A
#: shorter one cannot make an update of 16 MiB (Avro JSON wraps a value in a few dozen bytes at
#: most): the few lines remembered are rows the Writer holds anyway.
LARGE_LINE = 64 * 2**10


@dataclass(slots=True)
class EncodeReport:
    messages: int = 0
    unfinished: int = 0
    set_aside: list[SetAside] = field(default_factory=list)
    #: Where the unwritten changes of long input lines (`LARGE_LINE`) were read, by (data, time).
    large: dict[tuple[Any, int], Location] = field(default_factory=dict)

    def located(self, error: UpdateTooLarge) -> UpdateTooLarge:
        """The refusal of an update too large for a message, said of the input line it came
        from when that is known."""
        data, time, _ = error.update
        where = self.large.get((data, time))
        return error if where is None else error.at(where)


def write_messages(
    messages: Iterable[Message], schema: CdcSchema | None, *, avro: Path | None,
    out: IO[bytes],
) -> int:
    """Messages to an Avro OCF file (`avro`), or as Avro-JSON lines to `out`, each message
    within the bound its readers keep (a larger one is cut into several; an update too large
    for any is an `UpdateTooLarge`). The file is written beside its place and renamed there
    when complete: input that fails half-way leaves no half-written file (nor clobbers an
    earlier one)."""
    if avro is not None:
        if schema is None:
            raise ChangelakeError("--avro needs the data schema (--schema)")
        with replaced_whole(avro) as fo:
            return write_ocf(fo, messages, schema)
    count = write_json_lines(out, messages, schema)
    out.flush()
    return count


def encode_local(
    paths: list[str],
    out: IO[bytes],
    *,
    schema: CdcSchema,
    close: bool,
    avro: Path | None = None,
    batch_size: int = 1024,
    lenient: bool = False,
    stdin: IO[bytes] | None = None,
) -> EncodeReport:
    """JSON-lines changes and `{"finished": T}` marks to Materialize CDC messages."""
    report = EncodeReport()
    messages = encode_messages(paths, schema=schema, close=close, batch_size=batch_size,
                               lenient=lenient, stdin=stdin, report=report)
    try:
        report.messages = write_messages(messages, schema, avro=avro, out=out)
    except UpdateTooLarge as error:
        raise report.located(error) from None
    return report


def encode_messages(
    paths: list[str],
    *,
    schema: CdcSchema,
    close: bool,
    batch_size: int = 1024,
    lenient: bool = False,
    stdin: IO[bytes] | None = None,
    report: EncodeReport,
) -> Iterator[Message]:
    """The messages `encode` writes, as they become final, for any destination (a file, stdout,
    a Kafka topic). Set-aside input and the unfinished count land in `report`."""
    writer = Writer(batch_size=batch_size)
    sink = report.set_aside.append if lenient else None
    large = report.large
    for kind, value, origin, length in _changes_from_lines(paths, schema, sink, stdin):
        try:
            if kind == "finished":
                yield from writer.finish_through(value, origin)
                if large:  # written, all of them: a refusal would have come while yielding
                    for key in [k for k in large if k[1] <= value]:
                        del large[key]
            else:
                writer.push(*value, origin=origin)
                if length >= LARGE_LINE:
                    large[value[0], value[1]] = origin
        except ChangelakeError as error:
            if sink is None:
                raise
            sink(SetAside(origin, error.reason))
    if close:
        yield from writer.close()
    report.unfinished = writer.unfinished


def load_table_schema(path: Path | None) -> TableSchema | None:
    """The `--table-schema` file, parsed (None when not given)."""
    if path is None:
        return None
    return TableSchema.from_json(read_table_json(path), str(path))


def encode_changefeed_job(
    paths: list[str],
    out: IO[bytes],
    *,
    source: str,
    keys: list[str] | None,
    table_schema: Path | None,
    close: bool,
    lenient: bool,
    schema: CdcSchema | None = None,
    avro: Path | None = None,
) -> EncodeReport:
    """A Debezium or YDB changefeed to Materialize CDC messages (see `changelake.convert`)."""
    from changelake.convert import encode_changefeed

    if not paths:
        raise InputError("--from debezium|ydb needs input files")
    parsed_schema = load_table_schema(table_schema)
    report = EncodeReport()
    messages = encode_changefeed(
        expand_paths(paths), source=source,  # type: ignore[arg-type]
        keys=keys, table_schema=parsed_schema, close=close, lenient=lenient,
        set_aside=report.set_aside.append,
    )
    report.messages = write_messages(messages, schema, avro=avro, out=out)
    return report
