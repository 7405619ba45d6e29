package changelake.jvm;

import org.apache.spark.sql.catalyst.InternalRow$;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.types.DataType;

/**
 * Reads a value of one type from a row or struct, null where it is null: Spark's accessor for
 * the type, made once. `InternalRow.get(i, type)` finds the type's physical form on every
 * call, which in Spark 4.2 reads the session's SQL conf each time (a new conf object on an
 * executor thread): most of what a value read cost (docs/platform-notes.md, "Two costs of Spark 4.2.0 code").
 */
@FunctionalInterface
interface Getter {
    Object get(SpecializedGetters row, int ordinal);

    static Getter of(DataType type) {
        scala.Function2<SpecializedGetters, Object, Object> read =
            InternalRow$.MODULE$.getAccessor(type, true);
        return (row, ordinal) -> read.apply(row, ordinal);
    }

    static Getter[] of(DataType[] types) {
        Getter[] out = new Getter[types.length];
        for (int i = 0; i < types.length; i++) out[i] = of(types[i]);
        return out;
    }
}
