package changelake.jvm;

import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;

/**
 * The Spark types the Java readers (`DebeziumImage`, `YdbLine`) read JSON values into, each
 * named as Spark SQL names it, and how `from_json` reads a value of the type's own JSON kind:
 * a string a string, a bigint an integer within 64 bits, a double any number within a double,
 * a boolean true or false, a decimal(20,0) an integer within the bounds the reader keeps to.
 * `read` gives null for every other value: the reader then leaves it (`DebeziumImage` to
 * `from_json`, `YdbLine` the line to the Python path).
 */
enum SparkType {
    STRING, BIGINT, DOUBLE, BOOLEAN, DECIMAL;

    static SparkType named(String name) throws IOException {
        switch (name) {
            case "string": return STRING;
            case "bigint": return BIGINT;
            case "double": return DOUBLE;
            case "boolean": return BOOLEAN;
            case "decimal(20,0)": return DECIMAL;
            default: throw new IOException("no Spark type " + name);
        }
    }

    /** The value at `v` as `from_json` reads it into this type; null where it is not one
     * of this type's own kind (for a decimal, an integer in `[least, greatest]`). */
    Object read(JsonParser p, JsonToken v, BigInteger least, BigInteger greatest)
            throws IOException {
        switch (this) {
            case STRING:
                return v == JsonToken.VALUE_STRING ? p.getText() : null;
            case BIGINT:
                if (v != JsonToken.VALUE_NUMBER_INT) return null;
                JsonParser.NumberType size = p.getNumberType();
                return size == JsonParser.NumberType.INT || size == JsonParser.NumberType.LONG
                    ? (Object) p.getLongValue() : null;
            case DOUBLE:
                if (v != JsonToken.VALUE_NUMBER_INT && v != JsonToken.VALUE_NUMBER_FLOAT) {
                    return null;
                }
                double d = p.getDoubleValue();
                return Double.isInfinite(d) ? null : (Object) d;
            case BOOLEAN:
                return v == JsonToken.VALUE_TRUE ? Boolean.TRUE
                    : v == JsonToken.VALUE_FALSE ? Boolean.FALSE : null;
            case DECIMAL:
                if (v != JsonToken.VALUE_NUMBER_INT) return null;
                BigInteger n = p.getBigIntegerValue();
                return n.compareTo(least) < 0 || n.compareTo(greatest) > 0
                    ? null : new BigDecimal(n);
            default:
                return null;
        }
    }
}
