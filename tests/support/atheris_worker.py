"""Coverage-guided fuzzing with atheris (libFuzzer for Python), for the slow tier (issue 67):
`python atheris_worker.py avro|debezium|pgoutput CORPUS_DIR [libFuzzer flags]`.

Targets: the Avro container reader (`read_ocf`, strict), Debezium lines through the parser and
the keyed converter, and the pgoutput decoder (a stream of messages, cut from the input at
each 0xFF byte). Every outcome must be a result or a one-line `ChangelakeError`; anything else
propagates, and libFuzzer reports it as a crash (exit status not 0) with the input that made
it. `test_fuzz_atheris.py` runs each for a bounded time under an address-space cap, and
libFuzzer's own `-rss_limit_mb` counts a bomb as a crash too.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["changelake"]):
    from changelake.capture.postgres.pgoutput import Decoder
    from changelake.convert.feed import ChangefeedEncoder
    from changelake.convert.upsert import UpsertOptions
    from changelake.errors import ChangelakeError, Location
    from changelake.formats.debezium import DebeziumParser
    from changelake.formats.materialize import read_ocf


def _one_line(error: ChangelakeError) -> None:
    text = str(error)
    if "\n" in text or len(text) > 2000 or "MemoryError" in text or "RecursionError" in text:
        raise AssertionError(f"not one short line: {text[:3000]!r}")


def avro(data: bytes) -> None:
    try:
        for _ in read_ocf(io.BytesIO(data), name="f.avro"):
            pass
    except ChangelakeError as error:
        _one_line(error)
        if not str(error).startswith("f.avro, offset "):
            raise AssertionError(f"not named at an offset: {error}") from None


def debezium(data: bytes) -> None:
    parser = DebeziumParser()
    encoder = ChangefeedEncoder([], source="debezium", close=True,
                                options=UpsertOptions(keys=("id",)))
    items = []
    try:
        for number, line in enumerate(data.split(b"\n")[:50], 1):
            items.append((parser.parse_line(line, Location("f.jsonl", number)), line))
        for _ in encoder.feed([items]):
            pass
    except ChangelakeError as error:
        _one_line(error)


def pgoutput(data: bytes) -> None:
    decoder = Decoder(streaming_parallel=bool(data[:1] == b"\x01"))
    for payload in data[1:].split(b"\xff")[:50]:
        try:
            decoder.decode(payload, 0x16B374D848)
        except ChangelakeError as error:
            _one_line(error)


TARGETS = {"avro": avro, "debezium": debezium, "pgoutput": pgoutput}


if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    corpus = Path(sys.argv[2])
    atheris.Setup([sys.argv[0], str(corpus), *sys.argv[3:]], target)
    atheris.Fuzz()
