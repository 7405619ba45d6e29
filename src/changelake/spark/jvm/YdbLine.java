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
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One YDB changefeed JSON line read in one streaming pass into the struct the typed parse's
 * `from_json` gives it (`ydb._typed_items`: key, update, reset, erase, newImage, oldImage, ts,
 * resolved, _corrupt), for a line the typed parse's regular expression (`ydb._simple`) holds
 * for; null ("defer") for every other line, which the caller reads as before: the expression
 * decides whether it is simple, and `from_json` reads it.
 *
 * Why: the expression and `from_json` (a char reader made for every line) were most of a YDB
 * batch's parse (benchmarks/README.md).
 *
 * The promise: for a line this returns a row for, the expression holds and `from_json` gives
 * the same row (`tests/spark/test_spark_changefeed_ydb.py`,
 * `test_the_java_line_reader_reads_as_the_typed_parse`, compares them). It keeps it by reading
 * only what is plainly simple, and deferring the rest:
 * <ul>
 * <li>a line with a backslash, a byte-order mark or a replacement character anywhere (so every
 * name and string is spelled as its text, as the expression spells names; an escape the
 * expression refuses needs the text Jackson does not keep), or that Jackson refuses, or with a
 * name twice in one object;</li>
 * <li>anything the expression does not allow: a member other than key, update, reset, erase,
 * newImage, oldImage and ts, or resolved with anything else, or no member; a key that is not
 * an array of the key columns' kinds, one each; an object naming a key column or an unknown
 * one; a null in update or the key; an erase other than `{}`; a ts or resolved other than
 * two non-negative integers;</li>
 * <li>a value of another JSON kind than its column's (Bool true or false, Uint64 a
 * non-negative integer written without a minus, the other integers an integer, Float and
 * Double a number, Utf8 and Uuid a string), or one beyond what `from_json` reads it as
 * (64 bits for the integers, 20 digits for a Uint64 or a ts, a finite double), where
 * `from_json` marks the line corrupt or reads an infinity;</li>
 * <li>a table whose key columns are of more than one Spark type (the caller registers
 * nothing then).</li>
 * </ul>
 * The caller holds the line to the length bound before calling (null is deferred).
 *
 * The table comes as the second argument (`Table`, read once and kept); the struct the caller
 * registers this with must be `ydb._typed_items`' `from_json` schema. `YdbLines` reads the
 * lines the same way (`values`) in its own pass over a task's lines.
 */
public final class YdbLine implements UDF2<String, String, Row> {
    private static final long serialVersionUID = 1L;

    /** Names twice in one object are refused (`UniqueKeys`; no object nests in another). */
    private static final JsonFactory READ = new JsonFactory();
    /** The integers `from_json` reads into a decimal(20,0): at most 20 digits. */
    private static final BigInteger GREATEST = BigInteger.TEN.pow(20).subtract(BigInteger.ONE);
    private static final BigInteger LEAST = GREATEST.negate();

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
     * The table, as `ydb.java_line_reader` writes it: a JSON array of `[name, spark type, JSON
     * kind, key index (-1: not a key), low, high]` entries in the table's column order, low
     * and high null but for a YDB integer type narrower than a long. Kept: its key columns in
     * key order, its other columns in table order, and where each column of the table is.
     */
    static final class Table {
        final String text;
        final List<Column> keys = new ArrayList<>();
        final Map<String, Integer> place = new HashMap<>();  // non-key name -> index
        final List<Column> others = new ArrayList<>();
        /** Per table column in order: its key index, or -1 - its index among the others. */
        final int[] order;

        Table(String text) throws IOException {
            this.text = text;
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

        /** The table `text` names: `last` if it is that one, else read. */
        static Table of(String text, Table last) throws IOException {
            return last != null && last.text.equals(text) ? last : new Table(text);
        }
    }

    /** Thrown where the line is left to the expression and `from_json`. */
    private static final class Defer extends Exception {
        private static final long serialVersionUID = 1L;
        Defer() { super(null, null, false, false); }
    }
    private static final Defer DEFER = new Defer();

    /** The last table read (one call site per task, in practice). */
    private transient Table table;

