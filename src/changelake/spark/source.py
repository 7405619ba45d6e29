"""`materialize-cdc`: a Python Data Source for directories of Materialize CDC files.

Why one module of over 500 lines: one Spark Data Source (source, batch and stream readers,
writer), whose classes share its options and type mapping.

Spark's own Avro module is not bundled with PySpark, so this wraps the pure-Python codecs of
`changelake.formats.materialize` (fastavro for object container files, orjson for Avro-JSON
lines; the kind is detected per file). Each file is one input partition, read on an executor;
nothing is shared with the driver but the options.

A row is one message, mirroring the Avro union: `updates` (array of `{data, time, diff}`) or
`progress` (`{lower, upper, counts}`), plus where it came from (`_file`, `_line` for JSON lines,
`_offset` for an OCF block) and, in lenient mode, `_error` for input the codecs set aside (both
message columns null). `changelake.spark.decoder.split_messages` turns this into `decode`'s input.

Options:

* `schema`: path of the Avro schema (the CLI's `--schema FILE`), or `avroSchema`: its JSON text.
  Without either, the first Avro container file's own schema is used; JSON lines without a
  schema can be read only with `dataAs=json`.
* `lenient` (`false`): set unreadable input aside in `_error` rows instead of failing the job.
* `dataAs` (`struct`): `struct` gives `data` as a Spark struct (Avro types mapped below);
  `json` gives the row as canonical JSON text, exactly as the local engine prints it, which
  lets the CLI's Spark engine print byte-identical output with no type mapping at all.
* `maxFilesPerTrigger` (streaming): at most this many new files per micro-batch.

Avro to Spark in `struct` mode: null/boolean/int/long/float/double/string as themselves;
records, arrays and maps as struct, array and map; `["null", T]` as nullable `T`. Logical
types as the Spark types the capture writes them from (`capture/postgres/avro.py`), so that a
captured log ingests as the table `capture --lake` lands: `decimal` of precision up to 38 as
`DecimalType`, `date` as `DateType`, `timestamp-millis`/`-micros` as `TimestampType` (the
instant), `local-timestamp-millis`/`-micros` as `TimestampNTZType`. Other values whose plain
JSON form (see `formats.avro_values`) is a string map to string: bytes and fixed (0-255 code
points), enums, times, uuids and wider decimals. A union of several non-null types maps to a
string holding the value's JSON.

Streaming offsets are the sorted list of file names seen, not modification times (which tie at
millisecond resolution). Files must appear atomically (written under a name starting with `.`
or `_`, which is ignored, then renamed), and never change afterwards.

Writing (`df.write.format("materialize-cdc")`) takes a messages DataFrame (as `encode` makes)
and writes one file per partition with the codecs: option `format` = `json` (default) or
`avro` (needs the schema). Each file is written under a hidden name and renamed into place.
Each message is written within the bound the readers keep (`formats.materialize.write_ocf`,
`write_json_lines`): one larger, such as a batch of 1024 wide rows, is cut into several, and
a task whose update is too large for any message fails, its hidden file removed.
`mode("append")` renames each file as its task finishes and leaves what was there. A
`mode("overwrite")` job renames nothing until every task has succeeded: then, on the driver,
it removes every file a reader of the path would read (not hidden ones, such as another job's
files in progress) and renames its own into place; a failed job leaves the path as it was.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from changelake.formats.avro_logical import Logical, logical
from changelake.spark.errors import INPUT_ERROR_MARK
from changelake.spark_arrow import SPARK_DECIMAL_DIGITS

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Row, SparkSession
    from pyspark.sql.types import DataType, StructType

NAME = "materialize-cdc"

Converter = Callable[[Any], Any]


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("materialize-cdc")` available in this session."""
    spark.dataSource.register(MaterializeCdcDataSource)


# ------------------------------------------------------------------------- Avro -> Spark


