package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.util.List;
import org.apache.spark.sql.Row;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * `DebeziumLine`'s rules: a connector's line in either envelope shape read into the item
 * columns (`parse.JVM_LINE_TYPE`), PostgreSQL and MySQL positions, transaction boundaries, and
 * every line it must leave to the Spark functions (null).
 */
class DebeziumLineTest {
    // read()'s value places, in JVM_LINE_TYPE's order
    static final int SCHEMA = 0, KIND = 1, OP = 2, TIME = 3, TX_MIN = 4, TX = 5, TX_ORDER = 6,
        EVENT_COUNT = 7, COLLECTIONS = 8, POS = 9, TABLE = 10, SNAPSHOT = 11, BEFORE = 12,
        AFTER = 13, SHAPE = 14;

    static final String PG_SOURCE = "{\"connector\":\"postgresql\",\"db\":\"shop\","
        + "\"schema\":\"public\",\"table\":\"orders\",\"snapshot\":\"false\",\"txId\":571,"
        + "\"lsn\":53195829,\"sequence\":\"[\\\"53195000\\\",\\\"53195829\\\"]\"}";
    static final String MYSQL_SOURCE = "{\"connector\":\"mysql\",\"db\":\"inventory\","
        + "\"table\":\"customers\",\"snapshot\":\"false\",\"file\":\"mysql-bin.000003\","
        + "\"pos\":154,\"row\":2,\"gtid\":null}";

    static Object[] read(String line) {
        Object[] values = DebeziumLine.read(line.getBytes(StandardCharsets.UTF_8),
                                            new DebeziumLine.Shapes());
        if (values != null) {
            for (int i : DebeziumLine.IMAGES) {
                if (values[i] != null)
                    values[i] = new String((byte[]) values[i], StandardCharsets.UTF_8);
            }
        }
        return values;
    }

    static String change(String op, String before, String after, String source) {
        return "{\"before\":" + before + ",\"after\":" + after + ",\"source\":" + source
            + ",\"op\":\"" + op + "\",\"ts_ms\":1700000000000}";
    }

    static void assertDeferred(String line) {
        assertNull(read(line), line);
    }

    @Test
    void aPostgresCreateIsReadIntoItsFields() {
        Object[] v = read(change("c", "null", "{\"id\":1,\"name\":\"pen\"}", PG_SOURCE));
        assertEquals("change", v[KIND]);
        assertEquals("c", v[OP]);
        assertNull(v[SCHEMA]);
        assertEquals("public.orders", v[TABLE]);
        assertEquals(Boolean.FALSE, v[SNAPSHOT]);
        assertNull(v[BEFORE]);
        assertEquals("{\"id\":1,\"name\":\"pen\"}", v[AFTER]);
        assertEquals("[[\"id\",\"i\",\"name\",\"s\"],[]]", v[SHAPE]);
        assertEquals("571", v[TX]);
        // a sequence: (its first entry, its second, the lsn); the time is the first entry
        assertArrayEquals(new Long[] {53195000L, 53195829L, 53195829L}, (Long[]) v[POS]);
        assertEquals(53195000L, v[TIME]);
        assertEquals(Boolean.FALSE, v[TX_MIN]);
    }

    @Test
    void theWrappedEnvelopeGivesTheSameRowAndKeepsItsSchemaAsText() {
        String body = change("u", "{\"id\":1}", "{\"id\":1,\"name\":\"ink\"}", PG_SOURCE);
        Object[] flat = read(body);
        Object[] wrapped = read("{\"schema\": {\"type\": \"struct\", \"optional\": false},"
                                + " \"payload\":" + body + "}");
        assertEquals("{\"type\":\"struct\",\"optional\":false}", wrapped[SCHEMA]);
        assertNull(flat[SCHEMA]);
        for (int i = 1; i < flat.length; i++) {
            if (i == POS) assertArrayEquals((Long[]) flat[i], (Long[]) wrapped[i]);
            else assertEquals(flat[i], wrapped[i], "field " + i);
        }
        assertEquals("u", wrapped[OP]);
        assertEquals("{\"id\":1}", wrapped[BEFORE]);
    }

