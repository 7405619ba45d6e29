package changelake.jvm;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import javax.security.sasl.AuthenticationException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** `PasswordFile`: the file's first line is the password, for any user; a file others may
 * read or write, an empty one, an unreadable one or none refuses every connection. */
class PasswordFileTest {
    @TempDir
    Path folder;

    @AfterEach
    void unset() {
        System.clearProperty(PasswordFile.PROPERTY);
    }

    Path file(String text, String mode) throws IOException {
        Path path = folder.resolve("password");
        Files.write(path, text.getBytes(StandardCharsets.UTF_8));
        Files.setPosixFilePermissions(path, PosixFilePermissions.fromString(mode));
        System.setProperty(PasswordFile.PROPERTY, path.toString());
        return path;
    }

    static void accepted(String user, String password) {
        assertDoesNotThrow(() -> new PasswordFile().Authenticate(user, password));
    }

    static String refused(String user, String password) {
        return assertThrows(AuthenticationException.class,
                            () -> new PasswordFile().Authenticate(user, password)).getMessage();
    }

    @Test
    void theFirstLineIsThePasswordForAnyUser() throws IOException {
        file("s3cret\nsecond line\n", "rw-------");
        accepted("anyone", "s3cret");
        accepted(null, "s3cret");
        assertTrue(refused("anyone", "s3cre").contains("wrong password"));
        refused("anyone", "s3cret\n");
        refused("anyone", "second line");
        refused("anyone", null);
    }

    @Test
    void aWindowsLineEndIsNotPartOfThePassword() throws IOException {
        file("pässwörd\r\n", "r--------");
        accepted("u", "pässwörd");
        refused("u", "pässwörd\r");
    }

    @Test
    void aChangedPasswordTakesEffectAtOnce() throws IOException {
        Path path = file("old", "rw-------");
        accepted("u", "old");
        Files.writeString(path, "new");
        refused("u", "old");
        accepted("u", "new");
    }

    @Test
    void aFileOpenToOthersRefusesEveryConnection() throws IOException {
        file("pw", "rw-r-----");
        assertTrue(refused("u", "pw").contains("open to others"));
        file("pw", "rw-----w-");
        assertTrue(refused("u", "pw").contains("open to others"));
    }

    @Test
    void anEmptyMissingOrUnsetFileRefusesEveryConnection() throws IOException {
        file("\nlater", "rw-------");
        assertTrue(refused("u", "").contains("is empty"));
        refused("u", "later");
        System.setProperty(PasswordFile.PROPERTY, folder.resolve("none").toString());
        assertTrue(refused("u", "").contains("cannot be read"));
        System.setProperty(PasswordFile.PROPERTY, folder.toString());  // a folder
        Files.setPosixFilePermissions(folder, PosixFilePermissions.fromString("rwx------"));
        assertTrue(refused("u", "").contains("no file"));
        System.clearProperty(PasswordFile.PROPERTY);
        assertTrue(refused("u", "pw").contains("no password file"));
    }
}
