package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.math.BigDecimal;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;

/** `YdbLine`: a YDB changefeed line of the records YDB writes read into its values (key,
 * update, reset, erase, newImage, oldImage, ts, resolved, a null); every other left (null). */
class YdbLineTest {
    static final int KEY = 0, UPDATE = 1, RESET = 2, ERASE = 3, NEW_IMAGE = 4, OLD_IMAGE = 5,
        TS = 6, RESOLVED = 7, CORRUPT = 8;

    /** A table `(id Uint64 key, name Utf8, n Int32, ok Bool, x Double)`: as
     * `ydb.java_table` writes it. */
    static final String TABLE = "[[\"id\",\"decimal(20,0)\",\"uint\",0,null,null],"
        + "[\"name\",\"string\",\"string\",-1,null,null],"
        + "[\"n\",\"bigint\",\"int\",-1,-2147483648,2147483647],"
        + "[\"ok\",\"boolean\",\"bool\",-1,null,null],"
        + "[\"x\",\"double\",\"number\",-1,null,null]]";

    static final YdbLine.Table T;

    static {
        try {
            T = new YdbLine.Table(TABLE);
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
    }

    static Object[] read(String line) {
        return YdbLine.values(line, T);
    }

    static void assertDeferred(String line) {
        assertNull(read(line), line);
    }

    static Object[] key(Object[] row) {
        return (Object[]) row[KEY];
    }

    static Object[] body(Object[] row, int at) {
        return (Object[]) row[at];
    }

    static BigDecimal[] pair(Object[] row, int at) {
        return (BigDecimal[]) row[at];
    }

    @Test
    void anUpdateIsReadIntoTheKeyItsColumnsAndItsTime() {
        Object[] row = read("{\"update\":{\"name\":\"pen\",\"n\":-3,\"ok\":true,\"x\":1},"
                       + "\"key\":[18446744073709551615],\"ts\":[1700000000000,5]}");
        assertArrayEquals(new Object[] {new BigDecimal("18446744073709551615")}, key(row));
        Object[] update = body(row, UPDATE);
        assertEquals("pen", update[0]);
        assertEquals(-3L, update[1]);
        assertEquals(true, update[2]);
        assertEquals(1.0, update[3]);
        assertArrayEquals(new BigDecimal[] {new BigDecimal(1700000000000L), new BigDecimal(5)},
                          pair(row, TS));
        assertNull(row[RESET]);
        assertNull(row[ERASE]);
        assertNull(row[RESOLVED]);
        assertNull(row[CORRUPT]);
        assertEquals(9, row.length);
    }

    @Test
    void aColumnNoFieldNamesIsNull() {
        Object[] update = body(read("{\"update\":{\"x\":2.5},\"key\":[1],\"ts\":[1,1]}"), UPDATE);
        assertNull(update[0]);
        assertEquals(2.5, update[3]);
    }

    @Test
    void anEraseIsAnyObjectItsMembersIgnored() {
        Object[] row = read("{\"erase\":{},\"key\":[7],\"ts\":[2,0]}");
        Object[] erase = body(row, ERASE);
        assertEquals(4, erase.length);
        for (int i = 0; i < 4; i++) assertNull(erase[i]);
        Object[] full = read("{\"erase\":{\"name\":\"a\",\"x\":{\"y\":[1]}},\"key\":[7]}");
        assertArrayEquals(new Object[4], body(full, ERASE));
        assertDeferred("{\"erase\":null,\"key\":[7],\"ts\":[2,0]}");
        assertDeferred("{\"erase\":[],\"key\":[7],\"ts\":[2,0]}");
    }

    @Test
    void aNullInUpdateSetsItsColumnOneNotNamedIsLeftAsItIs() {
        Object[] update = body(read("{\"update\":{\"name\":null,\"x\":null,\"n\":2},"
                                    + "\"key\":[1]}"), UPDATE);
        assertSame(YdbLine.NULL, update[0]);
        assertEquals(2L, update[1]);
        assertNull(update[2]);  // not named: unchanged
        assertSame(YdbLine.NULL, update[3]);
    }

    @Test
    void aResetAndImagesHoldNullsAsNull() {
        Object[] row = read("{\"reset\":{\"name\":null,\"n\":1},\"newImage\":{\"name\":\"a\","
                            + "\"x\":null},\"oldImage\":null,\"key\":[1],\"ts\":[3,0]}");
        assertNull(body(row, RESET)[0]);
        assertEquals(1L, body(row, RESET)[1]);
        assertEquals("a", body(row, NEW_IMAGE)[0]);
        assertNull(body(row, NEW_IMAGE)[3]);
        assertNull(row[OLD_IMAGE]);
    }

    @Test
    void aFloatWrittenAsNanOrAnInfinityIsRead() {
        assertEquals(Double.NaN, body(read("{\"update\":{\"x\":\"nan\"},\"key\":[1]}"), UPDATE)[3]);
        assertEquals(Double.POSITIVE_INFINITY,
                     body(read("{\"reset\":{\"x\":\"inf\"},\"key\":[1]}"), RESET)[3]);
        assertEquals(Double.NEGATIVE_INFINITY,
                     body(read("{\"erase\":{},\"oldImage\":{\"x\":\"-inf\"},\"key\":[1]}"),
                          OLD_IMAGE)[3]);
        for (String other : new String[] {"NaN", "Infinity", "+inf", "nan ", "1.5", ""}) {
            assertDeferred("{\"update\":{\"x\":\"" + other + "\"},\"key\":[1]}");
        }
        assertDeferred("{\"update\":{\"n\":\"nan\"},\"key\":[1]}");  // not a float column
        assertDeferred("{\"update\":{\"name\":\"x\"},\"key\":[\"nan\"]}");
    }

    @Test
    void anIntegerBeyond64BitsIsAFloatsValue() {
        assertEquals(1.8446744073709552e19,
                     body(read("{\"update\":{\"x\":18446744073709551616},\"key\":[1]}"),
                          UPDATE)[3]);
        assertEquals(-1e30, body(read("{\"update\":{\"x\":-1000000000000000000000000000000},"
                                      + "\"key\":[1]}"), UPDATE)[3]);
        assertDeferred("{\"update\":{\"x\":1" + "0".repeat(400) + "},\"key\":[1]}");
    }

    @Test
    void aResolvedStandsAlone() {
        Object[] row = read("{\"resolved\":[1700000000000,18446744073709551615]}");
        assertArrayEquals(new BigDecimal[] {new BigDecimal(1700000000000L),
                                            new BigDecimal("18446744073709551615")},
                          pair(row, RESOLVED));
        assertNull(row[KEY]);
        assertDeferred("{\"resolved\":[1,0],\"key\":[1]}");
    }

    @Test
    void aTsIsTwoNonNegativeIntegersOfAtMost20Digits() {
        read("{\"erase\":{},\"key\":[1],\"ts\":[99999999999999999999,0]}");
        assertDeferred("{\"erase\":{},\"key\":[1],\"ts\":[100000000000000000000,0]}");
        assertDeferred("{\"erase\":{},\"key\":[1],\"ts\":[-1,0]}");
        assertDeferred("{\"erase\":{},\"key\":[1],\"ts\":[-0,0]}");
        assertDeferred("{\"erase\":{},\"key\":[1],\"ts\":[1]}");
        assertDeferred("{\"erase\":{},\"key\":[1],\"ts\":[1,2,3]}");
        assertDeferred("{\"erase\":{},\"key\":[1],\"ts\":[1.5,0]}");
    }

    @Test
    void theKeyIsOneValueOfItsKindPerKeyColumn() {
        assertDeferred("{\"erase\":{},\"key\":[1,2],\"ts\":[1,0]}");
        assertDeferred("{\"erase\":{},\"key\":[],\"ts\":[1,0]}");
        assertDeferred("{\"erase\":{},\"key\":[null],\"ts\":[1,0]}");
        assertDeferred("{\"erase\":{},\"key\":[\"1\"],\"ts\":[1,0]}");
        assertDeferred("{\"erase\":{},\"key\":[-1],\"ts\":[1,0]}");
        assertDeferred("{\"erase\":{},\"key\":1,\"ts\":[1,0]}");
    }

    @Test
    void aValueOfAnotherKindOrBeyondItsTypeIsLeft() {
        assertDeferred("{\"update\":{\"name\":1},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"n\":\"1\"},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"n\":1.0},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"n\":9223372036854775808},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"n\":-9223372036854775809},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"name\":\"a\"},\"key\":[-0],\"ts\":[1,0]}");  // -0: left
        assertDeferred("{\"update\":{\"ok\":1},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"x\":1e999},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"x\":\"NaN\"},\"key\":[1],\"ts\":[1,0]}");
    }

    @Test
    void namesNotOfTheTableOrTwiceAreLeft() {
        assertDeferred("{\"update\":{\"id\":1},\"key\":[1],\"ts\":[1,0]}");  // a key column
        assertDeferred("{\"update\":{\"other\":1},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"upsert\":{},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{}");
        assertDeferred("{\"update\":{\"name\":\"a\",\"name\":\"b\"},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"key\":[1],\"key\":[1],\"erase\":{}}");
    }

    @Test
    void escapesAreReadAsOrjsonReadsThem() {
        assertEquals("a\"b\\/\n\t\u0000",
                     body(read("{\"update\":{\"name\":\"a\\\"b\\\\\\/\\n\\t\\u0000\"},"
                               + "\"key\":[1]}"), UPDATE)[0]);
        assertEquals("A\ud83d\ude00",
                     body(read("{\"update\":{\"name\":\"\\u0041\\ud83d\\uDE00\"},"
                               + "\"key\":[1]}"), UPDATE)[0]);
        assertEquals("é\"",
                     body(read("{\"update\":{\"name\":\"é\\\"\"},\"key\":[1]}"), UPDATE)[0]);
        assertEquals(2L, body(read("{\"\\u0075pdate\":{\"\\u006e\":2},\"key\":[1]}"), UPDATE)[1]);
        assertEquals("\ufffd", body(read("{\"update\":{\"name\":\"\ufffd\"},\"key\":[1]}"),
                                     UPDATE)[0]);
    }

    @Test
    void anUnpairedSurrogateAMarkAndMalformedLinesAreLeft() {
        assertDeferred("{\"update\":{\"name\":\"\\ud800\"},\"key\":[1]}");
        assertDeferred("{\"update\":{\"name\":\"\\udc00x\"},\"key\":[1]}");
        assertDeferred("{\"update\":{\"name\":\"\\ud83dx\"},\"key\":[1]}");
        assertDeferred("{\"update\":{\"name\":\"é\\ud83d\"},\"key\":[1]}");
        assertDeferred("{\"update\":{\"name\":\"\\a\"},\"key\":[1]}");
        assertDeferred("\ufeff{\"erase\":{},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"name\":\"\ufeffé\"},\"key\":[1]}");
        assertDeferred("{\"erase\":{},\"key\":[1],\"ts\":[1,0]} x");
        assertDeferred("{\"erase\":{},\"key\":[1]");
        assertDeferred("[1]");
        assertDeferred("null");
        assertNull(YdbLine.values((String) null, T));
    }

    @Test
    void theTableKeepsItsKeysInKeyOrder() throws IOException {
        String spec = "[[\"b\",\"bigint\",\"int\",1,null,null],[\"v\",\"string\",\"string\",-1,"
            + "null,null],[\"a\",\"bigint\",\"int\",0,null,null]]";
        YdbLine.Table table = new YdbLine.Table(spec);
        assertEquals(2, table.keys.size());
        assertArrayEquals(new int[] {1, -1, 0}, table.order);
        Object[] row = YdbLine.values("{\"erase\":{},\"key\":[10,20],\"ts\":[1,0]}", table);
        assertArrayEquals(new Object[] {10L, 20L}, key(row));
        assertThrows(IOException.class,
                     () -> new YdbLine.Table("[[\"a\",\"bigint\",\"int\",1,null,null]]"));
        assertThrows(IOException.class,
                     () -> new YdbLine.Table("[[\"a\",\"int\",\"int\",0,null,null]]"));
    }

    @Test
    void anAsciiLineAndATextLineReadAlike() {
        String ascii = "{\"update\":{\"name\":\"pen\"},\"key\":[1],\"ts\":[4,0]}";
        String text = "{\"update\":{\"name\":\"päper\"},\"key\":[1],\"ts\":[4,0]}";
        assertEquals("pen", body(YdbLine.values(UTF8String.fromString(ascii), T), UPDATE)[0]);
        assertEquals("päper", body(YdbLine.values(UTF8String.fromString(text), T), UPDATE)[0]);
        assertEquals("p\"n", body(read(ascii.replace("pen", "p\\\"n")), UPDATE)[0]);
    }
}
