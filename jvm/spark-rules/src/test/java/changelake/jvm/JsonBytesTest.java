package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

/** `JsonBytes.opensObject`: a `{` first, and no NUL after it (Jackson would read UTF-16/32). */
class JsonBytesTest {
    @Test
    void anObjectInUtf8Opens() {
        assertTrue(JsonBytes.opensObject("{".getBytes(StandardCharsets.UTF_8)));
        assertTrue(JsonBytes.opensObject("{\"a\":1}".getBytes(StandardCharsets.UTF_8)));
    }

    @Test
    void anythingElseDoesNot() {
        assertFalse(JsonBytes.opensObject(new byte[0]));
        assertFalse(JsonBytes.opensObject(" {}".getBytes(StandardCharsets.UTF_8)));
        assertFalse(JsonBytes.opensObject("[1]".getBytes(StandardCharsets.UTF_8)));
        assertFalse(JsonBytes.opensObject("{}".getBytes(StandardCharsets.UTF_16LE)));
        assertFalse(JsonBytes.opensObject(new byte[] {'{', 0, 0, 0}));
    }
}
