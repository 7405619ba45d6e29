package dev.changelake.debezium;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.JsonByteArray;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.ReentrantLock;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * changelake's Debezium runner: Debezium's embedded engine (any source connector on the class
 * path; changelake runs the PostgreSQL one) writing its change events to Kafka, as a Kafka
 * Connect worker would, with one rule of changelake's: nothing is acknowledged to the source
 * before Kafka holds it. Each batch the engine hands over is sent with an idempotent producer
 * ({@code acks=all}), flushed, and every send checked, before the batch is marked processed;
 * only then may the engine store its offsets (a file, made durable by
 * {@link DurableFileOffsetStore}) and confirm the position to the database (PostgreSQL: the
 * replication slot). A kill at any point re-sends at most the batches after the last stored
 * offsets: duplicates, never a gap.
 *
 * <pre>
 * java -cp 'JARS/*' dev.changelake.debezium.Runner --properties FILE --bootstrap HOST:PORT
 *      --state DIR [--schemas true|false] [--partitions N] [--producer-properties FILE]
 * </pre>
 *
 * <ul>
 *   <li>{@code --properties FILE}: Debezium's own properties ({@code connector.class},
 *       {@code database.*}, {@code topic.prefix}, {@code slot.name}, ...), the password
 *       included: a file, so no secret is on the command line.</li>
 *   <li>{@code --bootstrap}: the Kafka cluster.</li>
 *   <li>{@code --state DIR}: where the offsets are kept ({@code DIR/offsets.dat}); the same
 *       folder on a restart resumes from them.</li>
 *   <li>{@code --schemas}: the JSON converter's {@code schemas.enable} for keys and values
 *       (default true: every event carries its Kafka Connect schema).</li>
 *   <li>{@code --partitions N}: a topic this runner creates (at the first event for it) gets N
 *       partitions; 0 leaves topics to the broker's automatic creation. Default 1.</li>
 *   <li>{@code --producer-properties FILE}: more producer settings (security, ...); the
 *       durability settings above cannot be overridden.</li>
 * </ul>
 *
 * <p>On stdout, one line per event of the runner's life ({@code changelake-debezium: started},
 * {@code ... polling}, {@code ... streaming} once the initial snapshot is sent and the log is
 * read, {@code ... stopped}); Debezium's and Kafka's log on stderr. SIGTERM lets the batch in
 * flight finish (sent, acknowledged, its offsets stored), hands no further batch to Kafka, and
 * stops the engine: the offsets stored are those of everything Kafka holds. Exit status 0
 * after a stop, 1 when the engine failed, 2 for a bad command line.
 */
public final class Runner {
    private static final PrintStream OUT = System.out;

    private Runner() {}

