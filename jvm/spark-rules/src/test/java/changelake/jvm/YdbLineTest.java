package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.math.BigDecimal;
import org.apache.spark.sql.Row;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;

/** `YdbLine`: a plainly simple YDB changefeed line read into the typed parse's struct (key,
 * update, reset, erase, newImage, oldImage, ts, resolved, _corrupt); every other left (null). */
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

    static Row read(String line) {
        return new YdbLine().call(line, TABLE);
    }

    static void assertDeferred(String line) {
        assertNull(read(line), line);
    }

    static Object[] key(Row row) {
        return (Object[]) row.get(KEY);
    }

    static BigDecimal[] pair(Row row, int at) {
        return (BigDecimal[]) row.get(at);
    }

    @Test
    void anUpdateIsReadIntoTheKeyItsColumnsAndItsTime() {
        Row row = read("{\"update\":{\"name\":\"pen\",\"n\":-3,\"ok\":true,\"x\":1},"
                       + "\"key\":[18446744073709551615],\"ts\":[1700000000000,5]}");
        assertArrayEquals(new Object[] {new BigDecimal("18446744073709551615")}, key(row));
        Row update = row.getStruct(UPDATE);
        assertEquals("pen", update.getString(0));
        assertEquals(-3L, update.getLong(1));
        assertEquals(true, update.getBoolean(2));
        assertEquals(1.0, update.getDouble(3));
        assertArrayEquals(new BigDecimal[] {new BigDecimal(1700000000000L), new BigDecimal(5)},
                          pair(row, TS));
        assertNull(row.get(RESET));
        assertNull(row.get(ERASE));
        assertNull(row.get(RESOLVED));
        assertNull(row.get(CORRUPT));
        assertEquals(9, row.size());
    }

    @Test
    void aColumnNoFieldNamesIsNull() {
        Row update = read("{\"update\":{\"x\":2.5},\"key\":[1],\"ts\":[1,1]}").getStruct(UPDATE);
        assertNull(update.get(0));
        assertEquals(2.5, update.getDouble(3));
    }

    @Test
    void anEraseIsAnEmptyObjectOnly() {
        Row row = read("{\"erase\":{},\"key\":[7],\"ts\":[2,0]}");
        Row erase = row.getStruct(ERASE);
        assertEquals(4, erase.size());
        for (int i = 0; i < 4; i++) assertNull(erase.get(i));
        assertDeferred("{\"erase\":{\"name\":\"a\"},\"key\":[7],\"ts\":[2,0]}");
        assertDeferred("{\"erase\":null,\"key\":[7],\"ts\":[2,0]}");
    }

    @Test
    void aResetAndImagesMayHoldNullsAnUpdateNot() {
        Row row = read("{\"reset\":{\"name\":null,\"n\":1},\"newImage\":{\"name\":\"a\"},"
                       + "\"oldImage\":null,\"key\":[1],\"ts\":[3,0]}");
        assertNull(row.getStruct(RESET).get(0));
        assertEquals(1L, row.getStruct(RESET).getLong(1));
        assertEquals("a", row.getStruct(NEW_IMAGE).getString(0));
        assertNull(row.get(OLD_IMAGE));
        assertDeferred("{\"update\":{\"name\":null},\"key\":[1],\"ts\":[3,0]}");
    }

    @Test
    void aResolvedStandsAlone() {
        Row row = read("{\"resolved\":[1700000000000,18446744073709551615]}");
        assertArrayEquals(new BigDecimal[] {new BigDecimal(1700000000000L),
                                            new BigDecimal("18446744073709551615")},
                          pair(row, RESOLVED));
        assertNull(row.get(KEY));
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
        assertDeferred("{\"update\":{\"ok\":1},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"x\":1e999},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"x\":\"NaN\"},\"key\":[1],\"ts\":[1,0]}");
    }

    @Test
    void namesTheExpressionDoesNotAllowAreLeft() {
        assertDeferred("{\"update\":{\"id\":1},\"key\":[1],\"ts\":[1,0]}");  // a key column
        assertDeferred("{\"update\":{\"other\":1},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"upsert\":{},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{}");
        assertDeferred("{\"update\":{\"name\":\"a\",\"name\":\"b\"},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"key\":[1],\"key\":[1],\"erase\":{}}");
    }

    @Test
    void escapesMarksAndMalformedLinesAreLeft() {
        assertDeferred("{\"update\":{\"name\":\"a\\\"b\"},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"name\":\"\\u0041\"},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("\ufeff{\"erase\":{},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"update\":{\"name\":\"\ufffd\"},\"key\":[1],\"ts\":[1,0]}");
        assertDeferred("{\"erase\":{},\"key\":[1],\"ts\":[1,0]} x");
        assertDeferred("{\"erase\":{},\"key\":[1]");
        assertDeferred("[1]");
        assertNull(new YdbLine().call(null, TABLE));
        assertNull(new YdbLine().call("{\"erase\":{},\"key\":[1],\"ts\":[1,0]}", null));
    }

    @Test
    void theTableIsReadOnceAndItsKeysInKeyOrder() throws IOException {
        String spec = "[[\"b\",\"bigint\",\"int\",1,null,null],[\"v\",\"string\",\"string\",-1,"
            + "null,null],[\"a\",\"bigint\",\"int\",0,null,null]]";
        YdbLine.Table table = new YdbLine.Table(spec);
        assertEquals(2, table.keys.size());
        assertArrayEquals(new int[] {1, -1, 0}, table.order);
        assertEquals(table, YdbLine.Table.of(spec, table));
        Row row = new YdbLine().call("{\"erase\":{},\"key\":[10,20],\"ts\":[1,0]}", spec);
        assertArrayEquals(new Object[] {10L, 20L}, key(row));
        assertThrows(IOException.class,
                     () -> new YdbLine.Table("[[\"a\",\"bigint\",\"int\",1,null,null]]"));
        assertThrows(IOException.class,
                     () -> new YdbLine.Table("[[\"a\",\"int\",\"int\",0,null,null]]"));
    }

    @Test
    void valuesReadsATasksLineAsCallDoes() throws IOException {
        YdbLine.Table table = new YdbLine.Table(TABLE);
        String ascii = "{\"update\":{\"name\":\"pen\"},\"key\":[1],\"ts\":[4,0]}";
        String text = "{\"update\":{\"name\":\"päper\"},\"key\":[1],\"ts\":[4,0]}";
        Object[] fromAscii = YdbLine.values(UTF8String.fromString(ascii), table);
        assertEquals("pen", ((Object[]) fromAscii[UPDATE])[0]);
        assertEquals("päper", ((Object[]) YdbLine.values(UTF8String.fromString(text), table)
                               [UPDATE])[0]);
        assertNull(YdbLine.values(UTF8String.fromString(ascii.replace("pen", "p\\\"n")), table));
        assertNull(YdbLine.values(UTF8String.fromString(text.replace("ä", "\ufffd")), table));
    }
}
