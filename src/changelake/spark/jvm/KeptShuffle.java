package changelake.jvm;

import org.apache.spark.Dependency;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkException;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.Dataset$;
import org.apache.spark.sql.execution.LogicalRDD;
import org.apache.spark.sql.execution.LogicalRDD$;
import org.apache.spark.sql.execution.QueryExecution;
import org.apache.spark.sql.execution.SQLExecution;
import org.apache.spark.sql.execution.SparkPlan;
import scala.Option;

/**
 * A DataFrame whose plan ends in a shuffle, run as far as the shuffle's map side once, and
 * read from the map side's output by every later job.
 *
 * The promise: `keep(frame)` runs the map side of `frame`'s last shuffle (its rows hashed
 * and written as shuffle files by partition, nothing more) in one job, and returns a
 * DataFrame of the same schema and rows whose plan starts at those files: no later job runs
 * the plan below the shuffle again, and each reads the partitions it needs. The frame says
 * it is partitioned as the shuffle made it (its `HashPartitioning`), so a later step that
 * needs those partitions (a `repartition` by the same columns into as many partitions, an
 * aggregate by them: both tested) takes them as they are, with no shuffle of its own. The
 * job is a SQL execution of `frame`'s own plan, so its observations (`DataFrame.observe`,
 * below the shuffle) are reported as an action's are.
 *
 * Why: a changefeed batch's parsed rows used to be stored (`StoredRows`) by one job, and read
 * back by the conversion's, whose map side shuffled them by key. Here the parse's job is
 * that map side: the rows are written once, as the shuffle's files, not also as a store of
 * their own, and read once, by the conversion's reduce side.
 *
 * The shuffle files live as long as the returned frame does (Spark's context cleaner removes
 * them when no plan refers to the shuffle any more); a lost executor's are made again from
 * the plan, which must therefore give the same rows again (a parse of files does).
 *
 * The frame must be planned without adaptive execution (its last shuffle is then the plan's
 * top, and its partition count is the one asked for): `IllegalArgumentException` otherwise.
 */
public final class KeptShuffle {
    private KeptShuffle() {}

    /** `frame`, its last shuffle's map side run (see the class comment). */
    public static Dataset<Row> keep(Dataset<Row> frame) {
        QueryExecution plan = frame.queryExecution();
        SparkPlan executed = plan.executedPlan();
        SparkContext context = frame.sparkSession().sparkContext();
        RDD<InternalRow> rows = SQLExecution.withNewExecutionId(plan, Option.apply("kept shuffle"),
            () -> {
                RDD<InternalRow> output = executed.execute();
                ShuffleDependency<?, ?, ?> shuffle = lastShuffle(output);
                if (shuffle.rdd().partitions().length > 0) {  // Spark runs no stage of none
                    mapSide(context, shuffle);
                }
                return output;
            });
        LogicalRDD relation = LogicalRDD$.MODULE$.fromDataset(rows, frame, false);
        return Dataset$.MODULE$.ofRows(frame.sparkSession(), relation);
    }

    /** Runs the map side; a failed job's `SparkException` reaches the caller as an action's
     * does (thrown as it is, though the body of an execution may declare none). */
    private static <K, V, C> void mapSide(SparkContext context, ShuffleDependency<K, V, C> shuffle) {
        try {
            context.submitMapStage(shuffle).get();
        } catch (SparkException failed) {
            KeptShuffle.<RuntimeException>rethrow(failed);
        }
    }

    @SuppressWarnings("unchecked")
    private static <E extends Throwable> void rethrow(Throwable failed) throws E {
        throw (E) failed;
    }

    /** The shuffle that `output`'s partitions read, through narrow steps only. */
    private static ShuffleDependency<?, ?, ?> lastShuffle(RDD<?> output) {
        RDD<?> at = output;
        while (true) {
            scala.collection.immutable.Seq<Dependency<?>> dependencies = at.dependencies();
            if (dependencies.size() != 1) {
                throw new IllegalArgumentException(
                    "the frame's plan does not end in one shuffle: " + output.toDebugString());
            }
            Dependency<?> dependency = dependencies.head();
            if (dependency instanceof ShuffleDependency<?, ?, ?> shuffle) {
                return shuffle;
            }
            at = dependency.rdd();
        }
    }
}
