"""JSON lines, read within fixed bounds.

Every JSON-lines reader (Materialize CDC messages, the changes `encode` takes, Debezium and YDB
changefeeds) reads its lines here, so a hostile file meets the same two limits everywhere:

* a line holds at most `MAX_LINE_BYTES` (16 MiB, the bound on one Avro block too: see
  `ocf.py`). A longer line is not held in memory: it is skipped in bounded chunks and reported
  in its place, so a 1 GB line costs 16 MiB, and a lenient reader goes on with the next line;
* a JSON value nests at most `MAX_DEPTH` (128) arrays and objects. orjson parses up to 1024
  levels but writes at most 254, and rows are written back wrapped in a few more levels
  (`{"data": ...}`, Avro union branches), so a deeper value would be accepted here and fail
  far from its line when written; Python code that walks a value recursively stays far from
  the interpreter's recursion limit too.

What a line decodes to is bounded by its bytes, not by a budget of its own as an Avro block's
is (`avro_bounds.BLOCK_BUDGET`): orjson parses a line at once. Measured on CPython 3.11
(tracemalloc peak while `materialize.read_json_lines` reads one line of updates, the parsed
JSON and the frozen rows both alive): about 21 bytes a byte for narrow or empty rows, 34 for
rows of arrays of empty arrays; so a 16 MiB line may take about 350 to 560 MB.

Changefeed files are read as Spark's text reader reads them (`open_changefeed`): a file named
`.gz` or `.bz2` is decompressed, and one named for a codec only Hadoop has (`.deflate`, `.lz4`,
`.snappy`, `.zst`) is refused, on both paths, so that the local encoder and the Spark path
read the same lines; so is a file named as a copy in progress (`COPYING`), which Spark would
skip, and a `BOM` opening a file is dropped, as Spark drops it.
"""

from __future__ import annotations

import bz2
import gzip
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

MAX_LINE_BYTES = 16 * 2**20
MAX_DEPTH = 128
TOO_LONG = f"line longer than the maximum of {MAX_LINE_BYTES} bytes"
_SKIP_CHUNK = 2**20
_ORJSON_MAX_DEPTH = 254  # orjson.dumps refuses values nested deeper than this


#: Suffixes Spark's text reader decompresses (Hadoop's codecs, matched case-sensitively), with
#: how Python opens them; None: a codec Python does not read, refused.
COMPRESSED: dict[str, Any] = {".gz": gzip.open, ".bz2": bz2.open, ".deflate": None,
                              ".lz4": None, ".snappy": None, ".zst": None}


#: The end of a name Spark's file listing skips whatever a read asks (Hadoop's name for a copy
#: in progress), so that no path reads such a file. (The names it skips by default, starting
#: with `.` or `_`, the Spark path reads: `spark.changefeed.read.read_lines`.)
COPYING = "._COPYING_"


def unreadable(path: str | Path) -> str | None:
    """Why a changefeed file cannot be read (its name says a codec only Hadoop reads, or a
    copy in progress), or None."""
    if str(path).endswith(COPYING):
        return (f"named {COPYING}, a copy in progress, which Spark's reader skips: rename it "
                "once the copy is done")
    for suffix, opener in COMPRESSED.items():
        if str(path).endswith(suffix) and opener is None:
            return (f"compressed as {suffix} (by its name), which only Spark's reader would "
                    "decompress: decompress it, or compress it as .gz or .bz2")
    return None


def open_changefeed(path: str | Path) -> IO[bytes]:
    """A changefeed file's bytes, decompressed as Spark's text reader decompresses them. Raises
    `ValueError` for a codec only Hadoop reads; `OSError`, `EOFError` or `zlib.error` come
    later, from reading a corrupt compressed file."""
    reason = unreadable(path)
    if reason is not None:
        raise ValueError(reason)
    for suffix, opener in COMPRESSED.items():
        if str(path).endswith(suffix):
            return opener(path, "rb")  # type: ignore[no-any-return]
    return open(path, "rb")


class JsonError(ValueError):
    """A line that is not JSON, or nests deeper than `MAX_DEPTH`."""


#: The UTF-8 byte order mark. At the start of a file it is no part of the first line: Hadoop's
#: line reader (Spark's text reader) drops it there, and so does `numbered_lines`, so that
#: the local readers and the Spark path read the same first line (RFC 8259 lets a JSON
#: parser ignore it; orjson refuses it).
BOM = b"\xef\xbb\xbf"


def numbered_lines(source: IO[bytes] | Iterable[bytes]) -> Iterator[tuple[int, bytes | None]]:
    """The non-blank lines of a binary stream (or of an iterable of lines) with their 1-based
    numbers; None in place of a line longer than `MAX_LINE_BYTES`. A stream's leading `BOM`
    is dropped (an iterable's lines are records, not a file: it keeps them whole)."""
    readline = getattr(source, "readline", None)
    if readline is None:
        for number, line in enumerate(source, start=1):  # type: ignore[arg-type]
            if len(line) > MAX_LINE_BYTES:
                yield number, None
            elif line.strip():
                yield number, line
        return
    number = 0
    while True:
        line = readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM):]
        if len(line) > MAX_LINE_BYTES:
            while not line.endswith(b"\n"):  # skip the rest without holding it
                line = readline(_SKIP_CHUNK)
                if not line:
                    break
            yield number, None
        elif line.strip():
            yield number, line


_WRAP = _ORJSON_MAX_DEPTH - MAX_DEPTH


def loads(line: bytes | str) -> Any:
    """orjson.loads, refusing values nested deeper than `MAX_DEPTH`; raises `JsonError`."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise JsonError(f"not valid JSON: {error}") from None
    opening = line.count(b"[" if isinstance(line, bytes) else "[") \
        + line.count(b"{" if isinstance(line, bytes) else "{")
    if opening > MAX_DEPTH:
        # Cheap and exact: orjson writes at most 254 levels, so the value fits MAX_DEPTH iff
        # it can be written inside 254 - MAX_DEPTH more levels (C speed, no Python recursion).
        wrapped = value
        for _ in range(_WRAP):
            wrapped = [wrapped]
        try:
            orjson.dumps(wrapped)
        except orjson.JSONEncodeError:
            raise JsonError(f"JSON nested deeper than the maximum of {MAX_DEPTH} levels") \
                from None
    return value
