package changelake.jvm;

import java.util.Iterator;
import java.util.List;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A batch's lines read by `DebeziumLine` in the tasks, as Spark's internal rows: what
 * `parse._java_read` and `parse._java_columns` make of them (the line's place, its `flaw`, the
 * item columns, `shape`, `_deferred`), without the work around a UDF that returns a `Row`.
 *
 * The promise: the rows are exactly those of the UDF's plan over the same lines, and the two
 * summaries (`_chunk`, `_facts`, see `read`) are exactly the aggregates they stand for
 * (`tests/spark/test_spark_changefeed_jvm.py` compares each with its counterpart). Why it
 * pays: the UDF path decodes each line's bytes to Spark's text, casts it to binary (a copy),
 * runs `is_valid_utf8` over every byte, and has each returned `Row` converted field by field
 * (the images, the largest fields, decoded from UTF-8 into Java strings and encoded again).
 * Here the line's bytes go to Jackson once, an ASCII line (most are) is known to be UTF-8 by
 * a word-at-a-time test, and the images go into the row as the bytes Jackson wrote
 * (benchmarks/README.md).
 */
public final class DebeziumLines {
    private DebeziumLines() {}

    /** The output's columns, by name, as `parse._java_columns` orders them. */
    static final String[] COLUMNS = {
        "file", "file_index", "block", "row", "flaw", "schema", "kind", "problem", "op",
        "ptime", "tx_min", "tx", "tx_order", "end_count", "end_collections", "pos", "table",
        "snapshot", "before_raw", "after_raw", "shape", "_deferred", "_chunk", "_facts"};
    /** Where the columns are in a row (`at` checks each name against `COLUMNS`). */
    private static final int FILE = at("file"), FILE_INDEX = at("file_index"),
        BLOCK = at("block"), ROW = at("row"), FLAW = at("flaw"), SCHEMA = at("schema"),
        KIND = at("kind"), OP = at("op"), PTIME = at("ptime"), TX_MIN = at("tx_min"),
        TX_ORDER = at("tx_order"), TABLE = at("table"), SNAPSHOT = at("snapshot"),
        BEFORE_RAW = at("before_raw"), AFTER_RAW = at("after_raw"), SHAPE = at("shape"),
        DEFERRED = at("_deferred"), CHUNK = at("_chunk"), FACTS = at("_facts");
    /** `DebeziumLine.read`'s values from its third on (op, ptime, ..., after_raw) are the
     * columns from `OP` on, in the same order: value `i` is column `OP - 2 + i`. */
    private static final int ITEM_AT = OP - 2;

    private static int at(String name) {
        int i = java.util.Arrays.asList(COLUMNS).indexOf(name);
        if (i < 0) throw new IllegalStateException("DebeziumLines: no column " + name);
        return i;
    }

    /**
     * `lines` (file string, file_index int, block bigint, row bigint, value string: in this
     * order) read, as `schema` (the UDF plan's, `_chunk` and `_facts`, given as JSON: its names
     * must be `COLUMNS`). `maxLineBytes`: `read.MAX_LINE_BYTES`, the bound `read.flaw` holds
     * the lines to; `chunkBits`: `times.CHUNK_BITS` (negative: `_chunk` is null on every
     * line).
     *
     * `_chunk` is null but on the last line of each chunk (`times.chunks_of`: the lines of one
     * file and block whose `row`s agree but for their last `chunkBits` bits) that has a change
     * read: there it is the row `chunks_of` aggregates for it where a change's time is its
     * `ptime` (no transaction's time taken), `(file_index, block, chunk, t, last_wanted,
     * first_moving)`, so that the parse's job can collect those few rows instead of a pass of
     * their own (`pipeline._parsed`). A chunk's lines are one run of a task's lines where `row`
     * is `monotonically_increasing_id` (files); a chunk that comes in more than one run (a
     * Kafka partition's offsets) has a row for each, which `chunks_of` merges.
     *
     * `_facts` is null but on each task's last line, where it is what `pipeline._facts`
     * aggregates over the task's lines (and the count of lines left, and the shapes:
     * `Facts`), so that the parse's job observes one row a task, not every line through
     * Spark's aggregates (`pipeline._merged_facts` merges them).
     */
    public static Dataset<Row> read(Dataset<Row> lines, String schema, int maxLineBytes,
                                    int chunkBits) {
        StructType out = (StructType) DataType.fromJson(schema);
        if (!java.util.Arrays.equals(out.fieldNames(), COLUMNS))
            throw new IllegalArgumentException("DebeziumLines: columns " + schema);
        RDD<InternalRow> rows = lines.queryExecution().toRdd().toJavaRDD()
            .mapPartitions(new Partition(maxLineBytes, chunkBits)).rdd();
        return lines.sparkSession().internalCreateDataFrame(rows, out, false);
    }

