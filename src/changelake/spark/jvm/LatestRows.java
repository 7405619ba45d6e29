package changelake.jvm;

import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Objects;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.StructType;

/**
 * Each key's latest row, its partial step: every run of consecutive rows of one key reduced to
 * the row of the greatest `(time, diff)` in it, in one pass over a task's rows and no sort.
 *
 * The promise: for any input, the rows kept hold each key's greatest `(time, diff)` row, so a
 * "latest per key" over them (a window by key ordered by `time DESC, diff DESC NULLS LAST`)
 * gives the rows it gives over the whole input. It is a reduction only where a key's rows come
 * together, as a table's `updates` files hold them (the conversion writes each key's updates
 * in one run); elsewhere rows pass through, and the window does the work as before.
 *
 * Keys are compared by their values' `equals` (a string's or a struct's bytes, a double's
 * bits): two values Spark's window would group together but `equals` tells apart (0.0 and
 * -0.0) start a new run, which only keeps one row more. A null `time` or `diff` is below every
 * value, as `DESC NULLS LAST` orders it; of two rows of the same `(time, diff)` the first is
 * kept.
 */
public final class LatestRows {
    private LatestRows() {}

    /** `rows` reduced so, on the same schema: `keys`, `time` and `diff` are column names. */
    public static Dataset<Row> ofRuns(Dataset<Row> rows, List<String> keys, String time,
                                      String diff) {
        StructType schema = rows.schema();
        int[] keyAt = new int[keys.size()];
        for (int i = 0; i < keyAt.length; i++) keyAt[i] = schema.fieldIndex(keys.get(i));
        RDD<InternalRow> in = rows.queryExecution().toRdd();
        RDD<InternalRow> out = in.toJavaRDD()
            .mapPartitions(new Runs(schema, keyAt, schema.fieldIndex(time),
                                    schema.fieldIndex(diff))).rdd();
        return rows.sparkSession().internalCreateDataFrame(out, schema, false);
    }

    /** The function each task runs over its partition. */
    private static final class Runs implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
        private static final long serialVersionUID = 1L;
        private final StructType schema;
        private final int[] keyAt;
        private final int timeAt;
        private final int diffAt;

        Runs(StructType schema, int[] keyAt, int timeAt, int diffAt) {
            this.schema = schema;
            this.keyAt = keyAt;
            this.timeAt = timeAt;
            this.diffAt = diffAt;
        }

        @Override
        public Iterator<InternalRow> call(Iterator<InternalRow> rows) {
            return new Latest(rows, schema, keyAt, timeAt, diffAt);
        }
    }

    /** The rows of one task as the caller pulls them: a run's row once the next run starts. */
    private static final class Latest implements Iterator<InternalRow> {
        private final Iterator<InternalRow> rows;
        private final int[] keyAt;
        private final int timeAt;
        private final int diffAt;
        private final Getter[] keyValues;
        private Object[] runKey;
        private InternalRow best;
        private InternalRow ready;

        Latest(Iterator<InternalRow> rows, StructType schema, int[] keyAt, int timeAt,
               int diffAt) {
            this.rows = rows;
            this.keyAt = keyAt;
            this.timeAt = timeAt;
            this.diffAt = diffAt;
            this.keyValues = new Getter[keyAt.length];
            for (int i = 0; i < keyAt.length; i++) {
                keyValues[i] = Getter.of(schema.fields()[keyAt[i]].dataType());
            }
        }

        @Override
        public boolean hasNext() {
            while (ready == null) {
                if (!rows.hasNext()) {
                    ready = best;
                    best = null;
                    return ready != null;
                }
                // The input's rows may be one buffer, read again: what is kept is copied.
                InternalRow row = rows.next();
                if (best == null || !sameKey(row)) {
                    ready = best;
                    runKey = key(row);
                    best = row.copy();
                } else if (above(row, best)) {
                    best = row.copy();
                }
            }
            return true;
        }

        @Override
        public InternalRow next() {
            if (!hasNext()) throw new NoSuchElementException();
            InternalRow out = ready;
            ready = null;
            return out;
        }

        private boolean sameKey(InternalRow row) {
            for (int i = 0; i < keyAt.length; i++) {
                if (!Objects.equals(keyValues[i].get(row, keyAt[i]), runKey[i])) return false;
            }
            return true;
        }

        private Object[] key(InternalRow row) {
            Object[] out = new Object[keyAt.length];
            for (int i = 0; i < keyAt.length; i++) out[i] = keyValues[i].copy(row, keyAt[i]);
            return out;
        }

        /** Whether `row` orders before `kept` by `time DESC, diff DESC NULLS LAST`. */
        private boolean above(InternalRow row, InternalRow kept) {
            int c = compare(row, kept, timeAt);
            return c > 0 || (c == 0 && compare(row, kept, diffAt) > 0);
        }

        private static int compare(InternalRow a, InternalRow b, int at) {
            boolean an = a.isNullAt(at);
            boolean bn = b.isNullAt(at);
            if (an || bn) return an == bn ? 0 : an ? -1 : 1;
            return Long.compare(a.getLong(at), b.getLong(at));
        }
    }
}
