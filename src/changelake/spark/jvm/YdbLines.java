package changelake.jvm;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Set;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A YDB batch's lines read in the tasks into the rows of `ydb.java_items` (by `YdbLine`), as
 * Spark's internal rows: the Spark path's one parse of a YDB batch.
 *
 * The promise: on every line it does not leave (`_deferred` false), the row is what
 * `formats.ydb.YdbParser` (the specification) makes of the line, its Uint64 keys and
 * positions made as `keyed.java_ready` makes them where the schema asks so (`k<i>_long` and
 * `k<i>_negative` for `k<i>`, `pos` of longs: the sign bit flipped, `flip`), so that no
 * decimal is read between the parse and the Java conversion
 * (`tests/spark/test_spark_changefeed_ydb_jvm.py` holds them to a fresh parser's items), and
 * `_facts` is the counts over the task's lines. It keeps it by reading a line only where
 * `YdbLine` reads it and leaving every one the parser refuses or this path does not convert
 * (`problems`): the caller then hands the batch to the Python path. A line with a `flaw`
 * (`read.flaw`) is never read; it is counted. Besides, it keeps YDB's barrier rule within
 * each block as it reads (`Blocks`): `_below` is exactly the records below a barrier of their
 * block's earlier lines (those `barriers._below`'s window finds within the block), and the
 * block's highest barrier is reported (`tests/spark/test_spark_changefeed_barriers.py`).
 *
 * Why here: in a profile of YDB ingests, the Spark expressions that once read these lines
 * (a row built per image, each value checked against its YDB type's range), the conversion of
 * a UDF's `Row`, the UTF-8 check and the cast to binary were most of the parse job's executor
 * samples; read here the parse step is faster (benchmarks/README.md, "The floor of a keyed
 * conversion").
 */
public final class YdbLines {
    private YdbLines() {}

    /** The output's columns before the key columns (`k0`, `k1`, ...) and after them. */
    static final String[] HEAD = {
        "file", "file_index", "block", "row", "kind", "problem", "rpos", "has_ts", "pos",
        "time"};
    static final String[] TAIL = {
        "is_delete", "rank", "op", "a", "ua", "b", "ub", "_below", "_deferred", "_facts"};
    /** Where `HEAD`'s columns are in a row, and `TAIL`'s after the key columns'. */
    private static final int KIND = 4, RPOS = 6, HAS_TS = 7, POS = 8, TIME = 9;
    private static final int IS_DELETE = 0, RANK = 1, OP = 2, A = 3, UA = 4, B = 5, UB = 6,
        BELOW = 7, DEFERRED = 8, FACTS = 9;

    private static final UTF8String CHANGE = UTF8String.fromString("change"),
        RESOLVED = UTF8String.fromString("resolved"),
        LEFT = UTF8String.fromString("left"), DELETE = UTF8String.fromString("d"),
        UPDATE = UTF8String.fromString("u"), WRITE = UTF8String.fromString("w");
    /** The greatest Uint64, and the greatest step (`protocol.time.MAX_TIME`). */
    private static final BigDecimal UINT64_MAX =
        new BigDecimal(BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE));
    private static final BigDecimal MAX_TIME = BigDecimal.valueOf(Long.MAX_VALUE);

    /**
     * `lines` (file string, file_index, block, row, value string: in this order) read, as
     * `schema` (`ydb.item_schema`'s columns, `_below`, `_deferred` and `_facts`, as JSON; its
     * names must be `HEAD`, the key columns, `TAIL`; a key column `k<i>` may come as
     * `k<i>_long` and `k<i>_negative`, a Uint64's only, and `pos` as an array of longs).
     * `table`:
     * `ydb.java_table`'s. `maxLineBytes`: `read.MAX_LINE_BYTES`. `_facts` is null but on
     * each task's last line, where it is the task's counts: flawed, deferred, timed and
     * untimed changes, barriers; then `disorder` and `blocks` (see `Blocks`). `_below`: a
     * record (of kind "change", with `ts`) below the highest barrier of its block's earlier
     * lines.
     */
    public static Dataset<Row> read(Dataset<Row> lines, String schema, String table,
                                    int maxLineBytes) {
        StructType out = (StructType) DataType.fromJson(schema);
        String[] names = out.fieldNames();
        // The key columns: each `k<i>`, or, a Uint64's, `k<i>_long` and `k<i>_negative`.
        List<Boolean> longs = new ArrayList<>();
        int at = HEAD.length;
        while (at < names.length) {
            String key = "k" + longs.size();
            if (names[at].equals(key)) {
                longs.add(false);
                at += 1;
            } else if (names[at].equals(key + "_long") && at + 1 < names.length
                       && names[at + 1].equals(key + "_negative")) {
                longs.add(true);
                at += 2;
            } else {
                break;
            }
        }
        boolean named = !longs.isEmpty() && names.length == at + TAIL.length;
        for (int i = 0; named && i < names.length; i++) {
            String want = i < HEAD.length ? HEAD[i] : i < at ? names[i] : TAIL[i - at];
            named = want.equals(names[i]);
        }
        if (!named) throw new IllegalArgumentException("YdbLines: columns " + schema);
        boolean[] pairs = new boolean[longs.size()];
        for (int i = 0; i < pairs.length; i++) pairs[i] = longs.get(i);
        DataType position = ((ArrayType) out.apply("pos").dataType()).elementType();
        RDD<InternalRow> rows = lines.queryExecution().toRdd().toJavaRDD()
            .mapPartitions(new Partition(table, pairs, position instanceof LongType,
                                         maxLineBytes)).rdd();
        return lines.sparkSession().internalCreateDataFrame(rows, out, false);
    }

    /** The function each task runs over its partition. */
    private static final class Partition
            implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
        private static final long serialVersionUID = 1L;
        private final String table;
        private final boolean[] pairs;
        private final boolean flipped;
        private final int maxLineBytes;

        Partition(String table, boolean[] pairs, boolean flipped, int maxLineBytes) {
            this.table = table;
            this.pairs = pairs;
            this.flipped = flipped;
            this.maxLineBytes = maxLineBytes;
        }

        @Override
        public Iterator<InternalRow> call(Iterator<InternalRow> lines) throws Exception {
            YdbLine.Table t = new YdbLine.Table(table);
            int keyColumns = 0;
            for (boolean pair : pairs) keyColumns += pair ? 2 : 1;
            int tail = HEAD.length + keyColumns, width = tail + TAIL.length;
            return new Iterator<>() {
                private long flawed, deferred, timed, untimed, barriers;
                private final Blocks blocks = new Blocks();

                @Override
                public boolean hasNext() {
                    return lines.hasNext();
                }

                @Override
                public InternalRow next() {
                    Object[] out = new Object[width];
                    read(lines.next(), out);
                    if (!lines.hasNext()) {
                        blocks.finish();
                        out[tail + FACTS] = new GenericInternalRow(new Object[] {
                            flawed, deferred, timed, untimed, barriers, blocks.disorder,
                            new GenericArrayData(blocks.done.toArray())});
                    }
                    return new GenericInternalRow(out);
                }

                private void read(InternalRow line, Object[] out) {
                    out[0] = line.isNullAt(0) ? null : line.getUTF8String(0).clone();
                    out[1] = line.isNullAt(1) ? null : line.getInt(1);
                    out[2] = line.isNullAt(2) ? null : line.getLong(2);
                    out[3] = line.isNullAt(3) ? null : line.getLong(3);
                    blocks.at(line);
                    UTF8String value = line.isNullAt(4) ? null : line.getUTF8String(4);
                    boolean flaw = value != null
                        && DebeziumLines.flaw(value, maxLineBytes) != null;
                    Object[] p = flaw || value == null ? null : YdbLine.values(value, t);
                    boolean read = p != null && !problems(p, t);
                    if (read) {
                        item(p, t, out);
                        out[tail + BELOW] = blocks.below((BigDecimal[]) p[6], (BigDecimal[]) p[7]);
                    } else {
                        left(t, out);
                    }
                    out[tail + DEFERRED] = !read;
                    if (flaw) flawed++;
                    if (!read) {
                        deferred++;
                    } else if (p[7] != null) {
                        barriers++;
                    } else if (p[6] != null) {
                        timed++;
                    } else {
                        untimed++;
                    }
                }

                /** A line left: of kind "left", and the columns never null filled (their
                 * values mean nothing: the caller drops the batch's rows). */
                private void left(YdbLine.Table t, Object[] out) {
                    out[KIND] = LEFT;
                    out[tail + BELOW] = false;
                    out[HAS_TS] = false;
                    out[tail + IS_DELETE] = false;
                    out[tail + RANK] = 1;
                    out[tail + OP] = WRITE;
                    out[tail + UA] = unchanged(t, null);
                    out[tail + UB] = unchanged(t, null);
                }

                /** The item columns of a line read without a problem. */
                private void item(Object[] p, YdbLine.Table t, Object[] out) {
                    Object[] key = (Object[]) p[0], update = (Object[]) p[1],
                        reset = (Object[]) p[2], erase = (Object[]) p[3],
                        newImage = (Object[]) p[4], oldImage = (Object[]) p[5];
                    BigDecimal[] ts = (BigDecimal[]) p[6], resolved = (BigDecimal[]) p[7];
                    out[KIND] = resolved != null ? RESOLVED : CHANGE;
                    out[RPOS] = resolved == null ? null : pair(resolved);
                    out[HAS_TS] = ts != null;
                    out[POS] = ts == null ? null : flipped ? flippedPair(ts) : pair(ts);
                    out[TIME] = ts == null ? null : (Object) ts[0].longValueExact();
                    for (int i = 0, at = HEAD.length; i < pairs.length; i++) {
                        if (!pairs[i]) {
                            out[at++] = key == null ? null : internal(key[i]);
                        } else {
                            out[at++] = key == null ? null : (Object) flip((BigDecimal) key[i]);
                            out[at++] = key == null ? null : (Object) false;
                        }
                    }
                    out[tail + IS_DELETE] = erase != null;
                    out[tail + RANK] = erase != null ? 0 : 1;
                    out[tail + OP] = erase != null ? DELETE
                        : newImage != null && oldImage != null ? UPDATE : WRITE;
                    Object[] written = update != null ? update : reset;
                    out[tail + A] = erase != null ? null
                        : row(t, key, newImage != null ? newImage : written);
                    out[tail + UA] =
                        unchanged(t, newImage != null || erase != null ? null : update);
                    out[tail + B] = oldImage == null ? null : row(t, key, oldImage);
                    out[tail + UB] = unchanged(t, null);
                }
            };
        }
    }

    /**
     * YDB's barrier rule within each block of lines, kept as the task reads them (the rule
     * across blocks: `barriers.Blocks`). A block (`file_index`, `block`) lies in one
     * partition, its rows in increasing `row` order (`read.py`), so the highest barrier of a
     * line's earlier lines in its block is a running maximum. Where the rows are not so (a
     * block met twice, a row not above the one before it), `disorder` says so, and the caller
     * takes the rule its own way. `done`: each block the task read, in order, as
     * `(file_index, block, high)`: its highest barrier, or null.
     */
    static final class Blocks {
        final List<GenericInternalRow> done = new ArrayList<>();
        private final Set<List<Long>> seen = new HashSet<>();
        boolean disorder;
        private Integer file;
        private long block, row;
        private BigDecimal[] high;

        /** The next line's place (file string, file_index, block, row: `read`'s input). */
        void at(InternalRow line) {
            if (line.isNullAt(1) || line.isNullAt(2) || line.isNullAt(3)) {
                disorder = true;
                return;
            }
            int f = line.getInt(1);
            long b = line.getLong(2), r = line.getLong(3);
            if (file == null || file != f || block != b) {
                finish();
                if (!seen.add(List.of((long) f, b))) disorder = true;
                file = f;
                block = b;
                high = null;
            } else if (r <= row) {
                disorder = true;
            }
            row = r;
        }

        /** Whether a record at `ts` lies below the block's barriers so far; then `resolved`
         * (a barrier's position, or null) raises them. */
        boolean below(BigDecimal[] ts, BigDecimal[] resolved) {
            boolean under = ts != null && high != null && compare(ts, high) < 0;
            if (resolved != null && (high == null || compare(resolved, high) > 0)) {
                high = resolved;
            }
            return under;
        }

        /** The current block is read: its summary to `done`. */
        void finish() {
            if (file == null) return;
            done.add(new GenericInternalRow(new Object[] {
                file, block, high == null ? null : pair(high)}));
            file = null;
        }

        private static int compare(BigDecimal[] x, BigDecimal[] y) {
            int c = x[0].compareTo(y[0]);
            return c != 0 ? c : x[1].compareTo(y[1]);
        }
    }

    /**
     * Whether a line `YdbLine` read (`p`: its `values`) is left after all: one the parser
     * refuses (not exactly one body, no key, a value beyond its YDB type's range, a ts or
     * resolved beyond a Uint64, a step beyond a long, an erase with a newImage), or one it
     * accepts that this path does not convert (an oldImage alone: OLD_IMAGE, whose after image
     * is unknown; a barrier beyond a long).
     */
    static boolean problems(Object[] p, YdbLine.Table t) {
        Object[] key = (Object[]) p[0], update = (Object[]) p[1], reset = (Object[]) p[2],
            erase = (Object[]) p[3], newImage = (Object[]) p[4], oldImage = (Object[]) p[5];
        BigDecimal[] ts = (BigDecimal[]) p[6], resolved = (BigDecimal[]) p[7];
        if (resolved != null) return !within(resolved);
        int bodies = (update != null ? 1 : 0) + (reset != null ? 1 : 0) + (erase != null ? 1 : 0);
        if (bodies != 1 || key == null) return true;
        for (int i = 0; i < key.length; i++) {
            if (!inRange(key[i], t.keys.get(i))) return true;
        }
        if (ts != null && !within(ts)) return true;
        if (newImage != null && !inRange(newImage, t)) return true;
        if (oldImage != null && !inRange(oldImage, t)) return true;
        if (erase != null && newImage != null) return true;
        if (erase == null && newImage == null) {
            if (oldImage != null) return true;
            return !inRange(update != null ? update : reset, t);
        }
        return false;
    }

    /** A ts or resolved pair without a problem: both within a Uint64, the step a long. */
    private static boolean within(BigDecimal[] pair) {
        return pair[0].compareTo(MAX_TIME) <= 0 && pair[1].compareTo(UINT64_MAX) <= 0;
    }

    private static boolean inRange(Object[] image, YdbLine.Table t) {
        for (int i = 0; i < image.length; i++) {
            if (!inRange(image[i], t.others.get(i))) return false;
        }
        return true;
    }

    /** A small integer within its YDB type, a Uint64 within 64 bits (a double is in range:
     * `YdbLine` reads no finite number beyond one). Null is in range. */
    private static boolean inRange(Object value, YdbLine.Column column) {
        if (value instanceof Long v) return !column.ranged || (v >= column.low && v <= column.high);
        if (value instanceof BigDecimal v) return v.compareTo(UINT64_MAX) <= 0;
        return true;
    }

    private static GenericArrayData pair(BigDecimal[] pair) {
        return new GenericArrayData(new Object[] {decimal(pair[0]), decimal(pair[1])});
    }

    /**
     * A Uint64 as `keyed.java_ready` makes it for the Java conversion, without a decimal: the
     * long of its 64 bits with the sign bit flipped (`keyed._flipped`), so that longs order as
     * the Uint64s do. A key's (`k<i>_long`) is never negative (`k<i>_negative` false): the
     * reader takes a Uint64 written without a minus only, and `problems` leaves one beyond 64
     * bits.
     */
    static long flip(BigDecimal uint64) {
        return uint64.longValue() ^ Long.MIN_VALUE;
    }

    /** A ts pair `flip`ped, as an array Spark copies as it is (no boxed longs). */
    private static UnsafeArrayData flippedPair(BigDecimal[] pair) {
        return UnsafeArrayData.fromPrimitiveArray(new long[] {flip(pair[0]), flip(pair[1])});
    }

    private static Decimal decimal(BigDecimal value) {
        return Decimal.apply(value, 20, 0);
    }

    /** A value of `YdbLine.values` as Spark holds it. */
    private static Object internal(Object value) {
        if (value == YdbLine.NULL) return null;
        if (value instanceof String text) return UTF8String.fromString(text);
        if (value instanceof BigDecimal d) return decimal(d);
        return value;  // null, Long, Double, Boolean
    }

    /** A row of the table's columns in order, the key's from `key`, the
     * others from `image` (null: all null). */
    private static GenericInternalRow row(YdbLine.Table t, Object[] key, Object[] image) {
        Object[] out = new Object[t.order.length];
        for (int i = 0; i < out.length; i++) {
            int at = t.order[i];
            if (at >= 0) {
                out[i] = key == null ? null : internal(key[at]);
            } else if (image != null) {
                out[i] = internal(image[-1 - at]);
            }
        }
        return new GenericInternalRow(out);
    }

    /** Per column, whether `update` (null: none) leaves it unchanged (names it not; one it
     * sets to null is `YdbLine.NULL`); false for the key's columns. */
    private static GenericInternalRow unchanged(YdbLine.Table t, Object[] update) {
        Object[] out = new Object[t.order.length];
        for (int i = 0; i < out.length; i++) {
            int at = t.order[i];
            out[i] = at < 0 && update != null && update[-1 - at] == null;
        }
        return new GenericInternalRow(out);
    }
}