    /**
     * `pipeline._facts` over one task's rows, as they are made: counts, least and greatest
     * texts (compared as Spark compares them, by their UTF-8 bytes), the greatest parser
     * time, the first change with an image (by place) and its images and schema; and the
     * lines left (`_deferred`), the truncates among the changes, the creates that may hold
     * Debezium's unavailable placeholder (`placeheld`: the creates of a key move,
     * `moves.py`), and the shapes. Its row is `parse.TASK_FACTS`.
     */
    private static final class Facts {
        long flawed, changes, untimed, byTx, metadata, schemaless, deferred, truncates,
            placeheld;
        UTF8String table, otherTable, schema, otherSchema;
        Long high;
        Object[] first;  // file_index, block, row, after_raw, before_raw, schema
        final java.util.Set<UTF8String> shapes = new java.util.HashSet<>();

        /** A row made; `change`: it is a change (its kind). */
        void add(Object[] out, boolean change) {
            if (out[FLAW] != null) flawed++;
            if (Boolean.TRUE.equals(out[DEFERRED])) deferred++;
            UTF8String kind = (UTF8String) out[KIND], schemaText = (UTF8String) out[SCHEMA];
            if (out[TX_ORDER] != null || BEGIN.equals(kind) || END.equals(kind)) metadata++;
            if (out[SHAPE] != null) shapes.add((UTF8String) out[SHAPE]);
            if (!change) return;
            changes++;
            if (TRUNCATE.equals(out[OP])) truncates++;
            if (CREATE.equals(out[OP]) && out[AFTER_RAW] != null
                    && mayHoldPlaceholder((UTF8String) out[AFTER_RAW])) {
                placeheld++;
            }
            // The changes' schemas only: a transaction topic's BEGIN/END and a heartbeat carry
            // schemas of their own (real Debezium with schemas.enable).
            schema = least(schema, schemaText);
            otherSchema = greatest(otherSchema, schemaText);
            table = least(table, (UTF8String) out[TABLE]);
            otherTable = greatest(otherTable, (UTF8String) out[TABLE]);
            Long ptime = (Long) out[PTIME];
            if (ptime == null) untimed++;
            else high = high == null ? ptime : Math.max(high, ptime);
            if (Boolean.TRUE.equals(out[TX_MIN])) byTx++;
            if (schemaText == null) schemaless++;
            if ((out[BEFORE_RAW] != null || out[AFTER_RAW] != null)
                    && (first == null || before(out, first))) {
                first = new Object[] {out[FILE_INDEX], out[BLOCK], out[ROW], out[AFTER_RAW],
                                      out[BEFORE_RAW], out[SCHEMA]};
            }
        }

        /** Whether `out`'s place `(file_index, block, row)` comes before `first`'s. */
        private static boolean before(Object[] out, Object[] first) {
            int c = Integer.compare((Integer) out[FILE_INDEX], (Integer) first[0]);
            if (c == 0) c = Long.compare((Long) out[BLOCK], (Long) first[1]);
            if (c == 0) c = Long.compare((Long) out[ROW], (Long) first[2]);
            return c < 0;
        }

        private static UTF8String least(UTF8String a, UTF8String b) {
            return a == null ? b : b == null || a.binaryCompare(b) <= 0 ? a : b;
        }

        private static UTF8String greatest(UTF8String a, UTF8String b) {
            return a == null ? b : b == null || a.binaryCompare(b) >= 0 ? a : b;
        }