def _spark_type(schema: Any, named: Any) -> tuple[DataType, Converter]:
    """The Spark type for a plain-JSON value of this Avro type, and the value converter."""
    import orjson
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        MapType,
        NullType,
        StringType,
        StructField,
        StructType,
    )

    from changelake.formats import avro_values as av
    from changelake.values import thaw

    annotated = logical(schema, named)
    if annotated is not None:
        return _logical_spark_type(annotated)
    if isinstance(schema, dict) and "logicalType" in schema:  # one a reader ignores (see
        # formats.avro_logical): the value is its underlying type's
        base = schema["type"]
        plain = {k: v for k, v in schema.items() if k != "logicalType"}
        return _spark_type(base if isinstance(base, str) else plain, named)
    schema = av._resolve(schema, named)
    if isinstance(schema, list):
        branches = [b for b in schema if av._resolve(b, named) != "null"]
        if len(branches) == 1:
            return _spark_type(branches[0], named)

        def as_json(v: Any) -> Any:
            return None if v is None else orjson.dumps(thaw(v)).decode()

        return StringType(), as_json
    if isinstance(schema, str):
        primitive = {
            "null": NullType(),
            "boolean": BooleanType(),
            "int": IntegerType(),
            "long": LongType(),
            "float": FloatType(),
            "double": DoubleType(),
            "string": StringType(),
            "bytes": StringType(),
        }[schema]
        return primitive, _same
    kind = schema["type"]
    if kind in ("record", "error"):
        names: list[str] = []
        fields: list[StructField] = []
        converters: list[Converter] = []
        for f in schema["fields"]:
            spark_type, convert = _spark_type(f["type"], named)
            names.append(f["name"])
            fields.append(StructField(f["name"], spark_type, True))
            converters.append(convert)
        return StructType(fields), _record_converter(names, converters)
    if kind == "array":
        item_type, item = _spark_type(schema["items"], named)
        return ArrayType(item_type, True), lambda v: None if v is None else [item(x) for x in v]
    if kind == "map":
        value_type, value = _spark_type(schema["values"], named)
        return MapType(StringType(), value_type, True), (
            lambda v: None if v is None else {k: value(x) for k, x in v}
        )
    return StringType(), _as_text  # enum, fixed


def _same(v: Any) -> Any:
    return v


def _record_converter(names: list[str], converters: list[Converter]) -> Converter:
    """A frozen record (a `Record` of (name, value) pairs; a field it lacks is null) to the
    Spark row's tuple, in `names`' order. Its values are taken by name in C (`dict`, then
    `itemgetter`), not by a Python call per field, which was slower (a throwaway timing:
    benchmarks/README.md, "The `materialize-cdc` read: Arrow batches")."""
    if not names:
        return lambda v: None if v is None else ()
    pick = operator.itemgetter(*names)
    single = len(names) == 1
    plain = all(c is _same for c in converters)

    def record(v: Any) -> Any:
        if v is None:
            return None
        try:
            values = pick(dict(v))
        except KeyError:  # a field the value lacks is null
            get = v.get
            values = tuple(get(name) for name in names)
        else:
            if single:
                values = (values,)
        return values if plain else tuple(c(x) for c, x in zip(converters, values, strict=True))

    return record


def _as_text(v: Any) -> Any:
    return v if v is None or isinstance(v, str) else str(v)


def _logical_spark_type(annotated: Logical) -> tuple[DataType, Converter]:
    """A logical type's Spark type where Spark has one that holds every value (decimals of
    precision up to 38, dates, instants, local date-times), and its plain text converted by
    the logical type's own parser (`Logical.from_plain`: an instant without an offset is UTC);
    text otherwise (times, uuids, wider decimals)."""
    from pyspark.sql.types import (
        DateType,
        DecimalType,
        StringType,
        TimestampNTZType,
        TimestampType,
    )

    name = annotated.name
    spark_type: DataType
    if name == "decimal" and annotated.schema["precision"] <= SPARK_DECIMAL_DIGITS:
        spark_type = DecimalType(annotated.schema["precision"], annotated.schema.get("scale", 0))
    elif name == "date":
        spark_type = DateType()
    elif name in ("timestamp-millis", "timestamp-micros"):
        spark_type = TimestampType()
    elif name in ("local-timestamp-millis", "local-timestamp-micros"):
        spark_type = TimestampNTZType()
    else:
        return StringType(), _as_text
    from_plain = annotated.from_plain
    return spark_type, lambda v: v if v is None or not isinstance(v, str) else from_plain(v)


def data_type_of(schema: Any) -> tuple[DataType, Converter]:
    """The Spark type of a `CdcSchema`'s data rows in `struct` mode, and the converter of a
    decoded (frozen) row to a Spark row value: for readers of messages other than files."""
    return _spark_type(schema.data_type, schema.named)


