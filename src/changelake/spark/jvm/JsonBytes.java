package changelake.jvm;

/**
 * A text's UTF-8 bytes as the Java readers give them to Jackson (`DebeziumLine`,
 * `DebeziumImage`: Jackson reads bytes faster than a `String`, which Spark would first decode
 * from them). Jackson guesses the encoding of the bytes it is given from their first four: a
 * NUL after `{` makes it read UTF-16 or UTF-32 text, so such a text is never read as UTF-8.
 */
final class JsonBytes {
    private JsonBytes() {}

    /** Whether `text` opens with `{` and Jackson reads it as UTF-8. */
    static boolean opensObject(byte[] text) {
        return text.length > 0 && text[0] == '{' && (text.length == 1 || text[1] != 0);
    }
}
