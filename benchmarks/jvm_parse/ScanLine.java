import com.fasterxml.jackson.core.*;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * A benchmark's prototype, not the project's code: one streaming pass (Jackson) over a
 * Debezium line, returning the fields `parse_items` reads (the images' texts cut out of the
 * line by their offsets), with none of its rules. `bench_jvm_parse.py` compiles it and times it
 * against `parse_items` and Spark's JSON reader, to say what a parse written for the JVM could
 * cost per line (benchmarks/README.md).
 */
public class ScanLine implements UDF1<String, Row> {
    private static final JsonFactory F = JsonFactory.builder()
        .enable(StreamReadFeature.STRICT_DUPLICATE_DETECTION).build();
    /** A scalar's text, null for JSON null. */
    private static String text(JsonParser p, JsonToken t) throws java.io.IOException {
        return t == JsonToken.VALUE_NULL ? null : p.getText();
    }

    public Row call(String line) throws Exception {
        if (line == null) return null;
        String op = null, before = null, after = null, status = null, id = null;
        String snapshot = null, seq = null, table = null, schema = null, db = null, connector = null;
        Long lsn = null, txId = null, eventCount = null;
        boolean many = false;
        try (JsonParser p = F.createParser(line)) {
            if (p.nextToken() != JsonToken.START_OBJECT) return null;  // `null`, not an object
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                JsonToken t = p.nextToken();
                switch (name) {
                    case "op": op = text(p, t); break;
                    case "status": status = text(p, t); break;
                    case "id": id = text(p, t); break;
                    case "event_count": eventCount = t == JsonToken.VALUE_NUMBER_INT ? p.getLongValue() : null; break;
                    case "before": case "after": {
                        String raw = null;
                        if (t == JsonToken.START_OBJECT || t == JsonToken.START_ARRAY) {
                            int start = (int) p.currentTokenLocation().getCharOffset();
                            p.skipChildren();
                            int end = (int) p.currentLocation().getCharOffset();
                            raw = line.substring(start, end);
                        } else if (t != JsonToken.VALUE_NULL) raw = p.getText();
                        if (name.equals("before")) before = raw; else after = raw;
                        break;
                    }
                    case "source": {
                        if (t != JsonToken.START_OBJECT) { p.skipChildren(); break; }
                        while (p.nextToken() == JsonToken.FIELD_NAME) {
                            String s = p.currentName();
                            JsonToken v = p.nextToken();
                            switch (s) {
                                case "snapshot": snapshot = text(p, v); break;
                                case "sequence": seq = text(p, v); break;
                                case "table": table = text(p, v); break;
                                case "schema": schema = text(p, v); break;
                                case "db": db = text(p, v); break;
                                case "connector": connector = text(p, v); break;
                                case "lsn": lsn = v == JsonToken.VALUE_NUMBER_INT ? p.getLongValue() : null; break;
                                case "txId": txId = v == JsonToken.VALUE_NUMBER_INT ? p.getLongValue() : null; break;
                                default: p.skipChildren();
                            }
                        }
                        break;
                    }
                    default: p.skipChildren();
                }
            }
            many = p.nextToken() != null;
        }
        return RowFactory.create(op, before, after, status, id, snapshot, seq, table, schema, db, connector, lsn, txId, eventCount, many);
    }
}
