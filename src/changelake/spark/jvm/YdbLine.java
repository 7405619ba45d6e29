package changelake.jvm;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One YDB changefeed JSON line (`FORMAT = 'JSON'`) read in one streaming pass into its
 * values (`values`), for `YdbLines`, which makes the rows of a batch of them; null ("left")
 * for every line it does not read, which sends the batch to the Python path.
 *
 * The promise: a line it reads is one `formats.ydb.YdbParser` (the specification) accepts,
 * read into the same values, but for what `YdbLines.problems` then leaves
 * (`tests/spark/test_spark_changefeed_ydb_jvm.py` holds every line to a fresh parser's item). It
 * keeps it by reading the records YDB writes and leaving the rest:
 * <ul>
 * <li>read: one JSON object of members key (an array of the key columns' values, one each),
 * update, reset, newImage, oldImage (objects of non-key columns; the images may be null;
 * a column null in update is set to null, one update does not name is unchanged), erase (an
 * object, whatever it holds, as the parser ignores it), ts (two non-negative integers), in any
 * order; or resolved alone; values of their columns' JSON kinds (Bool true or false, Uint64 a
 * non-negative integer written without a minus, the other integers an integer, Float and
 * Double a number or one of the strings "nan", "inf", "-inf", Utf8 and Uuid a string); JSON's
 * escapes, as orjson reads them;</li>
 * <li>left as the parser refuses them: a line Jackson refuses or with something after the
 * object; a member, name or value of another kind or shape; a string with an unpaired
 * surrogate (an escape orjson refuses); a number beyond a double (orjson reads an integer
 * beyond 64 bits as a float: a Float or Double column takes it), or beyond its column's
 * type;</li>
 * <li>left though the parser may accept them (rare or not of YDB's writing: the Python path
 * reads them): DEBEZIUM_JSON (payload, value); a null in the key (the conversion refuses it);
 * a Uint64 written `-0`; a name twice in one object; a byte-order mark anywhere; an update or
 * reset beside a newImage, or beside an oldImage alone, whose columns are not of the table
 * or not of their kinds (the parser reads neither then); and
 * what `YdbLines.problems` leaves: an OLD_IMAGE record, a barrier beyond a long.</li>
 * </ul>
 * The caller holds the line to UTF-8 and to the length bound before calling.
 *
 * The table comes as `Table` (`ydb.java_table`'s text, read once a task).
 */
public final class YdbLine {
    private YdbLine() {}

    /** Names twice in one object are refused (`UniqueKeys`; no object nests in another). */
    private static final JsonFactory READ = new JsonFactory();
    /** The integers read into a decimal(20,0): at most 20 digits (`YdbLines.problems` holds
     * them to a Uint64's range). */
    private static final BigInteger GREATEST = BigInteger.TEN.pow(20).subtract(BigInteger.ONE);
    private static final BigInteger LEAST = GREATEST.negate();

    /** A column update sets to null (one it does not name is null in its values: unchanged). */
    static final Object NULL = new Object() {
        @Override
        public String toString() {
            return "NULL";
        }
    };

    private static final byte BOOL = 0, UINT = 1, INT = 2, NUMBER = 3, STRING = 4;

    /** A column: the JSON kind its YDB type is written as, its Spark type, and the range of
     * its YDB type where that is narrower than its Spark type's (`ranged`: `[low, high]`). */
    static final class Column {
        final byte kind;
        final SparkType type;
        final boolean ranged;
        final long low, high;

        Column(byte kind, SparkType type) {
            this(kind, type, false, 0, 0);
        }

        Column(byte kind, SparkType type, boolean ranged, long low, long high) {
            this.kind = kind;
            this.type = type;
            this.ranged = ranged;
            this.low = low;
            this.high = high;
        }
    }

    /** A ts or resolved member's two values. */
    private static final Column PAIR = new Column(UINT, SparkType.DECIMAL);

    /**
     * The table, as `ydb.java_table` writes it: a JSON array of `[name, spark type, JSON
     * kind, key index (-1: not a key), low, high]` entries in the table's column order, low
     * and high null but for a YDB integer type narrower than a long. Kept: its key columns in
     * key order, its other columns in table order, and where each column of the table is.
     */
    static final class Table {
        final List<Column> keys = new ArrayList<>();
        final Map<String, Integer> place = new HashMap<>();  // non-key name -> index
        final List<Column> others = new ArrayList<>();
        /** Per table column in order: its key index, or -1 - its index among the others. */
        final int[] order;

        Table(String text) throws IOException {
            Map<Integer, Column> byKey = new HashMap<>();
            List<Integer> places = new ArrayList<>();
            try (JsonParser p = READ.createParser(text)) {
                if (p.nextToken() != JsonToken.START_ARRAY) throw new IOException("table");
                while (p.nextToken() == JsonToken.START_ARRAY) {
                    p.nextToken();
                    String name = p.getText();
                    p.nextToken();
                    SparkType type = SparkType.named(p.getText());
                    p.nextToken();
                    byte kind = kind(p.getText());
                    p.nextToken();
                    int key = p.getIntValue();
                    boolean ranged = p.nextToken() != JsonToken.VALUE_NULL;
                    long low = ranged ? p.getLongValue() : 0;
                    p.nextToken();
                    long high = ranged ? p.getLongValue() : 0;
                    if (p.nextToken() != JsonToken.END_ARRAY) throw new IOException("table");
                    Column column = new Column(kind, type, ranged, low, high);
                    if (key >= 0) {
                        byKey.put(key, column);
                        places.add(key);
                    } else {
                        places.add(-1 - others.size());
                        place.put(name, others.size());
                        others.add(column);
                    }
                }
            }
            for (int i = 0; i < byKey.size(); i++) {
                Column key = byKey.get(i);
                if (key == null) throw new IOException("table: key " + i);
                keys.add(key);
            }
            order = places.stream().mapToInt(Integer::intValue).toArray();
        }

        private static byte kind(String name) throws IOException {
            switch (name) {
                case "bool": return BOOL;
                case "uint": return UINT;
                case "int": return INT;
                case "number": return NUMBER;
                case "string": return STRING;
                default: throw new IOException("no kind " + name);
            }
        }

    }

    /** Thrown where the line is left. */
    private static final class Defer extends Exception {
        private static final long serialVersionUID = 1L;
        Defer() { super(null, null, false, false); }
    }
    private static final Defer DEFER = new Defer();

    /**
     * A line (valid UTF-8, held to the bound) read as values: the key's (`Object[]`, key
     * order), update's, reset's, erase's, newImage's and oldImage's (each an `Object[]` of the
     * non-key columns, in table order; null where the member is absent or null; in update,
     * `NULL` for a column set to null, null for one it does not name), ts and resolved
     * (`BigDecimal[2]`), and null (a place the rows' layout keeps); or null where the line is
     * left. Values are Java's: String, Long, Double (NaN and the infinities too), Boolean,
     * BigDecimal.
     */
    static Object[] values(UTF8String value, Table t) {
        try {
            JsonParser p;
            boolean escaped = false;
            if (DebeziumLines.ascii(value)) {
                byte[] bytes = value.getBytes();
                for (byte b : bytes) {
                    if (b == '\\') {
                        escaped = true;
                        break;
                    }
                }
                p = READ.createParser(bytes);
            } else {
                String line = value.toString();
                for (int i = 0, n = line.length(); i < n; i++) {
                    char c = line.charAt(i);
                    if (c == '\ufeff') return null;  // a byte-order mark: left
                    if (c == '\\') escaped = true;
                }
                p = READ.createParser(line);
            }
            try (p) {
                return read(p, t, escaped);
            }
        } catch (Defer | IOException | RuntimeException e) {
            return null;
        }
    }

    /** `values` of a line given as text (tests). */
    static Object[] values(String line, Table t) {
        return line == null ? null : values(UTF8String.fromString(line), t);
    }

    /** No unpaired surrogate in `text` (orjson refuses the escape of one; Jackson reads it). */
    static boolean paired(String text) {
        for (int i = 0, n = text.length(); i < n; i++) {
            char c = text.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < n
                    && Character.isLowSurrogate(text.charAt(i + 1))) {
                i++;
            } else if (Character.isSurrogate(c)) {
                return false;
            }
        }
        return true;
    }

    private static Object[] read(JsonParser p, Table t, boolean escaped)
            throws IOException, Defer {
        Object key = null, update = null, reset = null, erase = null, newImage = null,
            oldImage = null, ts = null, resolved = null;
        int members = 0;
        if (p.nextToken() != JsonToken.START_OBJECT) throw DEFER;
        JsonToken token;
        UniqueKeys names = new UniqueKeys();
        while ((token = p.nextToken()) == JsonToken.FIELD_NAME) {
            String name = p.currentName();
            names.add(name);
            JsonToken v = p.nextToken();
            members++;
            switch (name) {
                case "key": key = key(p, v, t, escaped); break;
                case "update": update = image(p, v, t, true, escaped); break;
                case "reset": reset = image(p, v, t, false, escaped); break;
                case "erase":  // its members, whatever they are, mean nothing to the parser
                    if (v != JsonToken.START_OBJECT) throw DEFER;
                    p.skipChildren();
                    erase = new Object[t.others.size()];
                    break;
                case "newImage":
                    newImage = v == JsonToken.VALUE_NULL ? null : image(p, v, t, false, escaped);
                    break;
                case "oldImage":
                    oldImage = v == JsonToken.VALUE_NULL ? null : image(p, v, t, false, escaped);
                    break;
                case "ts": ts = pair(p, v); break;
                case "resolved": resolved = pair(p, v); break;
                default: throw DEFER;
            }
        }
        if (token != JsonToken.END_OBJECT || p.nextToken() != null) throw DEFER;
        if (members == 0 || (resolved != null && members != 1)) throw DEFER;
        return new Object[] {key, update, reset, erase, newImage, oldImage, ts, resolved, null};
    }

    private static Object key(JsonParser p, JsonToken v, Table t, boolean escaped)
            throws IOException, Defer {
        if (v != JsonToken.START_ARRAY) throw DEFER;
        Object[] values = new Object[t.keys.size()];
        for (int i = 0; i < values.length; i++) {
            JsonToken e = p.nextToken();
            if (e == JsonToken.VALUE_NULL) throw DEFER;
            values[i] = value(p, e, t.keys.get(i), escaped);
        }
        if (p.nextToken() != JsonToken.END_ARRAY) throw DEFER;
        return values;
    }

    /** An object of non-key columns; `marked`: a null is `NULL` (update's), else null. */
    private static Object[] image(JsonParser p, JsonToken v, Table t, boolean marked,
                                  boolean escaped) throws IOException, Defer {
        if (v != JsonToken.START_OBJECT) throw DEFER;
        Object[] values = new Object[t.others.size()];
        UniqueKeys names = new UniqueKeys();
        while (p.nextToken() == JsonToken.FIELD_NAME) {
            String name = p.currentName();
            names.add(name);
            Integer at = t.place.get(name);
            if (at == null) throw DEFER;
            JsonToken e = p.nextToken();
            if (e == JsonToken.VALUE_NULL) {
                values[at] = marked ? NULL : null;
                continue;
            }
            values[at] = value(p, e, t.others.get(at), escaped);
        }
        return values;
    }

    private static Object pair(JsonParser p, JsonToken v) throws IOException, Defer {
        if (v != JsonToken.START_ARRAY) throw DEFER;
        Object[] values = new BigDecimal[2];
        for (int i = 0; i < 2; i++) {
            values[i] = value(p, p.nextToken(), PAIR, false);
        }
        if (p.nextToken() != JsonToken.END_ARRAY) throw DEFER;
        return values;
    }

    /** A value of its column's JSON kind, as the parser reads it, in its Spark type. */
    private static Object value(JsonParser p, JsonToken e, Column column, boolean escaped)
            throws IOException, Defer {
        boolean ofKind;
        switch (column.kind) {
            case BOOL: ofKind = e == JsonToken.VALUE_TRUE || e == JsonToken.VALUE_FALSE; break;
            case STRING: ofKind = e == JsonToken.VALUE_STRING; break;
            case UINT:
                // written without a minus (`-0` too): read in Jackson's buffer, not as a
                // String made for each Uint64 (a key and a ts pair on every line)
                ofKind = e == JsonToken.VALUE_NUMBER_INT
                    && p.getTextCharacters()[p.getTextOffset()] != '-';
                break;
            case INT: ofKind = e == JsonToken.VALUE_NUMBER_INT; break;
            case NUMBER:
                if (e == JsonToken.VALUE_STRING) return special(p.getText());
                // an integer beyond 64 bits too: orjson reads it as a float
                ofKind = e == JsonToken.VALUE_NUMBER_INT || e == JsonToken.VALUE_NUMBER_FLOAT;
                break;
            default: ofKind = false;
        }
        Object value = ofKind ? column.type.read(p, e, LEAST, GREATEST) : null;
        if (value == null) throw DEFER;
        if (escaped && value instanceof String text && !paired(text)) throw DEFER;
        return value;
    }

    /** A Float or Double written as a string: the three the parser reads. */
    private static Double special(String text) throws Defer {
        switch (text) {
            case "nan": return Double.NaN;
            case "inf": return Double.POSITIVE_INFINITY;
            case "-inf": return Double.NEGATIVE_INFINITY;
            default: throw DEFER;
        }
    }
}
