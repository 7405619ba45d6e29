"""Writing Materialize CDC messages: Avro datums and JSON lines within the readers' bounds (a
message too large for one datum or line is cut into several), to OCF files and JSON-lines files."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

import fastavro
import orjson

from changelake.errors import InputError, Location, SchemaError
from changelake.formats import avro_bounds, ocf
from changelake.formats import lines as jsonl
from changelake.formats.materialize.schema import CdcSchema
from changelake.formats.materialize.values import message_to_avro_json, message_to_plain
from changelake.protocol.antichain import Antichain
from changelake.protocol.messages import Message, Progress, Update, Updates


class UpdateTooLarge(InputError):
    """An update that no message can hold: alone in a message it takes `size` bytes as
    `carrier` ("an Avro datum", "a JSON line"), more than `bound`, the most the readers take
    (`ocf.MAX_BLOCK_BYTES`, `lines.MAX_LINE_BYTES`). It carries the update, so that a caller
    that knows where the update came from says so in its own words (`encode`: the input's
    file and line; the capture: the table, the row's key and its transaction); without one,
    it names the update's time, its size and the bound."""

    def __init__(self, update: Update, size: int, bound: int, carrier: str,
                 location: Location | None = None) -> None:
        self.update, self.size, self.bound, self.carrier = update, size, bound, carrier
        what = "an Avro block" if "Avro" in carrier else "a JSON line"
        limit = (f"the readers refuse a block that may decode to more than {bound >> 20} MiB"
                 if carrier.startswith("decoded") else
                 f"the readers refuse {what} over 16 MiB")
        super().__init__(
            f"an update at time {update[1]} takes {size} bytes as {carrier} of its own, more "
            f"than one message may hold ({bound} bytes: {limit})"
            "; nothing of the output is kept: make the row smaller", location)

    def at(self, location: Location | None) -> UpdateTooLarge:
        """The same refusal, said of where the update was read."""
        return UpdateTooLarge(self.update, self.size, self.bound, self.carrier, location)


#: Avro binary of an updates message: union branch 0, the array's blocks (a count, the items),
#: the array's end. fastavro writes an array as one block.
_BRANCH_0, _ARRAY_END = b"\x00", b"\x00"
#: Avro JSON of an updates message, around its updates (separated by commas).
_JSON_HEAD, _JSON_TAIL = b'{"array":[', b"]}"


def avro_datums(messages: Iterable[Message], schema: CdcSchema, *,
                bound: int = ocf.MAX_DATUM_BYTES,
                datum: Callable[[Message], Any] | None = None) -> Iterator[bytes]:
    """The messages as Avro datums (binary, the CDC union), each of at most `bound` bytes, so
    that `ocf.write_container` can put each in a block the readers take. A message that
    encodes to more is cut: the updates of one into as many datums as they need (a progress
    statement counts updates, not messages, so any cut of a batch says the same), a progress
    statement into statements over consecutive parts of its interval. An update that takes
    more than `bound` alone is an `UpdateTooLarge`, raised before any datum of its message.

    A message is encoded whole first, and only one over the bound is encoded again update by
    update: the common case costs one encoding. `datum` makes a message's fastavro value (an
    updates message's: a list aligned with its updates; default `_python_datum`). Values that
    do not fit the schema raise fastavro's `ValueError` or `TypeError`."""
    parsed = schema.parsed
    value_of = datum if datum is not None else (lambda m: _python_datum(m, schema))
    cost, budget = schema.cost, avro_bounds.BLOCK_BUDGET

    def encode(value: Any) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, value)
        return out.getvalue()

    for message in messages:
        value = value_of(message)
        encoded = encode(value)
        if len(encoded) <= bound and cost.weigh(encoded) <= budget:
            del value  # freed now, not while the caller writes the datum (cache-warm reuse)
            yield encoded
        elif isinstance(message, Updates):
            # Each update alone, `[item]`: branch 0, a block of 1 (zigzag 0x02), the item, the
            # end; the item's bytes are framed again with their neighbours.
            bodies = [encode([item])[2:-1] for item in value]
            for run in _runs(message.updates, bodies, bound, _avro_frame, "an Avro datum",
                             weigh=lambda n, size: cost.weigh_updates(n, size)):
                yield _BRANCH_0 + ocf.encode_long(len(run)) + b"".join(run) + _ARRAY_END
        else:
            yield from _progress_pieces(message, lambda m: encode(value_of(m)), bound,
                                        cost.weigh)


def _avro_frame(n: int) -> int:
    """The bytes of an Avro updates datum of `n` updates besides the updates' own."""
    return len(_BRANCH_0) + len(ocf.encode_long(n)) + len(_ARRAY_END)


def _json_frame(n: int) -> int:
    """The bytes of an Avro-JSON updates line of `n` updates besides the updates' own (the
    commas between them; not the newline)."""
    return len(_JSON_HEAD) + n - 1 + len(_JSON_TAIL)