        InternalRow summary() {
            Object[] f = first == null ? new Object[6] : first;
            return new GenericInternalRow(new Object[] {
                flawed, changes, untimed, byTx, metadata, schemaless, deferred, truncates,
                placeheld, table,
                otherTable, schema, otherSchema, high, f[0], f[1], f[2], f[3], f[4], f[5],
                new GenericArrayData(shapes.toArray())});
        }
    }

    private static final UTF8String BEGIN = UTF8String.fromString("BEGIN"),
        END = UTF8String.fromString("END"), TRUNCATE = UTF8String.fromString("t"),
        CREATE = UTF8String.fromString("c"),
        PLACEHOLDER = UTF8String.fromString("__debezium_unavailable_value"),
        PLACEHOLDER_B64 = UTF8String.fromString("X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="),
        ESCAPE = UTF8String.fromString("\\u");

    /**
     * Whether an image's text may hold a value that reads as the placeholder: it holds the
     * placeholder's text or its base64 as they are, or a backslash-u escape, which could
     * spell either otherwise (no other escape could: neither holds a quote, a backslash, a slash
     * or a control character). Never false where a value is one.
     */
    static boolean mayHoldPlaceholder(UTF8String image) {
        return image.contains(PLACEHOLDER) || image.contains(PLACEHOLDER_B64)
            || image.contains(ESCAPE);
    }

    /** One chunk's `chunks_of` row, as its changes are read. */
    private static final class Chunk {
        final Object fileIndex, block;
        final long chunk;
        Long t, lastWanted, firstMoving;
        boolean changes;

        Chunk(Object fileIndex, Object block, long chunk) {
            this.fileIndex = fileIndex;
            this.block = block;
            this.chunk = chunk;
        }

        boolean holds(Object fileIndex, Object block, long chunk) {
            return this.chunk == chunk && java.util.Objects.equals(this.fileIndex, fileIndex)
                && java.util.Objects.equals(this.block, block);
        }

        /** A change at `row` with parser time `time` (null: a snapshot row's). */
        void change(long row, Long time) {
            changes = true;
            if (time == null) {
                lastWanted = lastWanted == null ? row : Math.max(lastWanted, row);
            } else {
                t = t == null ? time : Math.max(t, time);
                firstMoving = firstMoving == null ? row : Math.min(firstMoving, row);
            }
        }

        InternalRow summary() {
            return changes ? new GenericInternalRow(new Object[] {
                fileIndex, block, chunk, t, lastWanted, firstMoving}) : null;
        }
    }

    /** The function each task runs over its partition. */
    private static final class Partition
            implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
        private static final long serialVersionUID = 1L;
        private final int maxLineBytes, chunkBits;

        Partition(int maxLineBytes, int chunkBits) {
            this.maxLineBytes = maxLineBytes;
            this.chunkBits = chunkBits;
        }