    @Override
    public Row call(String line, String spec) {
        if (line == null || spec == null || !plain(line)) return null;
        try {
            Table t = Table.of(spec, table);
            table = t;
            Object[] v;
            try (JsonParser p = READ.createParser(line)) {
                v = read(p, t);
            }
            for (int i = 1; i <= 5; i++) {  // the bodies and images
                if (v[i] != null) v[i] = RowFactory.create((Object[]) v[i]);
            }
            return RowFactory.create(v);
        } catch (Defer | IOException | RuntimeException e) {
            return null;
        }
    }

    /**
     * `call`'s reading of a line (valid UTF-8, held to the bound) as values: the key's
     * (`Object[]`, key order), update's, reset's, erase's, newImage's and oldImage's (each an
     * `Object[]` of the non-key columns, in table order; null where the member is absent or
     * null), ts and resolved (`BigDecimal[2]`), and null (`_corrupt`); or null where the line
     * is left. Values are Java's: String, Long, Double, Boolean, BigDecimal.
     */
    static Object[] values(UTF8String value, Table t) {
        try {
            JsonParser p;
            if (DebeziumLines.ascii(value)) {
                byte[] bytes = value.getBytes();
                for (byte b : bytes) if (b == '\\') return null;
                p = READ.createParser(bytes);
            } else {
                String line = value.toString();
                if (!plain(line)) return null;
                p = READ.createParser(line);
            }
            try (p) {
                return read(p, t);
            }
        } catch (Defer | IOException | RuntimeException e) {
            return null;
        }
    }

    /** No backslash, byte-order mark or replacement character anywhere (see the class
     * comment: such a line is left). */
    private static boolean plain(String line) {
        for (int i = 0, n = line.length(); i < n; i++) {
            char c = line.charAt(i);
            if (c == '\\' || c == '\ufeff' || c == '\ufffd') return false;
        }
        return true;
    }

    private static Object[] read(JsonParser p, Table t) throws IOException, Defer {
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
                case "key": key = key(p, v, t); break;
                case "update": update = image(p, v, t, false); break;
                case "reset": reset = image(p, v, t, true); break;
                case "erase":
                    if (v != JsonToken.START_OBJECT || p.nextToken() != JsonToken.END_OBJECT) {
                        throw DEFER;
                    }
                    erase = new Object[t.others.size()];
                    break;
                case "newImage":
                    newImage = v == JsonToken.VALUE_NULL ? null : image(p, v, t, true);
                    break;
                case "oldImage":
                    oldImage = v == JsonToken.VALUE_NULL ? null : image(p, v, t, true);
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

    private static Object key(JsonParser p, JsonToken v, Table t) throws IOException, Defer {
        if (v != JsonToken.START_ARRAY) throw DEFER;
        Object[] values = new Object[t.keys.size()];
        for (int i = 0; i < values.length; i++) {
            JsonToken e = p.nextToken();
            if (e == JsonToken.VALUE_NULL) throw DEFER;
            values[i] = value(p, e, t.keys.get(i));
        }
        if (p.nextToken() != JsonToken.END_ARRAY) throw DEFER;
        return values;
    }

    private static Object[] image(JsonParser p, JsonToken v, Table t, boolean nulls)
            throws IOException, Defer {
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
                if (!nulls) throw DEFER;
                continue;
            }
            values[at] = value(p, e, t.others.get(at));
        }
        return values;
    }

    private static Object pair(JsonParser p, JsonToken v) throws IOException, Defer {
        if (v != JsonToken.START_ARRAY) throw DEFER;
        Object[] values = new BigDecimal[2];
        for (int i = 0; i < 2; i++) {
            values[i] = value(p, p.nextToken(), PAIR);
        }
        if (p.nextToken() != JsonToken.END_ARRAY) throw DEFER;
        return values;
    }

    /** A value of its column's JSON kind, as `from_json` reads it into its Spark type. */
    private static Object value(JsonParser p, JsonToken e, Column column)
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
                ofKind = e == JsonToken.VALUE_NUMBER_INT || e == JsonToken.VALUE_NUMBER_FLOAT;
                break;
            default: ofKind = false;
        }
        Object value = ofKind ? column.type.read(p, e, LEAST, GREATEST) : null;
        if (value == null) throw DEFER;
        return value;
    }
}
