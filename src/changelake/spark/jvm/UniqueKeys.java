package changelake.jvm;

import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Set;

/**
 * The Java readers' rule that no object holds a key twice (Spark and orjson each keep one of
 * the values, maybe not the same one, so such a line is left to the other paths), without
 * Jackson's `STRICT_DUPLICATE_DETECTION`, which gives every object of three keys or more a
 * `HashSet` of its own: that was a fifth of the time Java took to read a Debezium line (a
 * Flight Recorder profile, benchmarks/README.md). An object's keys are few, so they are kept
 * in an array with their hashes (Jackson's names are canonical strings, whose hash is
 * computed once) and compared one by one, hash first (a set beyond `LINEAR` of them).
 *
 * A reader `add`s each key of an object it walks itself, and hands each value it does not
 * read to `skip` or `copy`, which hold every object within it to the same rule. A key seen
 * twice throws `Duplicate`, an `IOException`, which the readers treat as they treat any line
 * Jackson refuses.
 */
final class UniqueKeys {
    /**
     * Thrown for a key seen twice in one object. A new one each time (a shared one could
     * gather the exceptions a `close` adds to it), without a stack trace: it is a verdict.
     */
    static final class Duplicate extends IOException {
        private static final long serialVersionUID = 1L;

        Duplicate() {
            super("a key twice in one object");
        }

        @Override
        public synchronized Throwable fillInStackTrace() {
            return this;
        }
    }

    /** Up to this many keys, a new one is compared with each; beyond, a set holds them. */
    private static final int LINEAR = 32;

    private String[] names = new String[8];
    private int[] hashes = new int[8];
    private int size;
    private Set<String> many;

    /** Another key of the object; `Duplicate` where it has one of that name already. */
    void add(String name) throws Duplicate {
        if (contains(name)) throw new Duplicate();
        if (many != null) {
            many.add(name);
            return;
        }
        if (size == LINEAR) {
            many = new HashSet<>(Arrays.asList(names));
            many.add(name);
            return;
        }
        if (size == names.length) {
            names = Arrays.copyOf(names, Math.min(LINEAR, size * 2));
            hashes = Arrays.copyOf(hashes, names.length);
        }
        hashes[size] = name.hashCode();  // a canonical name's: computed once
        names[size++] = name;
    }

    boolean contains(String name) {
        if (many != null) return many.contains(name);
        int hash = name.hashCode();
        for (int i = 0; i < size; i++) {
            if (hashes[i] == hash && names[i].equals(name)) return true;
        }
        return false;
    }

    boolean isEmpty() {
        return size == 0 && many == null;
    }

    /** Whether every key is one of `allowed`. */
    boolean allIn(Set<String> allowed) {
        if (many != null) return allowed.containsAll(many);
        for (int i = 0; i < size; i++) {
            if (!allowed.contains(names[i])) return false;
        }
        return true;
    }

    /** Past the value at `p`'s current token (`t`), as `skipChildren` goes past it. */
    static void skip(JsonParser p, JsonToken t) throws IOException {
        if (t == JsonToken.START_OBJECT) {
            UniqueKeys keys = new UniqueKeys();
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                keys.add(p.currentName());
                skip(p, p.nextToken());
            }
        } else if (t == JsonToken.START_ARRAY) {
            JsonToken e;
            while ((e = p.nextToken()) != JsonToken.END_ARRAY && e != null) skip(p, e);
        }
    }

    /** The value at `p`'s current token (`t`) written to `g`, as `copyCurrentStructure`. */
    static void copy(JsonParser p, JsonToken t, JsonGenerator g) throws IOException {
        if (t == JsonToken.START_OBJECT) {
            UniqueKeys keys = new UniqueKeys();
            g.writeStartObject();
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                keys.add(name);
                g.writeFieldName(name);
                copy(p, p.nextToken(), g);
            }
            g.writeEndObject();
        } else if (t == JsonToken.START_ARRAY) {
            g.writeStartArray();
            JsonToken e;
            while ((e = p.nextToken()) != JsonToken.END_ARRAY && e != null) copy(p, e, g);
            g.writeEndArray();
        } else {
            g.copyCurrentStructure(p);  // a scalar: its one event, written as Jackson writes it
        }
    }
}
