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
 * One row image (a Debezium `after` or `before` object, as the line reader kept its text) read
 * against the columns' raw types, into the struct `from_json(image, columns, FAILFAST)` gives
 * (`keyed._parsed`); null ("defer") for every image it does not read, which the caller then
 * reads with `from_json` and the checks that go with it (`keyed._image`).
 *
 * Why: `from_json` makes a `java.io.InputStreamReader`, with its 8 KiB buffer, for every text
 * it parses, and reads it through Jackson's char parser; with the refusal checks' text searches
 * (`keyed._first_char`) that was a sizeable share of a Debezium ingest's task time (a Flight
 * Recorder profile: benchmarks/README.md, "The floor of a keyed conversion").
 *
 * The promise: for an image this returns a row for, `from_json` gives exactly the same row
 * and refuses nothing (`tests/spark/test_spark_changefeed_image.py` compares the two). It keeps it
 * by reading only what both read the one way, and deferring the rest:
 * <ul>
 * <li>an image that is not one JSON object alone in its text, that Jackson refuses, or with a
 * duplicate key (`from_json` keeps the last value);</li>
 * <li>a column's value of any JSON kind but its own: a string column takes a string, a bigint
 * an integer within 64 bits, a double any number but one beyond a double, a boolean true or
 * false, a decimal(20,0) an integer the encoder reads as one (from -2^63 to 2^64-1; outside,
 * orjson reads a float: `keyed._refused`). `from_json` reads other kinds its own ways (a
 * number or an object into a string column as its text), or fails, and `keyed._refused`
 * then refuses some of them: that stays theirs;</li>
 * <li>a column type other than these five.</li>
 * </ul>
 * A field no column names is skipped, whatever it holds; a column no field names, or whose
 * value is null, is null.
 *
 * The columns come as the second argument, a JSON array of `[name, type]` pairs (the same for
 * every row of a call site, so read once and kept); the struct the caller registers this with
 * must have the same fields in the same order.
 */
public final class DebeziumImage implements UDF2<byte[], String, Row> {
    private static final long serialVersionUID = 1L;

    /** Duplicate keys are refused (`UniqueKeys`: the image and every object within it). */
    private static final JsonFactory READ = new JsonFactory();
    /** The integers the encoder reads for a decimal(20,0) (outside, orjson reads a float). */
    private static final BigInteger LEAST = BigInteger.valueOf(Long.MIN_VALUE);
    private static final BigInteger GREATEST = BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE);

    /** The columns of one call site: each name's place and raw type. */
    private static final class Columns {
        final String text;
        final Map<String, Integer> place = new HashMap<>();
        final SparkType[] types;

        Columns(String text) throws IOException {
            this.text = text;
            List<SparkType> kinds = new ArrayList<>();
            try (JsonParser p = READ.createParser(text)) {
                if (p.nextToken() != JsonToken.START_ARRAY) throw new IOException("columns");
                while (p.nextToken() == JsonToken.START_ARRAY) {
                    p.nextToken();
                    String name = p.getText();
                    p.nextToken();
                    kinds.add(SparkType.named(p.getText()));
                    if (p.nextToken() != JsonToken.END_ARRAY) throw new IOException("columns");
                    place.put(name, place.size());
                }
            }
            types = kinds.toArray(new SparkType[0]);
        }
    }

    /** The last columns read (one call site per task, in practice). */
    private transient Columns columns;

    /** The image's UTF-8 bytes (the caller casts its text to binary: `JsonBytes`). */
    @Override
    public Row call(byte[] image, String spec) {
        if (image == null || spec == null || !JsonBytes.opensObject(image)) return null;
        try {
            Columns c = columns;
            if (c == null || !c.text.equals(spec)) {
                c = new Columns(spec);
                columns = c;
            }
            return read(image, c);
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    private static Row read(byte[] image, Columns c) throws IOException {
        Object[] values = new Object[c.types.length];
        try (JsonParser p = READ.createParser(image)) {
            p.nextToken();
            JsonToken t;
            UniqueKeys keys = new UniqueKeys();
            while ((t = p.nextToken()) == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                keys.add(name);
                Integer at = c.place.get(name);
                JsonToken v = p.nextToken();
                if (at == null) {
                    UniqueKeys.skip(p, v);
                    continue;
                }
                if (v == JsonToken.VALUE_NULL) continue;
                Object value = c.types[at].read(p, v, LEAST, GREATEST);
                if (value == null) return null;
                values[at] = value;
            }
            if (t != JsonToken.END_OBJECT || p.nextToken() != null) return null;
        }
        return RowFactory.create(values);
    }
}
