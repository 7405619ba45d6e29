package dev.changelake.debezium;

import io.debezium.embedded.KafkaConnectUtil;
import java.io.File;
import java.io.IOException;
import java.lang.reflect.Field;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.runtime.WorkerConfig;
import org.apache.kafka.connect.storage.FileOffsetBackingStore;

/**
 * Kafka Connect's file offset store, made durable: each save is written to a temporary file,
 * forced to disk and renamed over the offsets file (then the folder is forced), so a kill or a
 * power cut leaves the previous offsets or the new ones, never a truncated file.
 *
 * <p>{@link FileOffsetBackingStore#save()} truncates the offsets file and writes it in place,
 * without fsync; a kill in that window leaves a short file, which its loader reads as "no
 * offsets" (an EOF), and the connector would take its initial snapshot again. Here the parent
 * reads and writes {@code <file>.tmp} and this class moves it into place; the file's format is
 * the parent's (a serialized map), so either store reads the other's file.
 */
public final class DurableFileOffsetStore extends FileOffsetBackingStore {
    private Path target;
    private Path scratch;

    public DurableFileOffsetStore() {
        super(KafkaConnectUtil.converterForOffsetStore());
    }

    @Override
    public void configure(WorkerConfig config) {
        super.configure(config);
        try {
            Field field = FileOffsetBackingStore.class.getDeclaredField("file");
            field.setAccessible(true);
            target = ((File) field.get(this)).toPath().toAbsolutePath();
            scratch = target.resolveSibling(target.getFileName() + ".tmp");
            field.set(this, scratch.toFile());
        } catch (ReflectiveOperationException e) {
            throw new ConnectException("cannot redirect the file offset store", e);
        }
    }

    @Override
    public synchronized void start() {
        try {
            // The parent loads the scratch file: a copy of the durable one, or nothing.
            if (Files.exists(target)) {
                Files.copy(target, scratch, StandardCopyOption.REPLACE_EXISTING);
            } else {
                Files.deleteIfExists(scratch);
            }
        } catch (IOException e) {
            throw new ConnectException("cannot read the offsets file " + target, e);
        }
        super.start();
    }

    @Override
    protected void save() {
        super.save();
        try {
            try (FileChannel channel = FileChannel.open(scratch, StandardOpenOption.WRITE)) {
                channel.force(true);
            }
            Files.move(scratch, target, StandardCopyOption.ATOMIC_MOVE,
                    StandardCopyOption.REPLACE_EXISTING);
            try (FileChannel folder = FileChannel.open(target.getParent(),
                    StandardOpenOption.READ)) {
                folder.force(true);
            }
        } catch (IOException e) {
            throw new ConnectException("cannot store the offsets in " + target, e);
        }
    }
}
