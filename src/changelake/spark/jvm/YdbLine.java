package changelake.jvm;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;

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
 * the same row (`tests/test_spark_changefeed_ydb_line.py` compares them). It keeps it by
 * reading only what is plainly simple, and deferring the rest:
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
 * The table comes as the second argument, a JSON array of `[name, spark type, JSON kind,
 * key]` entries in the table's column order (read once and kept); the struct the caller
 * registers this with must be `ydb._typed_items`' `from_json` schema.
 */
public final class YdbLine implements UDF2<String, String, Row> {
    private static final long serialVersionUID = 1L;

    /** Names twice in one object are refused (`UniqueKeys`; no object nests in another). */
    private static final JsonFactory READ = new JsonFactory();
    /** The integers `from_json` reads into a decimal(20,0): at most 20 digits. */
    private static final BigInteger GREATEST = BigInteger.TEN.pow(20).subtract(BigInteger.ONE);
    private static final BigInteger LEAST = GREATEST.negate();

    private static final byte BOOL = 0, UINT = 1, INT = 2, NUMBER = 3, STRING = 4;

    /** A column: the JSON kind its YDB type is written as, and its Spark type. */
    private static final class Column {
        final byte kind;
        final SparkType type;

        Column(byte kind, SparkType type) {
            this.kind = kind;
            this.type = type;
        }
    }

    /** A ts or resolved member's two values. */
    private static final Column PAIR = new Column(UINT, SparkType.DECIMAL);

    /** The table: its key columns in key order and its other columns in table order. */
    private static final class Table {
        final String text;
        final List<Column> keys = new ArrayList<>();
        final Map<String, Integer> place = new HashMap<>();  // non-key name -> index
        final List<Column> others = new ArrayList<>();

        Table(String text) throws IOException {
            this.text = text;
            try (JsonParser p = READ.createParser(text)) {
                if (p.nextToken() != JsonToken.START_ARRAY) throw new IOException("table");
                while (p.nextToken() == JsonToken.START_ARRAY) {
                    p.nextToken();
                    String name = p.getText();
                    p.nextToken();
                    SparkType type = SparkType.named(p.getText());
                    p.nextToken();
                    byte kind = kind(p.getText());
                    boolean key = p.nextToken() == JsonToken.VALUE_TRUE;
                    if (p.nextToken() != JsonToken.END_ARRAY) throw new IOException("table");
                    if (key) {
                        keys.add(new Column(kind, type));
                    } else {
                        place.put(name, others.size());
                        others.add(new Column(kind, type));
                    }
                }
            }
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
        if (line == null || spec == null) return null;
        for (int i = 0, n = line.length(); i < n; i++) {
            char c = line.charAt(i);
            if (c == '\\' || c == '\ufeff' || c == '\ufffd') return null;
        }
        try {
            Table t = table;
            if (t == null || !t.text.equals(spec)) {
                t = new Table(spec);
                table = t;
            }
            return read(line, t);
        } catch (Defer | IOException | RuntimeException e) {
            return null;
        }
    }

    private static Row read(String line, Table t) throws IOException, Defer {
        Object key = null, update = null, reset = null, erase = null, newImage = null,
            oldImage = null, ts = null, resolved = null;
        int members = 0;
        try (JsonParser p = READ.createParser(line)) {
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
                        erase = RowFactory.create(new Object[t.others.size()]);
                        break;
                    case "newImage": newImage = v == JsonToken.VALUE_NULL ? null : image(p, v, t, true); break;
                    case "oldImage": oldImage = v == JsonToken.VALUE_NULL ? null : image(p, v, t, true); break;
                    case "ts": ts = pair(p, v); break;
                    case "resolved": resolved = pair(p, v); break;
                    default: throw DEFER;
                }
            }
            if (token != JsonToken.END_OBJECT || p.nextToken() != null) throw DEFER;
        }
        if (members == 0 || (resolved != null && members != 1)) throw DEFER;
        return RowFactory.create(key, update, reset, erase, newImage, oldImage, ts, resolved,
                                 null);
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

    private static Row image(JsonParser p, JsonToken v, Table t, boolean nulls)
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
        return RowFactory.create(values);
    }

    private static Object pair(JsonParser p, JsonToken v) throws IOException, Defer {
        if (v != JsonToken.START_ARRAY) throw DEFER;
        Object[] values = new Object[2];
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
            case UINT: ofKind = e == JsonToken.VALUE_NUMBER_INT && !p.getText().startsWith("-");
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