    @Test
    void aPostgresChangeWithoutSequenceIsPlacedByItsLsn() {
        String source = "{\"connector\":\"postgresql\",\"schema\":\"public\",\"table\":\"t\","
            + "\"txId\":9,\"lsn\":700}";
        Object[] v = read(change("u", "null", "{\"id\":2}", source));
        assertArrayEquals(new Long[] {0L, 700L, 700L}, (Long[]) v[POS]);
        assertEquals(700L, v[TIME]);
        // no sequence, a transaction and a position of its own: the transaction's least
        assertEquals(Boolean.TRUE, v[TX_MIN]);
        assertEquals("9", v[TX]);
    }

    @Test
    void aPostgresTransactionIdKeepsItsTxIdAndTotalOrder() {
        String line = "{\"before\":null,\"after\":{\"id\":3},\"source\":" + PG_SOURCE
            + ",\"op\":\"c\",\"transaction\":{\"id\":\"571:53195829\",\"total_order\":4,"
            + "\"data_collection_order\":1}}";
        Object[] v = read(line);
        assertEquals("571", v[TX]);
        assertEquals(4L, v[TX_ORDER]);
    }

    @Test
    void aDeleteHasItsBeforeImageOnly() {
        Object[] v = read(change("d", "{\"id\":1}", "null", PG_SOURCE));
        assertEquals("d", v[OP]);
        assertEquals("{\"id\":1}", v[BEFORE]);
        assertNull(v[AFTER]);
        assertEquals("[[],[\"id\",\"i\"]]", v[SHAPE]);
        assertDeferred(change("d", "{\"id\":1}", "{\"id\":1}", PG_SOURCE));
    }

    @Test
    void aSnapshotReadHasNoTimeAndACreateFlaggedSnapshotIsARead() {
        String snapshot = PG_SOURCE.replace("\"snapshot\":\"false\"", "\"snapshot\":\"last\"");
        Object[] read = read(change("r", "null", "{\"id\":1}", snapshot));
        assertEquals("r", read[OP]);
        assertNull(read[TIME]);
        assertEquals(Boolean.TRUE, read[SNAPSHOT]);
        assertEquals(Boolean.FALSE, read[TX_MIN]);
        Object[] create = read(change("c", "null", "{\"id\":1}", snapshot));
        assertEquals("r", create[OP]);
        String flag = PG_SOURCE.replace("\"snapshot\":\"false\"", "\"snapshot\":true");
        assertEquals(Boolean.TRUE, read(change("c", "null", "{\"id\":1}", flag))[SNAPSHOT]);
        String incremental = PG_SOURCE.replace("\"false\"", "\"incremental\"");
        assertEquals(Boolean.FALSE, read(change("c", "null", "{\"id\":1}", incremental))[SNAPSHOT]);
    }

    @Test
    void aMysqlChangeIsPlacedByItsBinlogFileAndPosition() {
        Object[] v = read(change("c", "null", "{\"id\":1}", MYSQL_SOURCE));
        assertEquals("inventory.customers", v[TABLE]);
        assertArrayEquals(new Long[] {3L, 154L, 2L}, (Long[]) v[POS]);
        assertEquals(3L << 32 | 154L, v[TIME]);
        assertNull(v[TX]);
        assertEquals(Boolean.FALSE, v[TX_MIN]);
    }

    @Test
    void aMysqlGtidIsItsTransactionAndItsLeast() {
        String gtid = MYSQL_SOURCE.replace("\"gtid\":null",
                                           "\"gtid\":\"3e11fa47-71ca-11e1-9e33-c80aa9429562:23\"");
        Object[] v = read(change("u", "{\"id\":1}", "{\"id\":1}", gtid));
        assertEquals("3e11fa47-71ca-11e1-9e33-c80aa9429562:23", v[TX]);
        assertEquals(Boolean.TRUE, v[TX_MIN]);
        assertDeferred(change("u", "null", "{\"id\":1}",
                              MYSQL_SOURCE.replace("\"gtid\":null", "\"gtid\":\"no-colon\"")));
    }

