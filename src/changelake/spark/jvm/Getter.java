package changelake.jvm;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.InternalRow$;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Reads a value of one type from a row or struct, null where it is null: Spark's accessor for
 * the type, made once. `InternalRow.get(i, type)` finds the type's physical form on every
 * call, which in Spark 4.2 reads the session's SQL conf each time (a new conf object on an
 * executor thread): most of what a value read cost (docs/platform-notes.md, "Two costs of
 * Spark 4.2.0 code").
 */
@FunctionalInterface
interface Getter {
    Object get(SpecializedGetters row, int ordinal);

    /**
     * The value, copied out of the row's buffer where it points into it (a string, a decimal,
     * a struct, an array, a map): what outlives the row, whose buffer the input may reuse.
     */
    default Object copy(SpecializedGetters row, int ordinal) {
        Object value = get(row, ordinal);
        if (value instanceof UTF8String s) return s.clone();
        if (value instanceof Decimal d) return d.clone();
        if (value instanceof InternalRow r) return r.copy();
        if (value instanceof ArrayData a) return a.copy();
        if (value instanceof MapData m) return m.copy();
        return value;
    }

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