    public static void main(String[] args) throws Exception {
        Map<String, String> options;
        try {
            options = Options.parse(args);
        } catch (IllegalArgumentException e) {
            System.err.println("changelake-debezium: " + e.getMessage());
            System.exit(2);
            return;
        }
        Path state = Path.of(options.get("state")).toAbsolutePath();
        Files.createDirectories(state);
        Properties engineProps = load(Path.of(options.get("properties")));
        String schemas = options.getOrDefault("schemas", "true");
        engineProps.setProperty("offset.storage", DurableFileOffsetStore.class.getName());
        engineProps.setProperty("offset.storage.file.filename",
                state.resolve("offsets.dat").toString());
        engineProps.putIfAbsent("offset.flush.interval.ms", "0");
        engineProps.putIfAbsent("name", "changelake-debezium");
        for (String side : List.of("key", "value")) {
            engineProps.setProperty(side + ".converter.schemas.enable", schemas);
        }
        engineProps.setProperty("converter.schemas.enable", schemas);

        Properties producerProps = new Properties();
        if (options.containsKey("producer-properties")) {
            producerProps.putAll(load(Path.of(options.get("producer-properties"))));
        }
        producerProps.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, options.get("bootstrap"));
        producerProps.setProperty(ProducerConfig.ACKS_CONFIG, "all");
        producerProps.setProperty(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        producerProps.putIfAbsent(ProducerConfig.LINGER_MS_CONFIG, "5");
        producerProps.putIfAbsent(ProducerConfig.CLIENT_ID_CONFIG, "changelake-debezium");
        int partitions = Integer.parseInt(options.getOrDefault("partitions", "1"));

        CountDownLatch closed = new CountDownLatch(1);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(
                producerProps, new ByteArraySerializer(), new ByteArraySerializer());
             Admin admin = partitions > 0 ? Admin.create(adminProps(producerProps)) : null) {
            run(engineProps, new Sender(producer, admin, partitions), closed);
        } finally {
            closed.countDown();
        }
    }

    private static void run(Properties engineProps, Sender sender, CountDownLatch closed)
            throws InterruptedException {
        CountDownLatch done = new CountDownLatch(1);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        AtomicReference<Boolean> succeeded = new AtomicReference<>(true);
        DebeziumEngine<ChangeEvent<byte[], byte[]>> engine = DebeziumEngine
                .create(JsonByteArray.class)
                .using(engineProps)
                .using(new DebeziumEngine.ConnectorCallback() {
                    @Override
                    public void taskStarted() {
                        say("started");
                    }

                    @Override
                    public void pollingStarted() {
                        say("polling");
                    }
                })
                .using((success, message, error) -> {
                    succeeded.set(success);
                    failure.set(error);
                    if (!success) {
                        System.err.println("changelake-debezium: engine failed: " + message);
                        if (error != null) {
                            error.printStackTrace(System.err);
                        }
                    }
                    done.countDown();
                })
                .notifying(sender)
                .build();
        Thread hook = new Thread(() -> {
            try {
                sender.close();
                engine.close();
                done.await(60, TimeUnit.SECONDS);
            } catch (IOException | InterruptedException e) {
                System.err.println("changelake-debezium: stop: " + e);
            }
            try {
                closed.await(30, TimeUnit.SECONDS);  // the producer closed by main
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            say("stopped");
            // A stop asked for and done is a success, not the signal's 143.
            Runtime.getRuntime().halt(0);
        }, "changelake-debezium-stop");
        Runtime.getRuntime().addShutdownHook(hook);
        Thread watch = new Thread(() -> watchStreaming(done), "changelake-debezium-watch");
        watch.setDaemon(true);
        watch.start();
        engine.run();
        done.await();
        if (!succeeded.get() || failure.get() != null) {
            Runtime.getRuntime().removeShutdownHook(hook);
            say("failed");
            System.exit(1);
        }
    }

    /**
     * Says "streaming" once the connector reads the database's log: its initial snapshot (if
     * any) is sent. The engine's callbacks say only that polling began, which is before the
     * snapshot; Debezium's streaming metrics (JMX, {@code context=streaming}) say
     * {@code Connected} once the stream is open.
     */
    private static void watchStreaming(CountDownLatch done) {
        javax.management.MBeanServer server =
                java.lang.management.ManagementFactory.getPlatformMBeanServer();
        try {
            javax.management.ObjectName pattern = new javax.management.ObjectName(
                    "debezium.*:type=connector-metrics,context=streaming,*");
            while (done.getCount() > 0) {
                for (javax.management.ObjectName name : server.queryNames(pattern, null)) {
                    try {
                        if (Boolean.TRUE.equals(server.getAttribute(name, "Connected"))) {
                            say("streaming");
                            return;
                        }
                    } catch (javax.management.JMException e) {
                        // not registered yet, or gone: look again
                    }
                }
                Thread.sleep(100);
            }
        } catch (javax.management.MalformedObjectNameException | InterruptedException e) {
            System.err.println("changelake-debezium: watch: " + e);
        }
    }

    /** Sends each batch to Kafka and marks it processed only once Kafka has acknowledged it. */
    static final class Sender implements DebeziumEngine.ChangeConsumer<ChangeEvent<byte[], byte[]>> {
        private final KafkaProducer<byte[], byte[]> producer;
        private final Admin admin;
        private final int partitions;
        private final Set<String> known = new HashSet<>();
        /** Held while a batch is sent and marked; {@link #close()} waits for it. */
        private final ReentrantLock batch = new ReentrantLock();
        private volatile boolean closed;

        Sender(KafkaProducer<byte[], byte[]> producer, Admin admin, int partitions) {
            this.producer = producer;
            this.admin = admin;
            this.partitions = partitions;
        }

        @Override
        public boolean supportsTombstoneEvents() {
            return true;
        }

        @Override
        public void handleBatch(List<ChangeEvent<byte[], byte[]>> records,
                                DebeziumEngine.RecordCommitter<ChangeEvent<byte[], byte[]>> committer)
                throws InterruptedException {
            batch.lockInterruptibly();
            try {
                if (!closed) {
                    send(records, committer);
                }
                // Closed: nothing of this batch is sent or marked; the next start sends it.
            } finally {
                batch.unlock();
            }
        }

        /**
         * Waits (up to a minute) for the batch in flight to be sent and marked, so that its
         * offsets are stored before the engine stops, and refuses every later batch.
         */
        void close() throws InterruptedException {
            boolean held = batch.tryLock(60, TimeUnit.SECONDS);
            closed = true;
            if (held) {
                batch.unlock();
            }
        }

        private void send(List<ChangeEvent<byte[], byte[]>> records,
                          DebeziumEngine.RecordCommitter<ChangeEvent<byte[], byte[]>> committer)
                throws InterruptedException {
            List<Future<RecordMetadata>> sent = new ArrayList<>(records.size());
            for (ChangeEvent<byte[], byte[]> record : records) {
                String topic = record.destination();
                ensureTopic(topic);
                RecordHeaders headers = new RecordHeaders();
                for (io.debezium.engine.Header<?> header : record.headers()) {
                    Object value = header.getValue();
                    headers.add(header.getKey(), value == null ? null
                            : value instanceof byte[] bytes ? bytes
                            : value.toString().getBytes(StandardCharsets.UTF_8));
                }
                sent.add(producer.send(new ProducerRecord<>(topic, record.partition(), null,
                        record.key(), record.value(), headers)));
            }
            producer.flush();
            for (Future<RecordMetadata> future : sent) {
                try {
                    future.get();
                } catch (ExecutionException e) {
                    // Nothing of this batch is marked: the engine stops without storing its
                    // offsets, and a restart sends the batch again.
                    throw new IllegalStateException("Kafka did not acknowledge a record: "
                            + e.getCause(), e.getCause());
                }
            }
            for (ChangeEvent<byte[], byte[]> record : records) {
                committer.markProcessed(record);
            }
            committer.markBatchFinished();
        }

        private void ensureTopic(String topic) throws InterruptedException {
            if (admin == null || known.contains(topic)) {
                return;
            }
            try {
                admin.createTopics(List.of(new NewTopic(topic, partitions, (short) -1)))
                        .all().get(60, TimeUnit.SECONDS);
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof TopicExistsException)) {
                    throw new IllegalStateException("cannot create topic " + topic + ": "
                            + e.getCause(), e.getCause());
                }
            } catch (java.util.concurrent.TimeoutException e) {
                throw new IllegalStateException("cannot create topic " + topic + ": timed out", e);
            }
            known.add(topic);
        }
    }

    private static Properties adminProps(Properties producerProps) {
        Properties admin = new Properties();
        for (String name : producerProps.stringPropertyNames()) {
            if (name.equals(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG) || name.startsWith("security.")
                    || name.startsWith("sasl.") || name.startsWith("ssl.")) {
                admin.setProperty(name, producerProps.getProperty(name));
            }
        }
        admin.setProperty("client.id", "changelake-debezium-admin");
        return admin;
    }

    private static Properties load(Path path) throws IOException {
        Properties props = new Properties();
        try (InputStream in = Files.newInputStream(path)) {
            props.load(in);
        }
        return props;
    }

    private static void say(String what) {
        OUT.println("changelake-debezium: " + what);
        OUT.flush();
    }

    /** The command line: {@code --name value} pairs, names checked. */
    static final class Options {
        private static final Set<String> NAMES = Set.of("properties", "bootstrap", "state",
                "schemas", "partitions", "producer-properties");
        private static final Set<String> REQUIRED = Set.of("properties", "bootstrap", "state");

        static Map<String, String> parse(String[] args) {
            Map<String, String> out = new java.util.HashMap<>();
            for (int i = 0; i < args.length; i += 2) {
                String name = args[i].startsWith("--") ? args[i].substring(2) : "";
                if (!NAMES.contains(name)) {
                    throw new IllegalArgumentException("unknown option " + args[i]
                            + "; options: --" + String.join(", --", NAMES));
                }
                if (i + 1 >= args.length) {
                    throw new IllegalArgumentException(args[i] + " needs a value");
                }
                out.put(name, args[i + 1]);
            }
            for (String name : REQUIRED) {
                if (!out.containsKey(name)) {
                    throw new IllegalArgumentException("--" + name + " is required");
                }
            }
            String schemas = out.getOrDefault("schemas", "true");
            if (!schemas.equals("true") && !schemas.equals("false")) {
                throw new IllegalArgumentException("--schemas is true or false, not " + schemas);
            }
            try {
                if (Integer.parseInt(out.getOrDefault("partitions", "1")) < 0) {
                    throw new NumberFormatException();
                }
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("--partitions is a number, 0 or more");
            }
            return out;
        }
    }
}
