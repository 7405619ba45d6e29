package changelake.jvm;

import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;

/**
 * Positions (`pos`: arrays of bigint, or of decimal(20,0) for YDB's Uint64 steps) compared as
 * Spark orders arrays, so that the Java passes (`KeyedConversion`, `YdbLines`' blocks) order
 * positions as Spark's own comparisons of the same columns do.
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
                c = d.precision() > Decimal.MAX_LONG_DIGITS() && x instanceof UnsafeArrayData
                        && y instanceof UnsafeArrayData
                    ? compareSigned(x.getBinary(i), y.getBinary(i))
                    : x.getDecimal(i, d.precision(), d.scale())
                        .compare(y.getDecimal(i, d.precision(), d.scale()));
            } else {
                c = Long.compare(x.getLong(i), y.getLong(i));
            }
            if (c != 0) return c;
        }
        return Integer.compare(x.numElements(), y.numElements());
    }

    /**
     * Two unscaled values of one decimal type, as Spark stores a decimal wider than a long
     * (big-endian two's complement, `BigInteger.toByteArray`), compared without building a
     * `BigDecimal` of each: the sign, then the bytes, the shorter sign-extended. With
     * `BigDecimal`s, `compare` was a larger share of a YDB ingest's task samples (Flight
     * Recorder profiles: benchmarks/README.md, "The floor of a keyed conversion").
     */
    static int compareSigned(byte[] a, byte[] b) {
        boolean aNegative = a.length > 0 && a[0] < 0, bNegative = b.length > 0 && b[0] < 0;
        if (aNegative != bNegative) return aNegative ? -1 : 1;
        int n = Math.max(a.length, b.length), pad = aNegative ? 0xff : 0;
        for (int i = 0; i < n; i++) {
            int ai = i - (n - a.length), bi = i - (n - b.length);
            int av = ai < 0 ? pad : a[ai] & 0xff, bv = bi < 0 ? pad : b[bi] & 0xff;
            if (av != bv) return av < bv ? -1 : 1;
        }
        return 0;
    }
}
