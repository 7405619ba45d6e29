package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import org.apache.spark.sql.Row;
import org.junit.jupiter.api.Test;

/** `DebeziumImage`: an image read against its columns' raw types, or left (null). */
class DebeziumImageTest {
    static final String COLUMNS = "[[\"id\",\"bigint\"],[\"name\",\"string\"],"
        + "[\"price\",\"double\"],[\"ok\",\"boolean\"],[\"u\",\"decimal(20,0)\"]]";

    static Row read(String image) {
        return new DebeziumImage().call(image.getBytes(StandardCharsets.UTF_8), COLUMNS);
    }

    @Test
    void anImageIsReadInTheColumnsOrder() {
        Row row = read("{\"u\":18446744073709551615,\"ok\":false,\"price\":2,\"name\":\"pen\","
                       + "\"id\":-4}");
        assertEquals(-4L, row.getLong(0));
        assertEquals("pen", row.getString(1));
        assertEquals(2.0, row.getDouble(2));
        assertEquals(false, row.getBoolean(3));
        assertEquals(new BigDecimal("18446744073709551615"), row.get(4));
    }

    @Test
    void aFieldNoColumnNamesIsSkippedAndAMissingOrNullColumnIsNull() {
        Row row = read("{\"extra\":{\"deep\":[1,{\"x\":null}]},\"id\":1,\"name\":null}");
        assertEquals(1L, row.getLong(0));
        for (int i = 1; i < 5; i++) assertNull(row.get(i));
    }

    @Test
    void aValueOfAnotherKindIsLeft() {
        assertNull(read("{\"id\":\"1\"}"));
        assertNull(read("{\"name\":1}"));
        assertNull(read("{\"name\":{\"a\":1}}"));
        assertNull(read("{\"ok\":0}"));
        assertNull(read("{\"price\":1e400}"));
        assertNull(read("{\"u\":18446744073709551616}"));
        assertNull(read("{\"u\":-9223372036854775809}"));
    }

    @Test
    void duplicatesMalformedImagesAndUnknownTypesAreLeft() {
        assertNull(read("{\"id\":1,\"id\":1}"));
        assertNull(read("{\"extra\":{\"a\":1,\"a\":2}}"));
        assertNull(read("{\"id\":1} {}"));
        assertNull(read("{\"id\":1"));
        assertNull(read(" {\"id\":1}"));
        assertNull(new DebeziumImage().call("{\"id\":1}".getBytes(StandardCharsets.UTF_8),
                                            "[[\"id\",\"int\"]]"));
        assertNull(new DebeziumImage().call(null, COLUMNS));
    }
}
