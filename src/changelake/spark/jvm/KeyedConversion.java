package changelake.jvm;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The keyed conversion as one pass over each key's events, in the tasks: the rules of
 * `convert.upsert.KeyedConverter` (`keyed.py` states them for Spark), with nothing copied from
 * one operator into the next, where Spark's windows needed four window operators, an explode
 * and an aggregate.
 *
 * The promise: given the events `keyed.java_convert` hands it (each partition's rows sorted by
 * key, then `(time, pos, rank)`, every key's rows in one partition), the updates and the two
 * checks are those of the rules' plain-Python statement in `tests/
 * test_spark_changefeed_keyed.py`, which compares the two on generated events (and the
 * changefeed tests compare whole conversions with `encode_changefeed`). The rules, each named
 * as Spark's windows named the column it was:
 * <ul>
 * <li>`_seen`: the greatest `(pos, rank, content)` of the key's earlier events, applied or
 * not. An event is applied when its `(pos, rank)` is above `_seen`'s (or it is the key's
 * first); `tied` is a write that meets, at `_seen`'s `(pos, rank)`, a write of other content;
 * `problem` the least of every event's.</li>
 * <li>Over the applied events: `segment`, the deletes so far (this one counted); the segment's
 * first write (after a delete, or the key's first event) and its before image; each column's
 * last real value (a write whose value is not UNCHANGED) with the segment it was written
 * in.</li>
 * <li>A write's row: per column, the last real value if written in this segment, else the
 * table's row (`st`) while no delete was applied, else the segment's first write's before
 * image value unless UNCHANGED, else null. The event retracts the key's previous row (the
 * table's for the key's first applied event) and inserts its own (a delete none), at its
 * time.</li>
 * <li>The key's updates are summed by `(row, time)` and those of diff 0 dropped: rows are
 * compared as Spark's aggregate compares them (their unsafe bytes, a float's -0.0 and NaNs
 * made one value first).</li>
 * </ul>
 *
 * With `barriers` (YDB's barrier rule, `barriers.py`), each event also says whether it lies
 * below the highest barrier read before it in its file (`_below`), and carries the hash of its
 * identity and file (`_same`: op, images and file_index): a record below must repeat an
 * earlier record of its file, of its key, at its position, with its identity (a replay after
 * a consumer restart), or the feed broke its partition's guarantee (`unrepeated`). Such a
 * repeat is in the record's run of one key, time, position and rank, and no line order is
 * needed to find it: within a file the highest barrier read so far only rises, so of the
 * records of one identity at one position, those below are the later ones. The rule is broken
 * exactly where all the records of an identity in a run lie below.
 * A record below that lies outside the times converted (`_outside`) is only counted
 * (`outside`): its repeat may lie there too, where the caller looks it up.
 *
 * Truncates (`truncates`, a batch's few, in `(time, pos)` order) are, to each key, a delete
 * at the truncate's time and position with no image, merged into the key's events in their
 * order (`(time, pos, rank)`, rank 0): what `KeyedConverter._truncate` does to each key it
 * knows is what a delete at that place does (its row retracted where the place is above the
 * key's, the key then deleted at that place), and the converter's floor (everything at or
 * below the latest truncate is stale) is then each key's own rule, the key having reached at
 * least that place. A key the batch has no event of is not read here: the caller retracts its
 * table's row at the first truncate (`keyed.java_convert`).
 *
 * Nothing is held beyond one key's updates at one time (`Updates`), and the identities of one
 * run. A partition whose events had a problem, a tie or a record below its barrier unrepeated
 * ends with one more row, with no data, that says so (`problem`, `tied`, `unrepeated`): the
 * caller observes those columns and drops it.
 */
public final class KeyedConversion {
    private KeyedConversion() {}

    /**
     * The updates of `events` (columns in this order: the `keys` key columns, then time
     * bigint, pos array, rank int, is_delete boolean, a, ua, b, ub, content bigint, problem
     * string, st), as `data struct, time bigint, diff bigint, problem string, tied boolean,
     * unrepeated boolean, outside bigint`.
     */
    public static Dataset<Row> convert(Dataset<Row> events, int keys) {
        return convert(events, keys, false);
    }

    /**
     * `convert`, with `barriers`: the events have three columns more after `st`, `_below`
     * boolean, `_same` bigint and `_outside` boolean (see the class comment).
     */
    public static Dataset<Row> convert(Dataset<Row> events, int keys, boolean barriers) {
        return convert(events, keys, barriers, "");
    }

    /**
     * The rows the applied deletes of `events` removed (columns as `convert` reads them, no
     * barriers), as `data struct, time bigint, pos array`: for each delete applied to a key
     * that had a row, that row as it stood just before, at the delete's time and position; no
     * update. `moves.py` hands the row a key move's delete removed to its create, as
     * `convert.upsert.KeyedConverter` does (`key_moves`).
     */
    public static Dataset<Row> removed(Dataset<Row> events, int keys, String truncates) {
        StructType in = events.schema();
        StructType data = (StructType) in.fields()[keys + 4].dataType();
        StructType out = new StructType(new StructField[] {
            DataTypes.createStructField("data", data, false),
            DataTypes.createStructField("time", DataTypes.LongType, true),
            DataTypes.createStructField("pos", in.fields()[keys + 1].dataType(), true)});
        return run(events, keys, false, truncates, true, out);
    }

    /**
     * `convert`, with `truncates`: the batch's truncates as text, `time:p0,p1,...` each,
     * separated by `;`, in `(time, pos)` order (positions of longs, as `java_ready` makes
     * them); empty for none (see the class comment).
     */
    public static Dataset<Row> convert(Dataset<Row> events, int keys, boolean barriers,
                                       String truncates) {
        StructType in = events.schema();
        StructType data = (StructType) in.fields()[keys + 4].dataType();
        return run(events, keys, barriers, truncates, false, new StructType(new StructField[] {
            DataTypes.createStructField("data", data, true),
            DataTypes.createStructField("time", DataTypes.LongType, true),
            DataTypes.createStructField("diff", DataTypes.LongType, false),
            DataTypes.createStructField("problem", DataTypes.StringType, true),
            DataTypes.createStructField("tied", DataTypes.BooleanType, true),
            DataTypes.createStructField("unrepeated", DataTypes.BooleanType, true),
            DataTypes.createStructField("outside", DataTypes.LongType, true)}));
    }

    private static Dataset<Row> run(Dataset<Row> events, int keys, boolean barriers,
                                    String truncates, boolean removed, StructType out) {
        StructType in = events.schema();
        StructType data = (StructType) in.fields()[keys + 4].dataType();
        DataType[] keyTypes = new DataType[keys];
        for (int i = 0; i < keys; i++) keyTypes[i] = in.fields()[i].dataType();
        DataType position = ((org.apache.spark.sql.types.ArrayType) in.fields()[keys + 1]
            .dataType()).elementType();
        RDD<InternalRow> rows = events.queryExecution().toRdd();
        RDD<InternalRow> updates = rows.toJavaRDD()
            .mapPartitions(new Partition(keyTypes, position, data, barriers, truncates,
                                         removed)).rdd();
        return events.sparkSession().internalCreateDataFrame(updates, out, false);
    }

    /** The function each task runs over its partition. */
    private static final class Partition
            implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
        private static final long serialVersionUID = 1L;
        private final DataType[] keyTypes;
        private final DataType position;
        private final StructType data;
        private final boolean barriers;
        private final String truncates;
        private final boolean removed;

        Partition(DataType[] keyTypes, DataType position, StructType data, boolean barriers,
                  String truncates, boolean removed) {
            this.keyTypes = keyTypes;
            this.position = position;
            this.data = data;
            this.barriers = barriers;
            this.truncates = truncates;
            this.removed = removed;
        }

        @Override
        public Iterator<InternalRow> call(Iterator<InternalRow> rows) {
            return new Updates(rows, keyTypes, position, data, barriers, truncates, removed);
        }
    }

    /** `(pos, rank, content)` of an event, ordered as Spark orders the struct. */
    private record Place(ArrayData pos, int rank, long content) {}

    /** A column's value and the segment it was written in. */
    private record Written(int segment, Object value) {}

    /**
     * The updates of one partition, as the caller pulls them: the events are read one at a
     * time, and a key's updates at one time are summed and handed on when the next event is
     * at another time or of another key (updates at two times never cancel). So what is held
     * is one key's state (its values, not its events) and its updates at one time, however
     * many events the key has.
     */
    private static final class Updates implements Iterator<InternalRow> {
        private final Iterator<InternalRow> rows;
        private final Getter[] keyValues;
        private final DataType position;
        private final Getter[] dataValues;
        private final int n;
        private final int keys;
        private final UnsafeProjection unsafe;
        private final List<InternalRow> ready = new ArrayList<>();
        private int next;
        private UTF8String problem;
        private boolean tied;
        private boolean unrepeated;
        private long outside;
        private boolean reported;
        private final boolean barriers;
        // `removed`: the rows the applied deletes removed are handed on, no update (`removed`).
        private final boolean removedRows;
        // The batch's truncates in order (`truncateTimes`, `truncatePositions`), and the next
        // one the current key has not met yet.
        private final long[] truncateTimes;
        private final ArrayData[] truncatePositions;
        private int nextTruncate;
        // The current run of one key, time, position and rank: its identities so far
        // (`identities[0, identityCount)`), and whether one of their records lies above its
        // barrier (`answered`). Positions are YDB's, longs (`keyed._positions_as_longs`),
        // held in a buffer of their own: nothing is allocated per event.
        private boolean inRun;
        private long runTime;
        private long[] runPos = new long[2];
        private int runLength;
        private int runRank;
        private long[] identities = new long[4];
        private boolean[] answered = new boolean[4];
        private int identityCount;

        // The current key: its columns, the table's row, and what its windows carry.
        private Object[] key;
        private Object[] stateValues;
        private Place seen;
        private int segment;
        private Boolean lastDelete;
        private Written[] real;
        private int firstSegment;
        private Object[] firstBefore;
        private boolean[] firstUnchanged;
        private UnsafeRow previous;
        // Its updates at one time, summed.
        private final Map<UnsafeRow, Long> sums = new HashMap<>();
        private long sumsTime;

        Updates(Iterator<InternalRow> rows, DataType[] keyTypes, DataType position,
                StructType data, boolean barriers, String truncates, boolean removedRows) {
            this.rows = rows;
            this.removedRows = removedRows;
            this.reported = removedRows;  // the updates' pass reports the problems
            String[] items = truncates.isEmpty() ? new String[0] : truncates.split(";");
            this.truncateTimes = new long[items.length];
            this.truncatePositions = new ArrayData[items.length];
            for (int i = 0; i < items.length; i++) {
                String[] parts = items[i].split(":");
                truncateTimes[i] = Long.parseLong(parts[0]);
                String[] numbers = parts[1].split(",");
                long[] pos = new long[numbers.length];
                for (int j = 0; j < numbers.length; j++) pos[j] = Long.parseLong(numbers[j]);
                truncatePositions[i] = new GenericArrayData(pos);
            }
            this.barriers = barriers;
            this.keyValues = Getter.of(keyTypes);
            this.position = position;
            this.keys = keyTypes.length;
            this.n = data.fields().length;
            DataType[] types = new DataType[n];
            for (int i = 0; i < n; i++) types[i] = data.fields()[i].dataType();
            this.dataValues = Getter.of(types);
            this.unsafe = UnsafeProjection.create(types);
        }

        @Override
        public boolean hasNext() {
            while (next >= ready.size()) {
                ready.clear();
                next = 0;
                if (!rows.hasNext()) {
                    if (key != null) truncatesAfter(null, 0L, null, 0);
                    flush();
                    if (barriers) closeRun();
                    if (!ready.isEmpty()) break;
                    if (reported || (problem == null && !tied && !unrepeated && outside == 0)) {
                        return false;
                    }
                    reported = true;
                    ready.add(new GenericInternalRow(new Object[] {
                        null, null, 0L, problem, tied ? Boolean.TRUE : null,
                        unrepeated ? Boolean.TRUE : null, outside == 0 ? null : outside}));
                    break;
                }
                // The input's rows may be one buffer, read again: what outlives `row` is copied.
                InternalRow row = rows.next();
                if (key == null || !sameKey(row)) {
                    if (key != null) truncatesAfter(null, 0L, null, 0);
                    flush();
                    start(row);
                }
                event(row);
            }
            return true;
        }

        @Override
        public InternalRow next() {
            if (!hasNext()) throw new NoSuchElementException();
            return ready.get(next++);
        }

        private int ordinal(int field) {
            return keys + field;
        }

        /** The summed updates, those of diff 0 dropped, to `ready`. */
        private void flush() {
            for (Map.Entry<UnsafeRow, Long> e : sums.entrySet()) {
                long diff = e.getValue();
                if (diff != 0) {
                    ready.add(new GenericInternalRow(new Object[] {
                        e.getKey(), sumsTime, diff, null, null, null, null}));
                }
            }
            sums.clear();
        }

        /** A new key, whose first event is `row`. */
        private void start(InternalRow row) {
            key = new Object[keys];
            for (int i = 0; i < keys; i++) key[i] = normal(keyValues[i].copy(row, i));
            stateValues = row.isNullAt(ordinal(10)) ? null
                : values(row.getStruct(ordinal(10), n));
            seen = null;
            segment = 0;
            lastDelete = null;
            real = new Written[n];
            firstSegment = -1;
            firstBefore = null;
            firstUnchanged = null;
            previous = stateValues == null ? null : row(stateValues);
            nextTruncate = 0;
            if (barriers) closeRun();
        }

        /**
         * The current key's truncates before an event at `(time, pos, rank)` (`row` null: all
         * that are left), each applied as a delete without image (see the class comment).
         */
        private void truncatesAfter(InternalRow row, long time, ArrayData pos, int rank) {
            while (nextTruncate < truncateTimes.length) {
                long at = truncateTimes[nextTruncate];
                ArrayData where = truncatePositions[nextTruncate];
                if (row != null) {
                    int c = Long.compare(at, time);
                    if (c == 0) c = compare(where, pos);
                    if (c == 0) c = Integer.compare(0, rank);
                    if (c >= 0) return;  // at or after the event
                }
                nextTruncate++;
                truncate(at, where);
            }
        }

        /** A truncate, to the current key: a delete at `(time, pos)` with no image. */
        private void truncate(long time, ArrayData pos) {
            boolean apply = seen == null;
            if (!apply) {
                int c = compare(pos, seen.pos());
                apply = c > 0 || (c == 0 && 0 > seen.rank());
            }
            if (seen == null || greater(pos, 0, Long.MIN_VALUE, seen)) {
                seen = new Place(pos, 0, Long.MIN_VALUE);
            }
            if (!apply) return;
            if (time != sumsTime) {
                flush();
                sumsTime = time;
            }
            segment++;
            if (previous != null && !removedRows) sums.merge(previous, -1L, Long::sum);
            previous = null;
            lastDelete = true;
        }

        /** The barrier rule for one event (`barriers`): see the class comment. */
        private void barrier(InternalRow row, long time, ArrayData pos, int rank) {
            boolean plain = pos != null;  // no null in it: a run starts at any other
            for (int i = 0; plain && i < pos.numElements(); i++) plain = !pos.isNullAt(i);
            if (!plain || !inRun || time != runTime || rank != runRank || !runAt(pos)) {
                closeRun();
                inRun = plain;
                runTime = time;
                runRank = rank;
                if (plain) {
                    runLength = pos.numElements();
                    if (runPos.length < runLength) runPos = new long[runLength];
                    for (int i = 0; i < runLength; i++) runPos[i] = pos.getLong(i);
                }
            }
            long same = row.getLong(ordinal(12));
            boolean below = !row.isNullAt(ordinal(11)) && row.getBoolean(ordinal(11));
            for (int i = 0; i < identityCount; i++) {
                if (identities[i] == same) {
                    if (!below) answered[i] = true;
                    return;
                }
            }
            if (identityCount == identities.length) {
                identities = Arrays.copyOf(identities, 2 * identityCount);
                answered = Arrays.copyOf(answered, 2 * identityCount);
            }
            identities[identityCount] = same;
            answered[identityCount++] = !below;
        }

        /** The run is over: an identity all of whose records lie below breaks the rule. */
        private void closeRun() {
            for (int i = 0; i < identityCount; i++) {
                if (!answered[i]) unrepeated = true;
            }
            identityCount = 0;
            inRun = false;
        }

        /** Whether `pos` (no null in it) is the run's position. */
        private boolean runAt(ArrayData pos) {
            if (pos.numElements() != runLength) return false;
            for (int i = 0; i < runLength; i++) {
                if (pos.getLong(i) != runPos[i]) return false;
            }
            return true;
        }

        /** One event of the current key (see the class comment for the rules). */
        private void event(InternalRow row) {
            if (barriers && row.getBoolean(ordinal(13))) {  // outside: a record below, counted
                outside++;
                return;
            }
            if (!row.isNullAt(ordinal(9))) {
                UTF8String p = row.getUTF8String(ordinal(9));
                if (problem == null || p.compareTo(problem) < 0) problem = p.clone();
            }
            ArrayData pos = row.isNullAt(ordinal(1)) ? null : row.getArray(ordinal(1));
            int rank = row.getInt(ordinal(2));
            if (truncateTimes.length > 0) truncatesAfter(row, row.getLong(ordinal(0)), pos, rank);
            long content = row.getLong(ordinal(8));
            boolean delete = row.getBoolean(ordinal(3));
            if (barriers) barrier(row, row.getLong(ordinal(0)), pos, rank);
            boolean write = !delete;
            boolean apply;
            if (seen == null) {
                apply = true;
            } else {
                int c = compare(pos, seen.pos());
                if (rank == 1 && seen.rank() == 1 && c == 0 && pos != null
                        && seen.content() != content) {
                    tied = true;
                }
                apply = c > 0 || (c == 0 && rank > seen.rank());
            }
            if (seen == null || greater(pos, rank, content, seen)) {
                seen = new Place(pos == null ? null : pos.copy(), rank, content);
            }
            if (!apply) return;
            long time = row.getLong(ordinal(0));
            if (time != sumsTime) {
                flush();
                sumsTime = time;
            }
            if (delete) segment++;
            InternalRow a = row.isNullAt(ordinal(4)) ? null : row.getStruct(ordinal(4), n);
            InternalRow ua = row.isNullAt(ordinal(5)) ? null : row.getStruct(ordinal(5), n);
            if (write && (lastDelete == null || lastDelete)) {
                InternalRow b = row.isNullAt(ordinal(6)) ? null : row.getStruct(ordinal(6), n);
                InternalRow ub = row.isNullAt(ordinal(7)) ? null : row.getStruct(ordinal(7), n);
                firstSegment = segment;
                firstBefore = b == null ? null : values(b);
                firstUnchanged = new boolean[n];
                for (int i = 0; i < n; i++) {
                    firstUnchanged[i] = ub == null || ub.isNullAt(i) || ub.getBoolean(i);
                }
            }
            UnsafeRow now = null;
            if (write) {
                Object[] values = new Object[n];
                for (int i = 0; i < n; i++) {
                    boolean unchanged = ua == null || ua.isNullAt(i) || ua.getBoolean(i);
                    if (!unchanged) {
                        real[i] = new Written(segment,
                            a == null ? null : normal(dataValues[i].copy(a, i)));
                    }
                    if (real[i] != null && real[i].segment() == segment) {
                        values[i] = real[i].value();
                    } else if (segment == 0 && stateValues != null) {
                        values[i] = stateValues[i];
                    } else if (firstSegment == segment && !firstUnchanged[i]
                            && firstBefore != null) {
                        values[i] = firstBefore[i];
                    }
                }
                now = row(values);
            }
            if (removedRows) {
                if (delete && previous != null) {
                    ready.add(new GenericInternalRow(new Object[] {
                        previous, time, pos == null ? null : pos.copy()}));
                }
                previous = now;
                lastDelete = delete;
                return;
            }
            // `previous` is the table's row until the key's first applied event
            if (previous != null) sums.merge(previous, -1L, Long::sum);
            if (now != null) sums.merge(now, 1L, Long::sum);
            previous = now;
            lastDelete = delete;
        }

        /** The values of a struct, each copied out of the row's buffer, floats made one. */
        private Object[] values(InternalRow struct) {
            Object[] out = new Object[n];
            for (int i = 0; i < n; i++) out[i] = normal(dataValues[i].copy(struct, i));
            return out;
        }

        private UnsafeRow row(Object[] values) {
            return unsafe.apply(new GenericInternalRow(values)).copy();
        }

        private boolean sameKey(InternalRow row) {
            for (int i = 0; i < keys; i++) {
                Object v = normal(keyValues[i].get(row, i));
                if (v == null ? key[i] != null : !v.equals(key[i])) return false;
            }
            return true;
        }

        /** Spark's order of structs `(pos, rank, content)`: is this one above `seen`? */
        private boolean greater(ArrayData pos, int rank, long content, Place seen) {
            int c = compare(pos, seen.pos());
            if (c != 0) return c > 0;
            if (rank != seen.rank()) return rank > seen.rank();
            return content > seen.content();
        }

        private int compare(ArrayData x, ArrayData y) {
            return Positions.compare(x, y, position);
        }
    }

    /** -0.0 and every NaN made one value each, as Spark's grouping makes them. */
    private static Object normal(Object value) {
        if (value instanceof Double d) {
            if (d.isNaN()) return Double.NaN;
            if (d == 0.0d) return 0.0d;
        } else if (value instanceof Float f) {
            if (f.isNaN()) return Float.NaN;
            if (f == 0.0f) return 0.0f;
        }
        return value;
    }
}
