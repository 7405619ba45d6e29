package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.math.BigInteger;
import java.util.Random;
import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.LongType$;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.DecimalType;
import org.junit.jupiter.api.Test;

/** `Positions.compare`: Spark's order of arrays (null first, element by element with nulls
 * first, then the shorter); and `compareSigned`, the order of two's complement bytes. */
class PositionsTest {
    static final DecimalType UINT64 = new DecimalType(20, 0);
    /** Spark's bigint (not through `DataTypes`, whose loading needs ICU's collations). */
    static final DataType BIGINT = LongType$.MODULE$;

    static ArrayData longs(long... values) {
        return UnsafeArrayData.fromPrimitiveArray(values);
    }

    static ArrayData generic(Object... values) {
        return new GenericArrayData(values);
    }

    static int sign(int c) {
        return Integer.signum(c);
    }

    @Test
    void aNullArrayComesFirst() {
        assertEquals(0, Positions.compare(null, null, BIGINT));
        assertEquals(-1, sign(Positions.compare(null, longs(), BIGINT)));
        assertEquals(1, sign(Positions.compare(longs(), null, BIGINT)));
    }

    @Test
    void bigintArraysCompareElementByElementThenByLength() {
        assertEquals(-1, sign(Positions.compare(longs(1, 2, 3), longs(1, 3), BIGINT)));
        assertEquals(1, sign(Positions.compare(longs(2), longs(1, 9, 9), BIGINT)));
        assertEquals(-1, sign(Positions.compare(longs(1, 2), longs(1, 2, 0), BIGINT)));
        assertEquals(0, Positions.compare(longs(1, 2), longs(1, 2), BIGINT));
        assertEquals(-1, sign(Positions.compare(longs(Long.MIN_VALUE), longs(-1),
                                                BIGINT)));
    }

    @Test
    void aNullElementComesFirst() {
        ArrayData withNull = generic(1L, null);
        assertEquals(-1, sign(Positions.compare(withNull, generic(1L, 0L), BIGINT)));
        assertEquals(1, sign(Positions.compare(generic(1L, 0L), withNull, BIGINT)));
        assertEquals(0, Positions.compare(withNull, generic(1L, null), BIGINT));
    }

    @Test
    void decimalsCompareByValue() {
        Decimal big = Decimal.apply(new java.math.BigDecimal("18446744073709551615"), 20, 0);
        Decimal small = Decimal.apply(new java.math.BigDecimal("5"), 20, 0);
        assertEquals(1, sign(Positions.compare(generic(big), generic(small), UINT64)));
        assertEquals(-1, sign(Positions.compare(generic(small, big), generic(big), UINT64)));
        assertEquals(0, Positions.compare(generic(big), generic(big), UINT64));
    }

    @Test
    void signedBytesCompareAsTheirIntegers() {
        Random random = new Random(68);
        for (int i = 0; i < 20000; i++) {
            BigInteger a = new BigInteger(random.nextInt(80), random);
            BigInteger b = random.nextInt(4) == 0 ? a : new BigInteger(random.nextInt(80), random);
            if (random.nextBoolean()) a = a.negate();
            if (random.nextBoolean()) b = b.negate();
            assertEquals(a.compareTo(b),
                         sign(Positions.compareSigned(a.toByteArray(), b.toByteArray())),
                         a + " vs " + b);
        }
    }

    @Test
    void theShorterIsSignExtended() {
        // 128 is 00 80, 127 is 7f; -1 is ff, -256 is ff 00
        assertEquals(1, sign(Positions.compareSigned(new byte[] {0, (byte) 0x80},
                                                     new byte[] {0x7f})));
        assertEquals(1, sign(Positions.compareSigned(new byte[] {(byte) 0xff},
                                                     new byte[] {(byte) 0xff, 0})));
        assertEquals(0, Positions.compareSigned(new byte[] {(byte) 0xff},
                                                new byte[] {(byte) 0xff, (byte) 0xff}));
    }
}