def _runs(updates: Sequence[Update], bodies: list[bytes], bound: int,
          frame: Callable[[int], int], carrier: str,
          weigh: Callable[[int, int], float] | None = None) -> list[list[bytes]]:
    """The encoded updates of one message (`bodies`, aligned with `updates`) in consecutive
    runs, as many to a run as fit `bound` once framed (`frame(n)`: the bytes of a message of n
    besides theirs), and, with `weigh` (what a datum of n updates in so many bytes may decode
    to), whose weight is within `avro_bounds.BLOCK_BUDGET`. All are checked before any run is
    returned: an update that does not fit alone is an `UpdateTooLarge` with nothing of its
    message written."""
    budget = avro_bounds.BLOCK_BUDGET
    runs: list[list[bytes]] = []
    run: list[bytes] = []
    size = 0
    for update, body in zip(updates, bodies, strict=True):
        alone = frame(1) + len(body)
        if alone > bound:
            raise UpdateTooLarge(update, alone, bound, carrier)
        if weigh is not None and weigh(1, alone) > budget:
            raise UpdateTooLarge(update, int(weigh(1, alone)), budget,
                                 "decoded Python objects of an Avro datum")
        if run and (frame(len(run) + 1) + size + len(body) > bound or (
                weigh is not None
                and weigh(len(run) + 1, frame(len(run) + 1) + size + len(body)) > budget)):
            runs.append(run)
            run, size = [], 0
        run.append(body)
        size += len(body)
    if run:
        runs.append(run)
    return runs


def _progress_pieces(message: Progress, encode: Callable[[Progress], bytes],
                     bound: int, weigh: Callable[[bytes], float] | None = None
                     ) -> Iterator[bytes]:
    """A progress statement encoded (`encode`) in pieces of at most `bound` bytes: halves of
    its counts, in time order, over `[lower, t)` and `[t, upper)` for the first time t of the
    second half (times are integers: each half's interval holds exactly its counts' times, and
    the two tile the statement's). Needed only for one of a million or so distinct times."""
    encoded = encode(message)
    if len(encoded) <= bound and (weigh is None or weigh(encoded) <= avro_bounds.BLOCK_BUDGET):
        yield encoded
        return
    counts = sorted(message.counts)
    half = len(counts) // 2
    if half == 0:  # one count: a few dozen bytes, within any bound a reader keeps
        raise ValueError(f"a progress statement of one count takes {len(encoded)} bytes, more "
                         f"than the bound of {bound}")
    middle = Antichain([counts[half][0]])
    yield from _progress_pieces(
        Progress(message.lower, middle, tuple(counts[:half]), message.origin), encode, bound,
        weigh)
    yield from _progress_pieces(
        Progress(middle, message.upper, tuple(counts[half:]), message.origin), encode, bound,
        weigh)


def json_lines(messages: Iterable[Message], schema: CdcSchema | None = None, *,
               bound: int = jsonl.MAX_LINE_BYTES) -> Iterator[bytes]:
    """The messages as Avro-JSON lines (newline included), each of at most `bound` bytes, the
    most the readers take (`lines.MAX_LINE_BYTES`): a message longer than that is cut as
    `avro_datums` cuts it, and an update too long for a line alone is an `UpdateTooLarge`,
    raised before any line of its message."""
    for message in messages:
        value = message_to_avro_json(message, schema)
        line = orjson.dumps(value)
        if len(line) < bound:
            del value  # freed now, not while the caller writes the line (cache-warm reuse)
            yield line + b"\n"
        elif isinstance(message, Updates):
            bodies = [orjson.dumps(item) for item in value["array"]]
            for run in _runs(message.updates, bodies, bound - 1, _json_frame, "a JSON line"):
                yield _JSON_HEAD + b",".join(run) + _JSON_TAIL + b"\n"
        else:
            for piece in _progress_pieces(
                    message, lambda m: orjson.dumps(message_to_avro_json(m, schema)), bound - 1):
                yield piece + b"\n"


def write_json_lines(
    fo: IO[bytes], messages: Iterable[Message], schema: CdcSchema | None = None
) -> int:
    """Write messages as Avro-JSON lines, each within the readers' bound (`json_lines`: a
    message over it is cut into several); returns how many lines (messages) were written.
    An update too large for any line is an `UpdateTooLarge`."""
    n = 0
    for line in json_lines(messages, schema):
        fo.write(line)
        n += 1
    return n


def _python_datum(message: Message, schema: CdcSchema) -> Any:
    plain = message_to_plain(message)
    if isinstance(message, Updates):
        convert = schema.plain_python
        return [{"data": convert(u["data"]), "time": u["time"], "diff": u["diff"]}
                for u in plain]
    return plain


def write_ocf(
    fo: IO[bytes], messages: Iterable[Message], schema: CdcSchema, *, codec: str = "null"
) -> int:
    """Write messages to an Avro object container file in blocks the readers take
    (`ocf.write_container`, within `ocf.MAX_BLOCK_BYTES` before and after compression): a
    message too large for one block is cut into several datums (`avro_datums`), and an update
    too large for any is an `UpdateTooLarge`. Returns how many datums (messages) were written.
    """
    count = 0

    def counted() -> Iterator[Message]:
        nonlocal count
        for message in messages:
            count += 1
            yield message

    written = 0
    bound = ocf.max_datum_bytes(codec)  # a ValueError for a codec the readers do not take

    def datums() -> Iterator[bytes]:
        nonlocal written
        for datum in avro_datums(counted(), schema, bound=bound):
            written += 1
            yield datum

    try:
        ocf.write_container(fo, orjson.dumps(schema.avro), datums(), codec=codec,
                            weigh=schema.cost.weigh, budget=avro_bounds.BLOCK_BUDGET)
    except (ValueError, TypeError) as error:
        text = str(error)  # fastavro's names the whole datum and schema: the start says why
        raise SchemaError(f"message {count} does not fit the schema: "
                          f"{text if len(text) <= 300 else text[:300] + ' ...'}") from None
    return written