        @Override
        public Iterator<InternalRow> call(Iterator<InternalRow> lines) {
            DebeziumLine.Shapes shapes = new DebeziumLine.Shapes();
            return new Iterator<>() {
                private String lastShape;
                private UTF8String lastShapeText;
                // A line is handed on once the next is read: then it is known whether it
                // ends its chunk. `ended`: the summary of the chunk the line just read ended.
                private GenericInternalRow held;
                private Chunk chunk;
                private InternalRow ended;
                private final Facts facts = new Facts();

                @Override
                public boolean hasNext() {
                    return held != null || lines.hasNext();
                }

                @Override
                public InternalRow next() {
                    if (held == null) held = read(lines.next());
                    GenericInternalRow out = held;
                    if (lines.hasNext()) {
                        held = read(lines.next());
                        out.update(CHUNK, ended);
                        ended = null;
                    } else {
                        held = null;
                        out.update(CHUNK, chunk == null ? null : chunk.summary());
                        out.update(FACTS, facts.summary());
                        chunk = null;
                    }
                    return out;
                }

                private GenericInternalRow read(InternalRow line) {
                    Object[] out = new Object[COLUMNS.length];
                    out[FILE] = line.isNullAt(0) ? null : line.getUTF8String(0).clone();
                    out[FILE_INDEX] = line.isNullAt(1) ? null : line.getInt(1);
                    out[BLOCK] = line.isNullAt(2) ? null : line.getLong(2);
                    out[ROW] = line.isNullAt(3) ? null : line.getLong(3);
                    out[SNAPSHOT] = Boolean.FALSE;  // false on a line Java leaves
                    UTF8String value = line.isNullAt(4) ? null : line.getUTF8String(4);
                    Integer flaw = value == null ? null : flaw(value, maxLineBytes);
                    out[FLAW] = flaw;
                    Object[] item = flaw != null || value == null ? null
                        : DebeziumLine.read(value.getBytes(), shapes);
                    out[DEFERRED] = item == null;
                    boolean change = item != null && "change".equals(item[1]);
                    if (item != null) {
                        out[SCHEMA] = text(item[0]);
                        out[KIND] = text(item[1]);
                        for (int i = 2; i < item.length - 1; i++) {
                            out[ITEM_AT + i] = internal(i, item[i]);
                        }
                        out[SHAPE] = shape((String) item[DebeziumLine.SHAPE_AT]);
                    }
                    if (chunkBits >= 0 && out[ROW] != null) {
                        long row = (Long) out[ROW];
                        long at = row >> chunkBits;
                        if (chunk == null || !chunk.holds(out[FILE_INDEX], out[BLOCK], at)) {
                            ended = chunk == null ? null : chunk.summary();
                            chunk = new Chunk(out[FILE_INDEX], out[BLOCK], at);
                        }
                        if (change) chunk.change(row, (Long) item[3]);
                    }
                    facts.add(out, change);
                    return new GenericInternalRow(out);
                }

                /** A change's shape mostly repeats the one before it (`Shapes.of`). */
                private UTF8String shape(String shape) {
                    if (shape == null) return null;
                    if (shape != lastShape) {
                        lastShape = shape;
                        lastShapeText = UTF8String.fromString(shape);
                    }
                    return lastShapeText;
                }
            };
        }
    }

    /** `read.flaw`: 1 over the bound, else 2 where not UTF-8, else null. */
    static Integer flaw(UTF8String value, int maxLineBytes) {
        if (value.numBytes() >= maxLineBytes) return 1;
        return ascii(value) || value.isValid() ? null : 2;
    }

    /** Whether every byte is below 0x80: ASCII, so UTF-8 (`isValid` tests byte by byte). */
    static boolean ascii(UTF8String value) {
        Object base = value.getBaseObject();
        long offset = value.getBaseOffset();
        int n = value.numBytes(), i = 0;
        long high = 0;
        for (; i + 8 <= n; i += 8) high |= Platform.getLong(base, offset + i);
        for (; i < n; i++) high |= Platform.getByte(base, offset + i);
        return (high & 0x8080808080808080L) == 0;
    }

    private static UTF8String text(Object value) {
        return value == null ? null : UTF8String.fromString((String) value);
    }

    /** `DebeziumLine.read`'s value at `i` as Spark holds it. */
    private static Object internal(int i, Object value) {
        if (value == null) return null;
        if (value instanceof String text) return UTF8String.fromString(text);
        if (value instanceof byte[] bytes) return UTF8String.fromBytes(bytes);
        if (i == DebeziumLine.POSITION_AT) {
            Long[] pos = (Long[]) value;
            long[] longs = new long[pos.length];
            for (int k = 0; k < pos.length; k++) longs[k] = pos[k];
            return UnsafeArrayData.fromPrimitiveArray(longs);
        }
        if (i == DebeziumLine.COLLECTIONS_AT) {
            @SuppressWarnings("unchecked")
            List<Row> entries = (List<Row>) value;
            Object[] rows = new Object[entries.size()];
            for (int k = 0; k < rows.length; k++) {
                Row e = entries.get(k);
                rows[k] = new GenericInternalRow(new Object[] {
                    e.isNullAt(0) ? null : UTF8String.fromString(e.getString(0)), e.get(1)});
            }
            return new GenericArrayData(rows);
        }
        return value;  // Long, Boolean
    }
}
