package changelake.jvm;

import java.util.Arrays;
import java.util.Iterator;
import java.util.NoSuchElementException;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.execution.SQLExecution;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.storage.StorageLevel;
import org.apache.spark.unsafe.Platform;
import scala.Option;

/**
 * A DataFrame checkpointed on the executors' disk as chunks of its rows' bytes, and read back
 * as rows that point into them.
 *
 * The promise: `store(frame)` runs `frame`'s plan once, in one job, and returns a DataFrame
 * of the same schema and rows that never runs that plan again (its lineage ends at the stored
 * chunks, as `Dataset.localCheckpoint` does) and is read without copying a row. Its job is a
 * SQL execution of `frame`'s own plan, so the observations in that plan (`DataFrame.observe`)
 * are reported as an action's are. Unlike `localCheckpoint`'s, the frame keeps none of the
 * plan's partitioning, ordering or size estimate: a later step that needs one gets a shuffle
 * or a sort of its own (the parses' rows, Java's or a text scan's, have none to keep).
 *
 * Why not `localCheckpoint` itself: it stores each row as an object of its own, which the
 * block store serializes one by one (Kryo: a class, a length, a fresh copy of the row's bytes
 * both ways, and a reset per row). Here a task copies its rows' bytes into chunks of about a
 * megabyte, and the block store moves a few hundred chunks. Measured apart
 * (`benchmarks/bench_stored.py`, rows shaped as a parsed changefeed's), the store and the read
 * back are faster than `localCheckpoint`'s. In a whole ingest the checkpoints are a small
 * share, and the gain was within the runs' noise (benchmarks/README.md, "The parse's
 * checkpoint measured, and stored as chunks of row bytes").
 *
 * A chunk holds rows one after another, each as an 8-byte length and the row's bytes (a
 * multiple of 8, as every `UnsafeRow`'s is), so that every row starts 8-aligned in the chunk.
 */
public final class StoredRows {
    private StoredRows() {}

    /** About how many bytes one chunk holds: a row that does not fit starts the next. */
    static final int CHUNK = 1 << 20;

    /** `frame`, stored (see the class comment). */
    public static Dataset<Row> store(Dataset<Row> frame) {
        QueryExecution plan = frame.queryExecution();
        StructType schema = frame.schema();
        JavaRDD<byte[]> chunks = SQLExecution.withNewExecutionId(plan, Option.apply("stored"),
            () -> {
                JavaRDD<byte[]> packed = plan.executedPlan().execute().toJavaRDD()
                    .mapPartitions(new Pack(schema));
                packed.persist(StorageLevel.DISK_ONLY());
                packed.rdd().localCheckpoint();
                packed.count();
                return packed;
            });
        RDD<InternalRow> rows = chunks.mapPartitions(new Unpack(schema.length())).rdd();
        return frame.sparkSession().internalCreateDataFrame(rows, schema, false);
    }

    /** A task's rows into chunks. */
    private static final class Pack implements FlatMapFunction<Iterator<InternalRow>, byte[]> {
        private static final long serialVersionUID = 1L;
        private final StructType schema;

        Pack(StructType schema) {
            this.schema = schema;
        }

        @Override
        public Iterator<byte[]> call(Iterator<InternalRow> rows) {
            UnsafeProjection unsafe = UnsafeProjection.create(schema);
            return new Iterator<>() {
                private UnsafeRow held;  // read, not yet in a chunk: it starts the next

                @Override
                public boolean hasNext() {
                    return held != null || rows.hasNext();
                }

                @Override
                public byte[] next() {
                    if (!hasNext()) {
                        throw new NoSuchElementException();
                    }
                    byte[] chunk = null;
                    int used = 0;
                    while (held != null || rows.hasNext()) {
                        UnsafeRow row = held != null ? held : unsafe(rows.next());
                        int size = row.getSizeInBytes();
                        if (chunk == null) {
                            chunk = new byte[Math.max(CHUNK, 8 + size)];
                        } else if (used + 8 + size > chunk.length) {
                            held = row.copy();  // the reader may reuse the row it gave
                            return Arrays.copyOf(chunk, used);
                        }
                        held = null;
                        Platform.putLong(chunk, Platform.BYTE_ARRAY_OFFSET + used, size);
                        row.writeToMemory(chunk, Platform.BYTE_ARRAY_OFFSET + used + 8);
                        used += 8 + size;
                    }
                    return used == chunk.length ? chunk : Arrays.copyOf(chunk, used);
                }

                private UnsafeRow unsafe(InternalRow row) {
                    return row instanceof UnsafeRow u ? u : unsafe.apply(row);
                }
            };
        }
    }

    /** A task's chunks back into rows, each a row of its own that points into its chunk. */
    private static final class Unpack implements FlatMapFunction<Iterator<byte[]>, InternalRow> {
        private static final long serialVersionUID = 1L;
        private final int fields;

        Unpack(int fields) {
            this.fields = fields;
        }

        @Override
        public Iterator<InternalRow> call(Iterator<byte[]> chunks) {
            return new Iterator<>() {
                private byte[] chunk;
                private int at;

                @Override
                public boolean hasNext() {
                    while (chunk == null || at >= chunk.length) {
                        if (!chunks.hasNext()) {
                            return false;
                        }
                        chunk = chunks.next();
                        at = 0;
                    }
                    return true;
                }

                @Override
                public InternalRow next() {
                    if (!hasNext()) {
                        throw new NoSuchElementException();
                    }
                    int size = (int) Platform.getLong(chunk, Platform.BYTE_ARRAY_OFFSET + at);
                    UnsafeRow row = new UnsafeRow(fields);
                    row.pointTo(chunk, Platform.BYTE_ARRAY_OFFSET + at + 8, size);
                    at += 8 + size;
                    return row;
                }
            };
        }
    }
}
