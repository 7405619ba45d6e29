package changelake.jvm;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.PosixFilePermission;
import java.security.MessageDigest;
import java.util.Set;
import javax.security.sasl.AuthenticationException;
import org.apache.hive.service.auth.PasswdAuthenticationProvider;

/**
 * The password check of `changelake sql --password-file FILE`: HiveServer2's CUSTOM
 * authentication (`hive.server2.custom.authentication.class`) with a password kept in a file.
 *
 * The promise: a client's connection is accepted when the password it sends equals the file's
 * first line (without its line end), whatever user name it gives; refused otherwise, and
 * refused if the file (named by the system property `PROPERTY`) cannot be read, is empty, or
 * can be read or written by anyone but its owner. The file is read at each connection (the
 * server makes one of these per attempt), so a changed password takes effect at once; the
 * comparison takes the same time wherever the two differ.
 */
public final class PasswordFile implements PasswdAuthenticationProvider {
  public static final String PROPERTY = "changelake.sql.password.file";

  @Override
  public void Authenticate(String user, String password) throws AuthenticationException {
    String name = System.getProperty(PROPERTY);
    if (name == null || name.isEmpty()) {
      throw new AuthenticationException("changelake sql: no password file is set");
    }
    byte[] expected = expected(Paths.get(name));
    byte[] given = (password == null ? "" : password).getBytes(StandardCharsets.UTF_8);
    if (!MessageDigest.isEqual(expected, given)) {
      throw new AuthenticationException("changelake sql: wrong password for user " + user);
    }
  }

  private static byte[] expected(Path path) throws AuthenticationException {
    try {
      Set<PosixFilePermission> mode = Files.getPosixFilePermissions(path);
      for (PosixFilePermission p : mode) {
        if (p.name().startsWith("GROUP") || p.name().startsWith("OTHERS")) {
          throw new AuthenticationException("changelake sql: the password file is open to "
              + "others; refusing every connection");
        }
      }
      if (!Files.isRegularFile(path)) {
        throw new AuthenticationException("changelake sql: the password file is no file");
      }
      String text = new String(Files.readAllBytes(path), StandardCharsets.UTF_8);
      int end = text.indexOf('\n');
      String line = end < 0 ? text : text.substring(0, end);
      if (line.endsWith("\r")) {
        line = line.substring(0, line.length() - 1);
      }
      if (line.isEmpty()) {
        throw new AuthenticationException("changelake sql: the password file is empty");
      }
      return line.getBytes(StandardCharsets.UTF_8);
    } catch (AuthenticationException e) {
      throw e;  // an IOException too: its own reason, not "cannot be read"
    } catch (IOException | UnsupportedOperationException e) {
      throw new AuthenticationException("changelake sql: the password file cannot be read");
    }
  }
}