def message_type(data_type: DataType) -> StructType:
    """A row of the source: one message with where it came from."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from changelake.spark.encoder import messages_schema

    return StructType(
        [
            *messages_schema(data_type).fields,
            StructField("_file", StringType(), True),
            StructField("_line", LongType(), True),
            StructField("_offset", LongType(), True),
            StructField("_error", StringType(), True),
        ]
    )


# ----------------------------------------------------------------------------- options


def schema_option(raw: Mapping[str, str]) -> str | None:
    """The Avro schema text a data source's options (keys in lower case) give: `avroSchema`
    as it is, else the file `schema` names (the union or the rows' record, as any
    `--schema FILE`: `load_schema_text`); None without either."""
    avro = raw.get("avroschema")
    if avro is None and raw.get("schema"):
        from changelake.formats.materialize import load_schema_text

        avro = load_schema_text(raw["schema"])
    return avro


@dataclass(frozen=True)
class Options:
    """What every reader task needs, resolved once on the driver (plain, picklable values)."""

    paths: tuple[str, ...]
    avro_schema: str | None  # JSON text
    lenient: bool
    data_as: str  # "struct" or "json"
    max_files: int | None
    names: tuple[tuple[str, str], ...] = ()  # path -> the name errors and `_file` show

    @classmethod
    def parse(cls, options: Any) -> Options:
        import json

        raw = {k.lower(): v for k, v in dict(options).items()}
        paths: list[str] = []
        if raw.get("path"):
            paths.append(raw["path"])
        if raw.get("paths"):
            value = raw["paths"]
            paths.extend(json.loads(value) if value.startswith("[") else value.split(","))
        if not paths:
            raise ValueError(f"{NAME}: give a path (load(path)) or the paths option")
        avro = schema_option(raw)
        data_as = raw.get("dataas", "struct").lower()
        if data_as not in ("struct", "json"):
            raise ValueError(f"{NAME}: dataAs must be struct or json, not {data_as!r}")
        max_files = raw.get("maxfilespertrigger")
        names = raw.get("names")
        return cls(
            tuple(paths),
            avro,
            raw.get("lenient", "false").lower() in ("true", "1", "yes"),
            data_as,
            int(max_files) if max_files else None,
            tuple(sorted(json.loads(names).items())) if names else (),
        )

    def cdc_schema(self) -> Any:
        from changelake.formats.materialize import CdcSchema

        if self.avro_schema is None:
            return None
        import orjson

        return CdcSchema.from_json(orjson.loads(self.avro_schema))

    def files(self) -> list[str]:
        from changelake.formats.materialize import expand_paths

        return [str(p) for p in expand_paths(self.paths)]


def _first_ocf_schema(files: Sequence[str]) -> str | None:
    """The schema of the first Avro container file, from its checked header only (a corrupt
    header is a planning error naming the file and offset; no block is read here)."""
    import orjson

    from changelake.errors import ChangelakeError
    from changelake.formats.materialize import OCF_MAGIC, read_ocf_schema

    for name in files:
        with open(name, "rb") as fo:
            if fo.read(4) != OCF_MAGIC:
                continue
            fo.seek(0)
            try:
                return orjson.dumps(read_ocf_schema(fo, name=name).avro).decode()
            except ChangelakeError as error:  # the driver reports planning errors as one line
                raise ValueError(f"{NAME}: {error}") from None
    return None


def _data_type(options: Options, files: Sequence[str]) -> tuple[Options, DataType]:
    from pyspark.sql.types import StringType

    if options.data_as == "json":
        return options, StringType()
    avro = options.avro_schema or _first_ocf_schema(files)
    if avro is None:
        raise ValueError(
            f"{NAME}: JSON-lines input needs the schema option (an Avro schema file) to give "
            "data a Spark type, or dataAs=json"
        )
    options = dataclasses.replace(options, avro_schema=avro)
    schema = options.cdc_schema()
    data_type, _ = _spark_type(schema.data_type, schema.named)
    return options, data_type


# ------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class FilePartition(InputPartition):
    """One file, read whole by one task."""

    path: str


def _row_maker(options: Options) -> Callable[[Any], Any]:
    """Protocol message -> row tuple (without the location columns)."""
    import orjson

    from changelake.protocol import Updates
    from changelake.values import thaw

    if options.data_as == "json":

        def data(d: Any) -> Any:
            return orjson.dumps(thaw(d)).decode()
    else:
        schema = options.cdc_schema()
        _, data = _spark_type(schema.data_type, schema.named)

    def make(message: Any) -> tuple[Any, Any]:
        if isinstance(message, Updates):
            return [(data(d), t, r) for d, t, r in message.updates], None
        return None, (
            list(message.lower.elements),
            list(message.upper.elements),
            [(t, c) for t, c in message.counts],
        )

    return make


def read_file(options: Options, path: str) -> Iterator[tuple[Any, ...]]:
    """The rows of one file: messages, and in lenient mode what was set aside."""
    from changelake.errors import ChangelakeError, InputError
    from changelake.formats.materialize import SetAside, read_stream

    make = _row_maker(options)
    set_aside: list[SetAside] = []
    sink = set_aside.append if options.lenient else None
    name = dict(options.names).get(path, path)

    def messages() -> Iterator[Any]:
        try:
            fo = open(path, "rb")  # noqa: SIM115 - closed below, a generator's lifetime
        except OSError as error:
            raise InputError(f"{name}: {error.strerror}") from None
        with fo:
            yield from read_stream(fo, name=name, schema=options.cdc_schema(), set_aside=sink)

    try:
        for message in messages():
            updates, progress = make(message)
            origin = message.origin
            line = origin.line if origin is not None else None
            offset = origin.offset if origin is not None else None
            yield updates, progress, name, line, offset, None
            while set_aside:
                item = set_aside.pop(0)
                yield None, None, name, item.location.line, item.location.offset, item.reason
    except ChangelakeError as error:
        # Raised in an executor, this reaches the driver as text: one recognisable line.
        raise RuntimeError(f"{INPUT_ERROR_MARK}<<{error}>>") from None
    for item in set_aside:
        yield None, None, name, item.location.line, item.location.offset, item.reason


BATCH_UPDATES = 1 << 16
"""About how many updates (and statements) one Arrow batch of the read holds: a batch is made
as a whole in the Python worker, so messages of many updates each are counted by update."""


def arrow_batches(rows: Iterable[tuple[Any, ...]], schema: StructType
                  ) -> Iterator[pa.RecordBatch]:
    """`rows` (of `message_type`, `updates` first) as Arrow record batches of the Arrow schema
    PySpark's worker expects for `schema` (its `to_arrow_schema(schema, timezone="UTC")`),
    each column converted by pyarrow at once. Yielded as tuples, the rows would be converted
    by PySpark's own Python converter, value by value at every depth of a message's updates,
    several times slower than pyarrow's, and the read of a log is faster with these batches
    (`benchmarks/bench_source_read.py`; benchmarks/README.md, "The `materialize-cdc` read:
    Arrow batches")."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    target = to_arrow_schema(schema, timezone="UTC")
    chunk: list[tuple[Any, ...]] = []
    weight = 0
    for row in rows:
        chunk.append(row)
        weight += 1 + len(row[0] or ())
        if weight >= BATCH_UPDATES:
            yield _record_batch(pa, chunk, target)
            chunk, weight = [], 0
    if chunk:
        yield _record_batch(pa, chunk, target)


def _record_batch(pa: Any, rows: list[tuple[Any, ...]], target: pa.Schema) -> pa.RecordBatch:
    columns = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=f.type) for column, f in zip(columns, target, strict=True)],
        schema=target)


