package changelake.jvm;

import com.fasterxml.jackson.core.JsonEncoding;
import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.io.JsonStringEncoder;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * One Debezium line read in one streaming pass, into the item columns of the Spark path's
 * parse (`parse.JVM_LINE_TYPE`: kind, op, time, transaction, position, table, images), for a
 * line in the shape a connector writes that `formats.debezium.DebeziumParser` accepts; null
 * ("defer") for every other line, whose batch the caller hands to the Python path.
 *
 * The promise: for a line this returns a row for, `DebeziumParser` (the specification) gives
 * the same item (`tests/spark/test_spark_changefeed_jvm.py` compares the two on samples, generated
 * histories, each rule's edges and random mutations). It keeps that promise by deferring
 * rather than deciding wherever a reading is subtle (the rules below were first written
 * against Spark's JSON functions, which read these lines before):
 * <ul>
 * <li>a line that is not one JSON object opening at its first byte and alone on the line, or
 * that Jackson refuses, or with a duplicate key in any object (Spark and orjson each keep
 * one, maybe not the same: `UniqueKeys`);</li>
 * <li>a field of another JSON kind than its type, where `from_json` either fails the job
 * (FAILFAST) or takes any value as a string's text; the one exception is a boolean source
 * `snapshot`, which it reads as `true`/`false`;</li>
 * <li>a line that opens with anything but `{` other than the line `null` (a tombstone), a
 * body with none of op, before, after, status and source that is neither a schema change nor
 * a heartbeat, a source `snapshot` not among the flags Debezium writes, a `gtid` unlike a
 * GTID;</li>
 * <li>a truncate (op t) with a before or after image;</li>
 * <li>every line the parser refuses or the Spark path does not convert (an unknown op, a logical message, YDB's Debezium
 * JSON, a negative or missing position, a sequence not in Debezium's shape, a bad binlog
 * position or transaction id, a delete with an after image, a change without one, a
 * boundary with a bad status, id, count or collection entry), a change that also has a
 * `status`, a boundary with a source, and a binlog number (in the file name or the
 * transaction id) of more than 18 digits.</li>
 * </ul>
 * An object or array read into a string field (the images, the envelope's `schema`) is
 * re-written as Jackson's `copyCurrentStructure` re-writes it (`UniqueKeys.copy`, which also
 * holds it to the duplicate rule), as Spark's JSON reader does, so the texts agree byte for
 * byte (floats through a double, white space dropped). The regular expressions are used as
 * Spark used them (`find`), but for the PostgreSQL `sequence`, which every change has and
 * `sequence` matches by hand; the text searches for a key followed by a string are made by
 * `keyThenString`.
 */
public final class DebeziumLine implements UDF1<byte[], Row> {
    private static final long serialVersionUID = 1L;

    /** Duplicate keys are refused (`UniqueKeys`: every object the reading walks). */
    private static final JsonFactory READ = new JsonFactory();
    private static final JsonFactory WRITE = new JsonFactory();
    private static final JsonStringEncoder QUOTE = JsonStringEncoder.getInstance();
    /** `parse._SNAPSHOT_TRUE`, and with them `_SNAPSHOT_KNOWN`. */
    private static final Set<String> SNAPSHOT_TRUE = Set.of(
        "true", "first", "last", "first_in_data_collection", "last_in_data_collection");
    private static final Set<String> SNAPSHOT_KNOWN = Set.of(
        "true", "first", "last", "first_in_data_collection", "last_in_data_collection",
        "false", "incremental");
    private static final Set<String> HEARTBEAT = Set.of("ts_ms", "ts_us", "ts_ns");
    // The parser's rules as regular expressions (java.util.regex, `find`). The binlog's end at
    // `\z`, the text's end, as the parser reads it (`$` also matches before a last newline).
    private static final Pattern PG_TX = Pattern.compile("^\\d+:\\d+$");
    private static final Pattern BINLOG = Pattern.compile("\\.([0-9]+)\\z");
    private static final Pattern TX_FILE = Pattern.compile("(?:^|,)file=[^,]*\\.([0-9]+)(?:,|\\z)");
    private static final Pattern TX_POS = Pattern.compile("(?:^|,)pos=([0-9]+)(?:,|\\z)");

    /** Thrown where the line is left to the Python path. */
    private static final class Defer extends Exception {
        private static final long serialVersionUID = 1L;
        Defer() { super(null, null, false, false); }
    }
    private static final Defer DEFER = new Defer();

    /**
     * The most image shapes one task passes on as they are (see `shape`); a change of any
     * other shape has the shape `*`, which sends the caller to Spark's schema inference. So
     * the set of shapes the caller collects (an aggregate it observes) holds at most this many
     * a task, whatever the input.
     */
    static final int SHAPES = 256;

    /**
     * The shapes one task has passed on (the function is deserialized for each task), and the
     * last change's: a feed's changes mostly repeat the shape before them, whose text is then
     * not made again.
     */
    static final class Shapes {
        final Set<String> seen = new HashSet<>();
        List<String> lastAfter, lastBefore;
        String last;

        /** The shape text of a change's images (`shape`), or `*` beyond `SHAPES`. */
        String of(List<String> after, List<String> before) {
            if (last != null && java.util.Objects.equals(after, lastAfter)
                    && java.util.Objects.equals(before, lastBefore)) {
                return last;
            }
            String text = shape(after, before);
            if (!seen.contains(text)) {
                if (seen.size() < SHAPES) seen.add(text);
                else text = "*";
            }
            lastAfter = after;
            lastBefore = before;
            last = text;
            return text;
        }
    }

    private transient Shapes shapes;

    /** The line's UTF-8 bytes (the caller casts its text to binary: `JsonBytes`). */
    @Override
    public Row call(byte[] line) {
        if (shapes == null) shapes = new Shapes();
        Object[] values = read(line, shapes);
        if (values == null) return null;
        for (int i : IMAGES) {
            if (values[i] != null)
                values[i] = new String((byte[]) values[i], StandardCharsets.UTF_8);
        }
        return RowFactory.create(values);
    }

    /**
     * The line's item values in `JVM_LINE_TYPE`'s order (the images as their UTF-8 bytes, at
     * `IMAGES`), or null where it is left to the Python path.
     */
    static Object[] read(byte[] line, Shapes shapes) {
        if (line == null) return null;
        if (Arrays.equals(line, NULL_LINE)) return tombstone(null);
        if (!JsonBytes.opensObject(line)) return null;
        try {
            return parse(line, shapes);
        } catch (Defer | IOException | RuntimeException e) {
            return null;
        }
    }

    /** Where `read`'s values hold the images (before, after) and the collections. */
    static final int[] IMAGES = {12, 13};
    static final int COLLECTIONS_AT = 8, POSITION_AT = 9, SHAPE_AT = 14;

    private static final byte[] NULL_LINE = ascii("null");
    // The keys whose value `parse` must find not to be a string (`keyThenString`).
    private static final String AFTER = "\"after\"", BEFORE = "\"before\"",
        COLLECTIONS = "\"data_collections\"";

    private static byte[] ascii(String text) {
        return text.getBytes(StandardCharsets.US_ASCII);
    }

    /** The body fields of an envelope or of its payload (`parse.BODY`). */
    private static final class Body {
        String op, status, id, txRawId;
        byte[] before, after;
        /** The images' fields and their JSON kinds (see `image`). */
        List<String> beforeShape, afterShape;
        Long eventCount, txOrder;
        Src src;
        List<Row> collections;
        final UniqueKeys keys = new UniqueKeys();

        boolean envelopeFieldsNull() {
            return op == null && before == null && after == null && status == null
                && src == null;
        }
    }

    /** The source block (`parse.SOURCE`) and its keys, which say what is present. */
    private static final class Src {
        String connector, snapshot, sequence, file, gtid, step, table, schema, db;
        Long lsn, txId, pos, row;
        final UniqueKeys keys = new UniqueKeys();

        boolean present(String name) {
            return keys.contains(name);
        }

        /** `[schema or db.]table`; an empty schema falls to the db, as a missing one does. */
        String tableName() {
            if (table == null || table.isEmpty()) return null;
            String prefix = schema != null && !schema.isEmpty() ? schema
                : db != null && !db.isEmpty() ? db : null;
            return prefix == null ? table : prefix + "." + table;
        }
    }

    private static Object[] parse(byte[] line, Shapes shapes) throws IOException, Defer {
        Body top = new Body();
        Body payload = null;
        boolean hasPayload = false;
        String schema = null;
        try (JsonParser p = READ.createParser(line)) {
            p.nextToken();
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                top.keys.add(name);
                JsonToken t = p.nextToken();
                switch (name) {
                    case "schema": schema = textOrStructure(p, t); break;
                    case "payload":
                        hasPayload = true;
                        if (t == JsonToken.VALUE_NULL) break;  // a tombstone, if wrapped
                        if (t != JsonToken.START_OBJECT) throw DEFER;
                        payload = body(p);
                        break;
                    default:
                        if (!bodyField(top, name, p, t)) UniqueKeys.skip(p, t);
                }
            }
            if (p.currentToken() != JsonToken.END_OBJECT || p.nextToken() != null) throw DEFER;
        }
        // The parser asks whether a field is present (`in`), not whether it is null.
        boolean wrapped = hasPayload && !(top.keys.contains("op") || top.keys.contains("before")
            || top.keys.contains("after") || top.keys.contains("status")
            || top.keys.contains("source"));
        if (wrapped && payload == null) return tombstone(schema);
        Body b = wrapped ? payload : top;
        if ((b.op == null && b.keys.contains("op"))
            || (b.status == null && b.keys.contains("status"))) throw DEFER;  // the parser refuses
        if (b.envelopeFieldsNull()) return skipped(b, wrapped ? schema : null);
        if (b.op != null) {
            String text = new String(line, StandardCharsets.ISO_8859_1);
            if (keyThenString(text, AFTER) || keyThenString(text, BEFORE))
                throw DEFER;  // an image that may be a JSON string
            return change(b, wrapped ? schema : null, shapes);
        }
        if (b.status == null) throw DEFER;  // neither a change nor a transaction boundary
        if (keyThenString(new String(line, StandardCharsets.ISO_8859_1), COLLECTIONS))
            throw DEFER;  // may be a string
        return boundary(b, wrapped ? schema : null);
    }

    /** A tombstone: a line `null`, or a wrapped line whose payload is null. */
    private static Object[] tombstone(String schema) {
        return new Object[] {schema, "tombstone", null, null, false, null, null, null, null,
                             null, null, false, null, null, null};
    }

    /**
     * A body with none of op, before, after, status and source: a schema change (a `ddl` or
     * `tableChanges` key) or a heartbeat (only `ts_*` keys), which the parser skips; any other
     * is no Debezium event, left to the Python path.
     */
    private static Object[] skipped(Body b, String schema) throws Defer {
        boolean ddl = b.keys.contains("ddl") || b.keys.contains("tableChanges");
        if (!ddl && (b.keys.isEmpty() || !b.keys.allIn(HEARTBEAT))) throw DEFER;
        return new Object[] {schema, "skipped", null, null, false, null, b.txOrder, null,
                             null, null, null, false, null, null, null};
    }

    /** A change line, as `DebeziumParser` reads one it accepts. */
    private static Object[] change(Body b, String schema, Shapes shapes) throws Defer {
        Src s = b.src;
        if (s == null) throw DEFER;  // bad: no source block
        boolean truncate = b.op.equals("t");
        if (!(b.op.equals("c") || b.op.equals("r") || b.op.equals("u") || b.op.equals("d")
              || truncate))
            throw DEFER;  // messages, unknown ops
        if (truncate && (b.before != null || b.after != null)) throw DEFER;  // a truncate's
        // images: rare, and no connector writes them
        if (s.present("step") || "ydb".equals(s.connector)) throw DEFER;  // YDB's Debezium JSON
        if (negative(s.lsn) || negative(s.txId) || negative(s.pos) || negative(s.row))
            throw DEFER;
        boolean snapshot = s.snapshot != null && SNAPSHOT_TRUE.contains(s.snapshot);
        String op = b.op.equals("c") && snapshot ? "r" : b.op;
        if (b.status != null) throw DEFER;  // a change with a boundary's status: rare
        if (b.op.equals("d") && b.after != null) throw DEFER;  // bad: a delete with an after
        if (!op.equals("d") && !truncate && b.after == null) throw DEFER;  // bad: no after
        String txId = b.txRawId == null ? null : txId(b.txRawId);
        boolean pg = s.present("lsn") || s.present("txId") || s.present("sequence");
        Long[] pos;
        Long time;
        boolean txMin;
        String tx;
        if (pg) {
            Long seq0 = null, seq1 = null;
            if (s.sequence != null) {
                Long[] entries = sequence(s.sequence);
                if (entries == null) throw DEFER;  // not in Debezium's shape
                seq0 = entries[0];
                seq1 = entries[1];
            }
            tx = txId != null ? txId : s.txId == null ? null : s.txId.toString();
            if (seq0 == null && seq1 == null && s.lsn == null) throw DEFER;  // no position
            pos = new Long[] {seq0 == null ? 0L : seq0,
                              seq1 != null ? seq1 : s.lsn != null ? s.lsn : 0L,
                              s.lsn == null ? 0L : s.lsn};
            Long own = s.lsn != null ? s.lsn : seq1;
            time = snapshot ? null : seq0 != null ? seq0 : own;
            txMin = !snapshot && seq0 == null && tx != null && own != null;
        } else if (s.present("file") || s.present("pos")) {
            if (s.file == null || s.pos == null || s.pos >= (1L << 32)) throw DEFER;
            Matcher m = BINLOG.matcher(s.file);
            if (!m.find() || m.group(1).length() > 18) throw DEFER;  // bad: binlog position
            long number = Long.parseLong(m.group(1));
            tx = txId != null ? txId : s.gtid;
            boolean byTxId = tx != null && tx.startsWith("file=");
            pos = new Long[] {number, s.pos, s.row == null ? 0L : s.row};
            Long txTime = null;
            if (byTxId) {  // checked for snapshot rows too, as the parser checks them
                Matcher file = TX_FILE.matcher(tx), at = TX_POS.matcher(tx);
                if (!file.find() || !at.find() || file.group(1).length() > 18
                    || at.group(1).length() > 18) throw DEFER;  // bad: transaction id
                txTime = Long.parseLong(file.group(1)) << 32 | Long.parseLong(at.group(1));
            }
            time = snapshot ? null : byTxId ? txTime : Long.valueOf(number << 32 | s.pos);
            txMin = !snapshot && tx != null && !byTxId;
        } else {
            throw DEFER;  // a change without a position
        }
        return new Object[] {schema, "change", op, time, txMin, tx, b.txOrder, null, null,
                             pos, s.tableName(), snapshot, b.before, b.after,
                             shapes.of(b.afterShape, b.beforeShape)};
    }

    /** A BEGIN or END line, as `DebeziumParser` reads one it accepts. */
    private static Object[] boundary(Body b, String schema) throws Defer {
        if (b.src != null) throw DEFER;  // a source on a boundary: rare
        if (b.collections != null) {
            for (Row entry : b.collections) if (entry.isNullAt(1)) throw DEFER;  // bad entry
        }
        if (!(b.status.equals("BEGIN") || b.status.equals("END")) || b.id == null) throw DEFER;
        boolean end = b.status.equals("END");
        if (end && b.eventCount == null) throw DEFER;
        return new Object[] {schema, b.status, null, null, false, txId(b.id), b.txOrder,
                             end ? b.eventCount : null, end ? b.collections : null, null,
                             null, false, b.before, b.after, null};
    }

    private static boolean negative(Long value) {
        return value != null && value < 0;
    }

    /**
     * A `sequence`'s two entries (each null for `null`), or null where it is not in Debezium's
     * shape: what `parse._SEQUENCE` matches, `[`, an entry, `,`, an entry, `]` and the end,
     * each entry `null` or 1 to 18 ASCII digits in double quotes. Read by hand, not by that
     * regular expression: matching it was a noticeable share of Java's reading of a
     * PostgreSQL feed, every change line has one (a profile: benchmarks/README.md, "A change's
     * `sequence` read by hand; fewer, larger files a commit"), and
     * `tests/spark/test_spark_changefeed_jvm.py` holds the two to the same answers.
     */
    static Long[] sequence(String text) {
        int n = text.length();
        if (n == 0 || text.charAt(0) != '[' || text.charAt(n - 1) != ']') return null;
        Long[] entries = new Long[2];
        int at = entry(text, 1, entries, 0);
        if (at < 0 || at >= n || text.charAt(at) != ',') return null;
        return entry(text, at + 1, entries, 1) == n - 1 ? entries : null;
    }

    /** A `sequence` entry at `at` into `entries[i]`: where it ends, or -1 for none. */
    private static int entry(String text, int at, Long[] entries, int i) {
        if (text.startsWith("null", at)) return at + 4;  // entries[i] stays null
        if (at >= text.length() || text.charAt(at) != '"') return -1;
        int start = at + 1, end = start;
        long value = 0;
        for (; end < text.length() && end - start <= 18; end++) {
            char c = text.charAt(end);
            if (c < '0' || c > '9') break;
            value = value * 10 + (c - '0');
        }
        int digits = end - start;
        if (digits < 1 || digits > 18 || end >= text.length() || text.charAt(end) != '"')
            return -1;
        entries[i] = value;
        return end + 1;
    }

    /** `normalise_tx_id`: PostgreSQL `txId:LSN` keeps the txId; other ids stay whole. */
    private static String txId(String raw) {
        return PG_TX.matcher(raw).find() ? raw.substring(0, raw.indexOf(':')) : raw;
    }

    private static Body body(JsonParser p) throws IOException, Defer {
        Body b = new Body();
        while (p.nextToken() == JsonToken.FIELD_NAME) {
            String name = p.currentName();
            b.keys.add(name);
            JsonToken t = p.nextToken();
            if (!bodyField(b, name, p, t)) UniqueKeys.skip(p, t);
        }
        return b;
    }

    /** Reads field `name` into `b` if it is one of `parse.BODY`'s; false for any other. */
    private static boolean bodyField(Body b, String name, JsonParser p, JsonToken t)
            throws IOException, Defer {
        switch (name) {
            case "op": b.op = string(p, t); return true;
            case "status": b.status = string(p, t); return true;
            case "id": b.id = string(p, t); return true;
            case "event_count": b.eventCount = number(p, t); return true;
            case "before":
                b.beforeShape = new ArrayList<>();
                b.before = image(p, t, b.beforeShape);
                return true;
            case "after":
                b.afterShape = new ArrayList<>();
                b.after = image(p, t, b.afterShape);
                return true;
            case "data_collections": b.collections = collections(p, t); return true;
            case "source": b.src = source(p, t); return true;
            case "transaction": transaction(b, p, t); return true;
            default: return false;
        }
    }

    private static Src source(JsonParser p, JsonToken t) throws IOException, Defer {
        if (t == JsonToken.VALUE_NULL) return null;
        if (t != JsonToken.START_OBJECT) throw DEFER;
        Src s = new Src();
        while (p.nextToken() == JsonToken.FIELD_NAME) {
            String name = p.currentName();
            s.keys.add(name);
            JsonToken v = p.nextToken();
            switch (name) {
                case "connector": s.connector = string(p, v); break;
                case "snapshot":  // a boolean is text to `from_json`, and a known flag
                    s.snapshot = v == JsonToken.VALUE_TRUE ? "true"
                        : v == JsonToken.VALUE_FALSE ? "false" : string(p, v);
                    break;
                case "sequence": s.sequence = string(p, v); break;
                case "file": s.file = string(p, v); break;
                case "gtid": s.gtid = string(p, v); break;
                case "step": s.step = string(p, v); break;
                case "table": s.table = string(p, v); break;
                case "schema": s.schema = string(p, v); break;
                case "db": s.db = string(p, v); break;
                case "lsn": s.lsn = number(p, v); break;
                case "txId": s.txId = number(p, v); break;
                case "pos": s.pos = number(p, v); break;
                case "row": s.row = number(p, v); break;
                default: UniqueKeys.skip(p, v);
            }
        }
        if (s.snapshot != null && !SNAPSHOT_KNOWN.contains(s.snapshot)) throw DEFER;
        if (s.gtid != null
            && (s.gtid.indexOf(':') < 0 || s.gtid.startsWith("{") || s.gtid.startsWith("[")))
            throw DEFER;
        return s;
    }

    private static void transaction(Body b, JsonParser p, JsonToken t) throws IOException, Defer {
        b.txRawId = null;
        b.txOrder = null;
        if (t == JsonToken.VALUE_NULL) return;
        if (t != JsonToken.START_OBJECT) throw DEFER;
        UniqueKeys keys = new UniqueKeys();
        while (p.nextToken() == JsonToken.FIELD_NAME) {
            String name = p.currentName();
            keys.add(name);
            JsonToken v = p.nextToken();
            switch (name) {
                case "id": b.txRawId = string(p, v); break;
                case "total_order": b.txOrder = number(p, v); break;
                default: UniqueKeys.skip(p, v);
            }
        }
    }

    /** `data_collections` as `parse.COLLECTIONS` reads it. */
    private static List<Row> collections(JsonParser p, JsonToken t) throws IOException, Defer {
        if (t == JsonToken.VALUE_NULL) return null;
        if (t != JsonToken.START_ARRAY) throw DEFER;
        List<Row> out = new ArrayList<>();
        while (p.nextToken() == JsonToken.START_OBJECT) {
            String collection = null;
            Long count = null;
            UniqueKeys keys = new UniqueKeys();
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                keys.add(name);
                JsonToken v = p.nextToken();
                switch (name) {
                    case "data_collection": collection = string(p, v); break;
                    case "event_count": count = number(p, v); break;
                    default: UniqueKeys.skip(p, v);
                }
            }
            out.add(RowFactory.create(collection, count));
        }
        if (p.currentToken() != JsonToken.END_ARRAY) throw DEFER;  // an entry not an object
        return out;
    }

    /** A string field: a JSON string or null; any other kind `from_json` would take as text. */
    private static String string(JsonParser p, JsonToken t) throws IOException, Defer {
        if (t == JsonToken.VALUE_NULL) return null;
        if (t != JsonToken.VALUE_STRING) throw DEFER;
        return p.getText();
    }

    /** A bigint field: an integer that fits a long, or null. */
    private static Long number(JsonParser p, JsonToken t) throws IOException, Defer {
        if (t == JsonToken.VALUE_NULL) return null;
        if (t != JsonToken.VALUE_NUMBER_INT) throw DEFER;
        JsonParser.NumberType type = p.getNumberType();
        if (type != JsonParser.NumberType.INT && type != JsonParser.NumberType.LONG) throw DEFER;
        return p.getLongValue();
    }

    /**
     * An image: an object, re-written as `rewrite` re-writes it (its UTF-8 bytes), or null.
     * `shape` gets each field's name and the kind of JSON value that Spark's schema inference
     * reads it as (`JsonInferSchema.inferField`): `s` a string, `n` null or the empty string
     * (which inference takes for null), `i` an integer within a long, `f` any other number but
     * an integer (a double), `b` a boolean, `x` anything else (an object, an array, a larger
     * integer), which the caller leaves to the inference itself.
     */
    private static byte[] image(JsonParser p, JsonToken t, List<String> shape)
            throws IOException, Defer {
        if (t == JsonToken.VALUE_NULL) return null;
        if (t != JsonToken.START_OBJECT) throw DEFER;
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        UniqueKeys keys = new UniqueKeys();
        try (JsonGenerator g = WRITE.createGenerator(out, JsonEncoding.UTF8)) {
            g.writeStartObject();
            JsonToken v;
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                keys.add(name);
                g.writeFieldName(name);
                v = p.nextToken();
                shape.add(name);
                shape.add(kind(p, v));
                UniqueKeys.copy(p, v, g);
            }
            g.writeEndObject();
        }
        return out.toByteArray();
    }

    private static String kind(JsonParser p, JsonToken v) throws IOException {
        switch (v) {
            case VALUE_STRING: return p.getTextLength() == 0 ? "n" : "s";
            case VALUE_NULL: return "n";
            case VALUE_TRUE: case VALUE_FALSE: return "b";
            case VALUE_NUMBER_FLOAT: return "f";
            case VALUE_NUMBER_INT:
                JsonParser.NumberType type = p.getNumberType();
                return type == JsonParser.NumberType.INT || type == JsonParser.NumberType.LONG
                    ? "i" : "x";
            default: return "x";
        }
    }

    /**
     * A change's image shapes, as one JSON text: `[after, before]`, each the flat list of its
     * fields' names and kinds (`image`; empty where there is no image).
     */
    private static String shape(List<String> after, List<String> before) {
        StringBuilder out = new StringBuilder(64).append('[');
        for (List<String> image : new List[] {after, before}) {
            if (out.length() > 1) out.append(',');
            out.append('[');
            if (image != null) {
                for (int i = 0; i < image.size(); i++) {
                    if (i > 0) out.append(',');
                    out.append('"');
                    QUOTE.quoteAsString(image.get(i), out);
                    out.append('"');
                }
            }
            out.append(']');
        }
        return out.append(']').toString();
    }

    /** The envelope's `schema`: a string's content, an object or array re-written, or null. */
    private static String textOrStructure(JsonParser p, JsonToken t) throws IOException, Defer {
        if (t == JsonToken.START_OBJECT || t == JsonToken.START_ARRAY) return rewrite(p);
        return string(p, t);
    }

    /** What Spark's JSON reader makes of an object or array read into a string field. */
    private static String rewrite(JsonParser p) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (JsonGenerator g = WRITE.createGenerator(out, JsonEncoding.UTF8)) {
            UniqueKeys.copy(p, p.currentToken(), g);
        }
        return out.toString(StandardCharsets.UTF_8);
    }

    /**
     * Whether `key` (quoted, ASCII) occurs on the line followed by optional white space, a colon,
     * optional white space and a quote: what `rlike('"key"\s*:\s*"')` finds. Searched in
     * the line's UTF-8 bytes read as Latin-1 `text` (one char a byte), which give the same
     * answer as the text: the key and the white space are ASCII, and no byte of a multi-byte
     * character is. `String.indexOf` is the JIT's vectorized search; comparing the key at
     * each quote of the line instead was over a third of the time Java took to read a line (a
     * Flight Recorder profile, benchmarks/README.md).
     */
    static boolean keyThenString(String text, String key) {
        for (int at = text.indexOf(key); at >= 0; at = text.indexOf(key, at + 1)) {
            int i = skipSpace(text, at + key.length());
            if (i < text.length() && text.charAt(i) == ':') {
                i = skipSpace(text, i + 1);
                if (i < text.length() && text.charAt(i) == '"') return true;
            }
        }
        return false;
    }

    /** Past Java's `\s`: space, tab, newline, vertical tab, form feed, carriage return. */
    private static int skipSpace(String line, int i) {
        while (i < line.length()) {
            char c = line.charAt(i);
            if (c != ' ' && c != '\t' && c != '\n' && c != 0x0B && c != '\f' && c != '\r') break;
            i++;
        }
        return i;
    }
}
