package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.io.StringWriter;
import java.util.Set;
import org.junit.jupiter.api.Test;

/** `UniqueKeys`: no object holds a key twice, however many keys, however deep. */
class UniqueKeysTest {
    static final JsonFactory JSON = new JsonFactory();

    @Test
    void aKeySeenTwiceIsADuplicate() throws IOException {
        UniqueKeys keys = new UniqueKeys();
        assertTrue(keys.isEmpty());
        keys.add("a");
        keys.add("b");
        assertFalse(keys.isEmpty());
        assertTrue(keys.contains("a"));
        assertFalse(keys.contains("c"));
        assertThrows(UniqueKeys.Duplicate.class, () -> keys.add("a"));
    }

    @Test
    void theRuleHoldsBeyondTheLinearKeys() throws IOException {
        UniqueKeys keys = new UniqueKeys();
        for (int i = 0; i < 100; i++) keys.add("k" + i);
        for (int i = 0; i < 100; i++) {
            String name = "k" + i;
            assertThrows(UniqueKeys.Duplicate.class, () -> keys.add(name));
        }
        keys.add("k100");
        assertTrue(keys.contains("k100"));
        assertFalse(keys.allIn(Set.of("k1", "k2")));
    }

    @Test
    void allInSaysWhetherEveryKeyIsAllowed() throws IOException {
        UniqueKeys keys = new UniqueKeys();
        keys.add("ts_ms");
        keys.add("ts_us");
        assertTrue(keys.allIn(Set.of("ts_ms", "ts_us", "ts_ns")));
        keys.add("op");
        assertFalse(keys.allIn(Set.of("ts_ms", "ts_us", "ts_ns")));
    }

    static JsonParser at(String json) throws IOException {
        JsonParser p = JSON.createParser(json);
        p.nextToken();
        return p;
    }

    @Test
    void skipGoesPastTheValueAndRefusesANestedDuplicate() throws IOException {
        try (JsonParser p = at("[{\"a\":[1,{\"b\":2}],\"c\":{}},3]")) {
            UniqueKeys.skip(p, p.currentToken());
            assertEquals(JsonToken.END_ARRAY, p.currentToken());
            assertNull(p.nextToken());
        }
        try (JsonParser p = at("[1,{\"x\":{\"b\":1,\"b\":2}}]")) {
            assertThrows(UniqueKeys.Duplicate.class, () -> UniqueKeys.skip(p, p.currentToken()));
        }
    }

    @Test
    void copyWritesTheValueCompactlyAndRefusesANestedDuplicate() throws IOException {
        StringWriter out = new StringWriter();
        try (JsonParser p = at("{ \"a\" : [ 1 , 2.50, \"s\", null, true ], \"b\": {\"c\": {}} }");
             JsonGenerator g = JSON.createGenerator(out)) {
            UniqueKeys.copy(p, p.currentToken(), g);
        }
        assertEquals("{\"a\":[1,2.5,\"s\",null,true],\"b\":{\"c\":{}}}", out.toString());
        try (JsonParser p = at("{\"a\":[{\"d\":1,\"d\":1}]}");
             JsonGenerator g = JSON.createGenerator(new StringWriter())) {
            assertThrows(UniqueKeys.Duplicate.class, () -> UniqueKeys.copy(p, p.currentToken(), g));
        }
    }
}
