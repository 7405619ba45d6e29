package changelake.jvm;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Set;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.PartitionPruningRDD;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.runtime.AbstractFunction1;

/**
 * YDB's barrier rule within each block of lines, as one pass over the parsed lines in the
 * order they were read (`barriers.scan_below`), where a window sorted every record by chunk
 * of lines after a shuffle.
 *
 * The promise: for every block (`file_index`, `block`) whose rows all lie in one partition,
 * in increasing `row` order, the rows returned are exactly its records (`kind` "change") whose
 * `pos` is below the highest barrier (`_barrier`, non-null on a barrier) of the earlier rows of
 * the same block, and one summary row per block says what the caller needs to reach across
 * blocks: the block's highest barrier (`_high`), the least and the greatest position of its
 * records (`_low`, `_top`) and its partition. A block with a record below the highest barrier
 * of its file's earlier blocks is read again (`rescan`), alone with the other blocks of its
 * partition, with that barrier to start from; the records below are looked up only in the
 * partitions whose blocks' positions reach theirs (`only`).
 *
 * The pass cannot see where Spark put a block's rows, so it checks what it relies on and says
 * when it does not hold, rather than answering wrongly: `_disorder` marks a block whose rows
 * were not in increasing `row` order or were not next to each other in the partition, and a
 * block seen by two partitions has two summary rows. The caller then takes the window instead
 * (`times.highest_before`).
 *
 * What is held is one block's highest barrier and least and greatest position at a time, and
 * the blocks the partition has finished (a few), however many records a block has.
 */
public final class BarrierScan {
    private BarrierScan() {}

    private static final int FILE = 0;
    private static final int BLOCK = 1;
    private static final int ROW = 2;
    private static final int KIND = 3;
    private static final int POS = 4;
    private static final int BARRIER = 5;
    /** The columns `scan` adds to `lines`' (`output`). */
    private static final int SUMMARY = 6;

    /**
     * The records of `lines` (columns in this order: file_index int, block bigint, row bigint,
     * kind string, pos array, _barrier array of the same type, then any others, returned as they
     * are) below their block's running highest barrier, and one summary row per block, as
     * `lines`' columns then `_summary boolean, _high array, _low array, _top array,
     * _disorder boolean, _partition int` (`SUMMARY` columns: a summary row has only file_index
     * and block besides these; a record's are null but `_summary`).
     */
    public static Dataset<Row> scan(Dataset<Row> lines) {
        StructType out = output(lines.schema());
        RDD<InternalRow> found = lines.queryExecution().toRdd().toJavaRDD()
            .mapPartitions(new Partition(lines.schema(), out, null)).rdd();
        return lines.sparkSession().internalCreateDataFrame(found, out, false);
    }

    /**
     * Every record below a barrier in the blocks `bounds` names (file_index int, block bigint,
     * _bound: the highest barrier of the file's earlier blocks), as `scan` returns records: those
     * below the greater of the bound and the block's running highest. Only `partitions` of
     * `lines` are read: where `scan` found those blocks (the same `lines`, so the same
     * partitions).
     */
    public static Dataset<Row> rescan(Dataset<Row> lines, Dataset<Row> bounds,
                                      List<Integer> partitions) {
        Map<List<Long>, ArrayData> from = new HashMap<>();
        for (InternalRow bound : bounds.queryExecution().executedPlan().executeCollect()) {
            from.put(List.of((long) bound.getInt(0), bound.getLong(1)), bound.getArray(2).copy());
        }
        StructType out = output(lines.schema());
        RDD<InternalRow> found = pruned(lines, partitions).toJavaRDD()
            .mapPartitions(new Partition(lines.schema(), out, from)).rdd();
        return lines.sparkSession().internalCreateDataFrame(found, out, false);
    }

    /** `lines` with only its `partitions` (as `scan` numbered them), read. */
    public static Dataset<Row> only(Dataset<Row> lines, List<Integer> partitions) {
        return lines.sparkSession().internalCreateDataFrame(
            pruned(lines, partitions), lines.schema(), false);
    }

    private static RDD<InternalRow> pruned(Dataset<Row> lines, List<Integer> partitions) {
        return PartitionPruningRDD.create(
            lines.queryExecution().toRdd(), new Among(new HashSet<>(partitions)));
    }

    /** `lines`' columns, every one nullable (a summary row has no value but file_index and
     * block), then the summary's. */
    private static StructType output(StructType in) {
        DataType position = in.fields()[POS].dataType();
        StructType out = new StructType();
        for (StructField field : in.fields()) {
            out = out.add(field.name(), field.dataType(), true, field.metadata());
        }
        return out
            .add(DataTypes.createStructField("_summary", DataTypes.BooleanType, false))
            .add(DataTypes.createStructField("_high", position, true))
            .add(DataTypes.createStructField("_low", position, true))
            .add(DataTypes.createStructField("_top", position, true))
            .add(DataTypes.createStructField("_disorder", DataTypes.BooleanType, true))
            .add(DataTypes.createStructField("_partition", DataTypes.IntegerType, true));
    }