    @Test
    void aMysqlTransactionIdNamingABinlogPositionIsTheTime() {
        String line = "{\"before\":null,\"after\":{\"id\":1},\"source\":" + MYSQL_SOURCE
            + ",\"op\":\"c\",\"transaction\":{\"id\":\"file=mysql-bin.000004,pos=200\","
            + "\"total_order\":1}}";
        Object[] v = read(line);
        assertEquals(4L << 32 | 200L, v[TIME]);
        assertEquals("file=mysql-bin.000004,pos=200", v[TX]);
        assertEquals(Boolean.FALSE, v[TX_MIN]);
        assertArrayEquals(new Long[] {3L, 154L, 2L}, (Long[]) v[POS]);
        assertDeferred(line.replace("pos=200", "pos=x"));
        assertDeferred(line.replace("000004", "1234567890123456789"));  // 19 digits
    }

    @Test
    void aBadBinlogPositionIsLeft() {
        assertDeferred(change("c", "null", "{\"id\":1}",
                              MYSQL_SOURCE.replace("\"pos\":154", "\"pos\":4294967296")));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              MYSQL_SOURCE.replace("mysql-bin.000003", "mysql-bin")));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              MYSQL_SOURCE.replace("000003", "1234567890123456789")));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              MYSQL_SOURCE.replace("\"pos\":154,", "")));
    }

    @ParameterizedTest
    @ValueSource(strings = {"m", "x", "C", ""})
    void messagesAndUnknownOpsAreLeft(String op) {
        assertDeferred(change(op, "null", "null", PG_SOURCE));
        assertDeferred(change(op, "null", "{\"id\":1}", PG_SOURCE));
    }

    @Test
    void aTruncateWithAnImageIsLeft() {
        assertDeferred(change("t", "{\"id\":1}", "null", PG_SOURCE));
        assertDeferred(change("t", "null", "{\"id\":1}", MYSQL_SOURCE));
    }

    @Test
    void positionsAndSequencesOutsideDebeziumsShapeAreLeft() {
        assertDeferred(change("c", "null", "{\"id\":1}", PG_SOURCE.replace("53195829,", "-1,")));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              PG_SOURCE.replace("\\\"53195000\\\"", "53195000")));
        String none = "{\"connector\":\"postgresql\",\"schema\":\"s\",\"table\":\"t\",\"txId\":1}";
        assertDeferred(change("c", "null", "{\"id\":1}", none));  // no position at all
        String nowhere = "{\"connector\":\"oracle\",\"schema\":\"s\",\"table\":\"t\"}";
        assertDeferred(change("c", "null", "{\"id\":1}", nowhere));
    }

    @Test
    void ydbsDebeziumJsonAndOtherOddChangesAreLeft() {
        assertDeferred(change("c", "null", "{\"id\":1}", PG_SOURCE.replace("postgresql", "ydb")));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              PG_SOURCE.replace("{\"connector\"", "{\"step\":5,\"connector\"")));
        assertDeferred(change("c", "null", "null", PG_SOURCE));  // a create without an after
        assertDeferred(change("c", "null", "{\"id\":1}", "null"));  // no source block
        assertDeferred(change("c", "null", "{\"id\":1}", PG_SOURCE).replace("\"op\"",
                                                                           "\"status\":\"END\",\"op\""));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              PG_SOURCE.replace("\"false\"", "\"maybe\"")));
    }

    @Test
    void aFieldOfAnotherJsonKindIsLeft() {
        assertDeferred(change("c", "null", "{\"id\":1}", PG_SOURCE).replace("\"op\":\"c\"",
                                                                           "\"op\":1"));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              PG_SOURCE.replace("\"lsn\":53195829", "\"lsn\":\"53195829\"")));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              PG_SOURCE.replace("\"lsn\":53195829", "\"lsn\":1.5")));
        assertDeferred(change("c", "null", "{\"id\":1}",
                              PG_SOURCE.replace("\"lsn\":53195829", "\"lsn\":9223372036854775808")));
        assertDeferred(change("c", "null", "[1]", PG_SOURCE));  // an image not an object
        // an image that may be a JSON string: the Spark functions' reading of it is theirs
        assertDeferred(change("c", "null", "\"{\\\"id\\\":1}\"", PG_SOURCE));
    }

    @Test
    void malformedLinesAndDuplicateKeysAreLeft() {
        assertDeferred("{\"op\":\"c\"");
        assertDeferred("not json");
        assertDeferred(" " + change("c", "null", "{\"id\":1}", PG_SOURCE));  // not at byte 0
        assertDeferred(change("c", "null", "{\"id\":1}", PG_SOURCE) + " {}");  // not alone
        assertDeferred(change("c", "null", "{\"id\":1,\"id\":2}", PG_SOURCE));
        assertDeferred(change("c", "null", "{\"id\":{\"a\":1,\"a\":1}}", PG_SOURCE));
        assertDeferred(change("c", "null", "{\"id\":1}", PG_SOURCE).replace("{\"before\"",
                                                                           "{\"op\":\"c\",\"before\""));
        assertNull(DebeziumLine.read(new byte[] {'{', 0, '}', 0}, new DebeziumLine.Shapes()));
        assertNull(DebeziumLine.read(null, new DebeziumLine.Shapes()));
    }

    @Test
    void tombstonesAreReadInBothShapes() {
        Object[] bare = read("null");
        assertEquals("tombstone", bare[KIND]);
        assertNull(bare[SCHEMA]);
        Object[] wrapped = read("{\"schema\":\"s\",\"payload\":null}");
        assertEquals("tombstone", wrapped[KIND]);
        assertEquals("s", wrapped[SCHEMA]);
    }

    @Test
    void schemaChangesAndHeartbeatsAreSkippedAndOtherBodiesLeft() {
        assertEquals("skipped", read("{\"ts_ms\":1700000000000}")[KIND]);
        Object[] ddl = read("{\"ddl\":\"CREATE TABLE t (id int)\",\"databaseName\":\"d\"}");
        assertEquals("skipped", ddl[KIND]);
        assertEquals("skipped", read("{\"tableChanges\":[],\"ts_ms\":1}")[KIND]);
        assertDeferred("{\"ts_ms\":1,\"other\":2}");
        assertDeferred("{}");
    }

    @Test
    void transactionBoundariesAreReadAndBadOnesLeft() {
        Object[] begin = read("{\"status\":\"BEGIN\",\"id\":\"571:53195829\",\"event_count\":null,"
                              + "\"data_collections\":null,\"ts_ms\":1}");
        assertEquals("BEGIN", begin[KIND]);
        assertEquals("571", begin[TX]);
        assertNull(begin[EVENT_COUNT]);
        assertNull(begin[COLLECTIONS]);
        Object[] end = read("{\"status\":\"END\",\"id\":\"tx-1\",\"event_count\":2,"
                            + "\"data_collections\":[{\"data_collection\":\"public.orders\","
                            + "\"event_count\":2}]}");
        assertEquals("END", end[KIND]);
        assertEquals("tx-1", end[TX]);
        assertEquals(2L, end[EVENT_COUNT]);
        @SuppressWarnings("unchecked")
        List<Row> collections = (List<Row>) end[COLLECTIONS];
        assertEquals(1, collections.size());
        assertEquals("public.orders", collections.get(0).getString(0));
        assertEquals(2L, collections.get(0).getLong(1));
        assertDeferred("{\"status\":\"END\",\"id\":\"tx-1\",\"event_count\":null}");
        assertDeferred("{\"status\":\"MIDDLE\",\"id\":\"tx-1\"}");
        assertDeferred("{\"status\":\"BEGIN\",\"id\":null}");
        assertDeferred("{\"status\":\"BEGIN\",\"id\":\"t\",\"source\":" + PG_SOURCE + "}");
        assertDeferred("{\"status\":\"END\",\"id\":\"t\",\"event_count\":1,"
                       + "\"data_collections\":[{\"data_collection\":\"x\"}]}");
        assertDeferred("{\"status\":\"END\",\"id\":\"t\",\"event_count\":1,"
                       + "\"data_collections\":\"[]\"}");
    }

    @Test
    void imagesAreRewrittenAsSparksJsonReaderWritesThem() {
        Object[] v = read(change("c", "null",
                                 "{ \"price\" : 1.50, \"tags\" : [1, {\"k\": true}], \"e\": \"\","
                                 + " \"big\": 12345678901234567890, \"n\": null }", PG_SOURCE));
        assertEquals("{\"price\":1.5,\"tags\":[1,{\"k\":true}],\"e\":\"\","
                     + "\"big\":12345678901234567890,\"n\":null}", v[AFTER]);
        assertEquals("[[\"price\",\"f\",\"tags\",\"x\",\"e\",\"n\",\"big\",\"x\",\"n\",\"n\"],[]]",
                     v[SHAPE]);
    }

    @Test
    void theRowGivesTheImagesAsText() {
        Row row = new DebeziumLine().call(
            change("c", "null", "{\"id\":1}", PG_SOURCE).getBytes(StandardCharsets.UTF_8));
        assertEquals("{\"id\":1}", row.getString(AFTER));
        assertEquals(15, row.size());
        assertNull(new DebeziumLine().call("{".getBytes(StandardCharsets.UTF_8)));
    }

    @Test
    void aTaskPassesOnAtMostShapesDistinctShapes() {
        DebeziumLine.Shapes shapes = new DebeziumLine.Shapes();
        for (int i = 0; i < DebeziumLine.SHAPES; i++) {
            assertFalse(shapes.of(List.of("c" + i, "i"), null).equals("*"));
        }
        assertEquals("*", shapes.of(List.of("beyond", "i"), null));
        assertEquals("[[\"c0\",\"i\"],[]]", shapes.of(List.of("c0", "i"), null));  // seen
    }

    @Test
    void theSequenceIsReadAsItsRegularExpressionMatchesIt() {
        assertArrayEquals(new Long[] {1L, 22L}, DebeziumLine.sequence("[\"1\",\"22\"]"));
        assertArrayEquals(new Long[] {null, 5L}, DebeziumLine.sequence("[null,\"5\"]"));
        assertArrayEquals(new Long[] {null, null}, DebeziumLine.sequence("[null,null]"));
        assertArrayEquals(new Long[] {999999999999999999L, 0L},
                          DebeziumLine.sequence("[\"999999999999999999\",\"0\"]"));
        for (String bad : new String[] {"[\"1\", \"2\"]", "[1,2]", "[\"1\"]", "[\"\",\"1\"]",
                                        "[\"1234567890123456789\",\"1\"]", "[\"1\",\"2\"] ",
                                        "", "[]", "[\"1\",\"2\",\"3\"]", "[\"-1\",\"2\"]"}) {
            assertNull(DebeziumLine.sequence(bad), bad);
        }
    }

    @Test
    void keyThenStringFindsAKeyFollowedByAString() {
        assertTrue(DebeziumLine.keyThenString("{\"after\":\"x\"}", "\"after\""));
        assertTrue(DebeziumLine.keyThenString("{\"after\" \t:\n \"x\"}", "\"after\""));
        assertTrue(DebeziumLine.keyThenString("{\"a\":\"\\\"after\\\"\", \"after\":\"x\"}",
                                              "\"after\""));
        assertFalse(DebeziumLine.keyThenString("{\"after\":{\"x\":1}}", "\"after\""));
        assertFalse(DebeziumLine.keyThenString("{\"after\":null}", "\"after\""));
        assertFalse(DebeziumLine.keyThenString("{\"after\"", "\"after\""));
    }
}
