package changelake.jvm;

import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DecimalType;

/**
 * Positions (`pos`: arrays of bigint, or of decimal(20,0) for YDB's Uint64 steps) compared as
 * Spark orders arrays, so that the Java passes (`KeyedConversion`, `BarrierScan`) decide what
 * the windows they replace decided.
 */
final class Positions {
    private Positions() {}

    /** Spark's order of arrays of `element`: a null array first, then element by element
     * (nulls first), then the shorter. */
    static int compare(ArrayData x, ArrayData y, DataType element) {
        if (x == null || y == null) return x == null ? (y == null ? 0 : -1) : 1;
        int common = Math.min(x.numElements(), y.numElements());
        for (int i = 0; i < common; i++) {
            boolean xn = x.isNullAt(i);
            boolean yn = y.isNullAt(i);
            if (xn || yn) {
                if (xn && yn) continue;
                return xn ? -1 : 1;
            }
            int c;
            if (element instanceof DecimalType d) {
                c = x.getDecimal(i, d.precision(), d.scale())
                    .compare(y.getDecimal(i, d.precision(), d.scale()));
            } else {
                c = Long.compare(x.getLong(i), y.getLong(i));
            }
            if (c != 0) return c;
        }
        return Integer.compare(x.numElements(), y.numElements());
    }
}