    /** The partitions `rescan` and `only` read. */
    private static final class Among extends AbstractFunction1<Object, Object>
            implements Serializable {
        private static final long serialVersionUID = 1L;
        private final Set<Integer> partitions;

        Among(Set<Integer> partitions) {
            this.partitions = partitions;
        }

        @Override
        public Object apply(Object index) {
            return partitions.contains((Integer) index);
        }
    }

    /** The function each task runs over its partition. */
    private static final class Partition
            implements FlatMapFunction<Iterator<InternalRow>, InternalRow> {
        private static final long serialVersionUID = 1L;
        private final DataType[] types;
        private final DataType element;
        private final StructType out;
        private final Map<List<Long>, ArrayData> bounds;

        Partition(StructType in, StructType out, Map<List<Long>, ArrayData> bounds) {
            this.types = new DataType[in.fields().length];
            for (int i = 0; i < types.length; i++) types[i] = in.fields()[i].dataType();
            this.element = ((ArrayType) in.fields()[POS].dataType()).elementType();
            this.out = out;
            this.bounds = bounds;
        }

        @Override
        public Iterator<InternalRow> call(Iterator<InternalRow> rows) {
            return new Below(rows, types, element, out, bounds);
        }
    }

    /** The records below and the summaries of one partition, as the caller pulls them. */
    private static final class Below implements Iterator<InternalRow> {
        private static final UTF8String CHANGE = UTF8String.fromString("change");
        private final Iterator<InternalRow> rows;
        private final DataType[] types;
        private final DataType element;
        private final UnsafeProjection unsafe;
        private final Map<List<Long>, ArrayData> bounds;  // `rescan`'s; null for `scan`
        private final List<InternalRow> summaries = new ArrayList<>();
        private final Set<List<Long>> finished = new HashSet<>();
        private InternalRow pending;
        private int nextSummary;
        private boolean drained;

        // The current block, and what its pass carries.
        private boolean inBlock;
        private int file;
        private long block;
        private long lastRow;
        private ArrayData high;
        private ArrayData low;
        private ArrayData top;
        private boolean disorder;
        private boolean wanted;  // the block's records are returned: always for `scan`

        Below(Iterator<InternalRow> rows, DataType[] types, DataType element, StructType out,
              Map<List<Long>, ArrayData> bounds) {
            this.rows = rows;
            this.types = types;
            this.element = element;
            this.unsafe = UnsafeProjection.create(out);
            this.bounds = bounds;
        }

        @Override
        public boolean hasNext() {
            while (pending == null && !drained) {
                if (!rows.hasNext()) {
                    endBlock();
                    drained = true;
                    break;
                }
                pending = take(rows.next());
            }
            if (pending != null) return true;
            return nextSummary < summaries.size();
        }

        @Override
        public InternalRow next() {
            if (!hasNext()) throw new NoSuchElementException();
            if (pending != null) {
                InternalRow row = pending;
                pending = null;
                return row;
            }
            return summaries.get(nextSummary++);
        }

        /** Apply one line; the record it is if below, else null. */
        private InternalRow take(InternalRow row) {
            int f = row.getInt(FILE);
            long b = row.getLong(BLOCK);
            long r = row.getLong(ROW);
            if (!inBlock || f != file || b != block) {
                endBlock();
                List<Long> place = List.of((long) f, b);
                inBlock = true;
                file = f;
                block = b;
                // `rescan` starts a block it names from its bound, and skips the others.
                high = bounds == null ? null : bounds.get(place);
                wanted = bounds == null || high != null;
                low = null;
                top = null;
                disorder = !finished.add(place);
            } else if (r <= lastRow) {
                disorder = true;
            }
            lastRow = r;
            if (!wanted) return null;
            InternalRow found = null;
            if (!row.isNullAt(KIND) && CHANGE.equals(row.getUTF8String(KIND))
                    && !row.isNullAt(POS)) {
                ArrayData pos = row.getArray(POS);
                if (high != null && compare(pos, high) < 0) found = record(row);
                if (low == null || compare(pos, low) < 0) low = pos.copy();
                if (top == null || compare(pos, top) > 0) top = pos.copy();
            }
            if (!row.isNullAt(BARRIER)) {
                ArrayData barrier = row.getArray(BARRIER);
                if (high == null || compare(barrier, high) > 0) high = barrier.copy();
            }
            return found;
        }

        /** The record `row` with its summary columns null. */
        private InternalRow record(InternalRow row) {
            Object[] values = new Object[types.length + SUMMARY];
            for (int i = 0; i < types.length; i++) {
                values[i] = row.isNullAt(i) ? null : row.get(i, types[i]);
            }
            values[types.length] = false;
            return unsafe.apply(new GenericInternalRow(values)).copy();
        }

        private void endBlock() {
            if (!inBlock) return;
            inBlock = false;
            if (bounds != null) return;  // `rescan` returns records only
            Object[] values = new Object[types.length + SUMMARY];
            values[FILE] = file;
            values[BLOCK] = block;
            values[types.length] = true;
            values[types.length + 1] = high;
            values[types.length + 2] = low;
            values[types.length + 3] = top;
            values[types.length + 4] = disorder;
            values[types.length + 5] = TaskContext.getPartitionId();
            summaries.add(unsafe.apply(new GenericInternalRow(values)).copy());
        }

        private int compare(ArrayData x, ArrayData y) {
            return Positions.compare(x, y, element);
        }
    }
}
