package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import org.junit.jupiter.api.Test;

/** `SparkType`: each type named as Spark SQL names it, and read from its own JSON kind only. */
class SparkTypeTest {
    static final BigInteger LEAST = BigInteger.valueOf(Long.MIN_VALUE);
    static final BigInteger GREATEST = BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE);

    static Object read(SparkType type, String json) throws IOException {
        try (JsonParser p = new JsonFactory().createParser(json)) {
            return type.read(p, p.nextToken(), LEAST, GREATEST);
        }
    }

    @Test
    void typesAreNamedAsSparkSqlNamesThem() throws IOException {
        assertEquals(SparkType.STRING, SparkType.named("string"));
        assertEquals(SparkType.BIGINT, SparkType.named("bigint"));
        assertEquals(SparkType.DOUBLE, SparkType.named("double"));
        assertEquals(SparkType.BOOLEAN, SparkType.named("boolean"));
        assertEquals(SparkType.DECIMAL, SparkType.named("decimal(20,0)"));
        assertThrows(IOException.class, () -> SparkType.named("int"));
        assertThrows(IOException.class, () -> SparkType.named("decimal(10,2)"));
    }

    @Test
    void aStringIsReadFromAStringOnly() throws IOException {
        assertEquals("a\"b", read(SparkType.STRING, "\"a\\\"b\""));
        assertNull(read(SparkType.STRING, "12"));
        assertNull(read(SparkType.STRING, "{}"));
        assertNull(read(SparkType.STRING, "true"));
    }

    @Test
    void aBigintIsAnIntegerWithin64Bits() throws IOException {
        assertEquals(9223372036854775807L, read(SparkType.BIGINT, "9223372036854775807"));
        assertEquals(-9223372036854775808L, read(SparkType.BIGINT, "-9223372036854775808"));
        assertEquals(7L, read(SparkType.BIGINT, "7"));
        assertNull(read(SparkType.BIGINT, "9223372036854775808"));
        assertNull(read(SparkType.BIGINT, "7.0"));
        assertNull(read(SparkType.BIGINT, "\"7\""));
    }

    @Test
    void aDoubleIsAnyFiniteNumber() throws IOException {
        assertEquals(3.0, read(SparkType.DOUBLE, "3"));
        assertEquals(-2.5e10, read(SparkType.DOUBLE, "-2.5e10"));
        assertNull(read(SparkType.DOUBLE, "1e400"));
        assertNull(read(SparkType.DOUBLE, "\"1.5\""));
    }

    @Test
    void aBooleanIsTrueOrFalse() throws IOException {
        assertEquals(Boolean.TRUE, read(SparkType.BOOLEAN, "true"));
        assertEquals(Boolean.FALSE, read(SparkType.BOOLEAN, "false"));
        assertNull(read(SparkType.BOOLEAN, "1"));
        assertNull(read(SparkType.BOOLEAN, "\"true\""));
    }

    @Test
    void aDecimalIsAnIntegerWithinTheReadersBounds() throws IOException {
        assertEquals(new BigDecimal("18446744073709551615"),
                     read(SparkType.DECIMAL, "18446744073709551615"));
        assertEquals(new BigDecimal("-9223372036854775808"),
                     read(SparkType.DECIMAL, "-9223372036854775808"));
        assertNull(read(SparkType.DECIMAL, "18446744073709551616"));
        assertNull(read(SparkType.DECIMAL, "-9223372036854775809"));
        assertNull(read(SparkType.DECIMAL, "1.0"));
    }
}