class MaterializeCdcReader(DataSourceReader):
    def __init__(self, options: Options, files: Sequence[str], schema: StructType) -> None:
        self.options = options
        self.files = list(files)
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [FilePartition(f) for f in self.files]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        yield from arrow_batches(read_file(self.options, partition.path), self.schema)


class MaterializeCdcStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """New files since the last offset; an offset is the sorted list of files seen.

    With `availableNow`, the files present when the query starts are the target: they are
    read in as many batches as the read limit asks, and later files wait for the next run.
    """

    def __init__(self, options: Options, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.target: set[str] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = set(self.options.files())

    def initialOffset(self) -> dict:
        return {"files": []}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxFiles

        seen = set(start["files"]) if start else set()
        new = [f for f in self.options.files() if f not in seen]
        if self.target is not None:
            new = [f for f in new if f in self.target]
        cap = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        if cap is not None:
            new = new[:cap]
        return {"files": sorted(seen.union(new))}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

        if self.options.max_files:
            return ReadMaxFiles(self.options.max_files)
        return ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        seen = set(start["files"])
        return [FilePartition(f) for f in end["files"] if f not in seen]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        yield from arrow_batches(read_file(self.options, partition.path), self.schema)

    def commit(self, end: dict) -> None:
        pass  # files are never deleted by the reader


# ------------------------------------------------------------------------------ writing


@dataclass
class WrittenFile(WriterCommitMessage):
    path: str  # where the file is: its final name, or (overwrite) its hidden name until commit
    final: str  # its name once committed
    messages: int


class MaterializeCdcWriter(DataSourceWriter):
    """One file per partition: written under a hidden name, then renamed into place (by the
    task when appending, by the driver's `commit` when overwriting, see the module
    docstring)."""

    def __init__(self, options: Any, overwrite: bool) -> None:
        raw = {k.lower(): v for k, v in dict(options).items()}
        self.path = raw["path"]
        self.format = raw.get("format", "json").lower()
        if self.format not in ("json", "avro"):
            raise ValueError(f"{NAME}: format must be json or avro, not {self.format!r}")
        avro = schema_option(raw)
        if self.format == "avro" and avro is None:
            raise ValueError(f"{NAME}: writing Avro needs the schema or avroSchema option")
        self.avro_schema = avro
        self.overwrite = overwrite

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        import orjson
        from pyspark import TaskContext

        from changelake.formats.materialize import CdcSchema, write_json_lines, write_ocf
        from changelake.spark.encoder import to_messages

        schema = None if self.avro_schema is None else CdcSchema.from_json(
            orjson.loads(self.avro_schema)
        )
        fields = schema.data_fields if schema is not None else None
        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        suffix = "avro" if self.format == "avro" else "jsonl"
        name = f"part-{part:05d}-{uuid.uuid4().hex[:12]}.{suffix}"
        os.makedirs(self.path, exist_ok=True)
        temporary = os.path.join(self.path, f".{name}.tmp")
        messages = to_messages(iterator, fields)
        try:  # each message within its readers' bound (cut where larger): see write_ocf
            with open(temporary, "wb") as fo:
                if self.format == "avro":
                    assert schema is not None
                    count = write_ocf(fo, messages, schema)
                else:
                    count = write_json_lines(fo, messages, schema)
        except BaseException:  # an update too large for any message, a row off the schema
            os.remove(temporary)  # the task leaves nothing behind, not even a hidden file
            raise
        final = os.path.join(self.path, name)
        if self.overwrite:
            return WrittenFile(temporary, final, count)
        os.replace(temporary, final)
        return WrittenFile(final, final, count)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Overwrite: every task succeeded, so what the path held goes and the new files come
        in. Append: the tasks already renamed their files."""
        if not self.overwrite:
            return
        from changelake.formats.materialize import expand_paths

        written = [m for m in messages if isinstance(m, WrittenFile)]
        if os.path.isdir(self.path):
            for old in expand_paths([self.path]):
                os.remove(old)
        for message in written:
            os.replace(message.path, message.final)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        for message in messages:
            if isinstance(message, WrittenFile) and os.path.exists(message.path):
                os.remove(message.path)


# -------------------------------------------------------------------------- data source


class MaterializeCdcDataSource(DataSource):
    """`spark.read.format("materialize-cdc")`, also `readStream`, and `write`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _resolved(self) -> tuple[Options, DataType, list[str]]:
        options = Options.parse(self.options)
        files = options.files()
        options, data_type = _data_type(options, files)
        return options, data_type, files

    def schema(self) -> StructType:
        _, data_type, _ = self._resolved()
        return message_type(data_type)

    def reader(self, schema: StructType) -> DataSourceReader:
        options, _, files = self._resolved()
        return MaterializeCdcReader(options, files, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = Options.parse(self.options)
        if options.data_as == "struct" and options.avro_schema is None:
            options, _ = _data_type(options, options.files())
        return MaterializeCdcStreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return MaterializeCdcWriter(self.options, overwrite)
