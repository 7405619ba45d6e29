"""`changelake.spark.jvm.jar()`: the packaged jar where its recorded digest is the sources',
else one Maven builds for them, once; one error line where it cannot be built.

Real Maven, real JDK, no stand-ins: the environment each test changes is PATH, JAVA_HOME and
where the jar and the module are (`PACKAGED`, `MODULE`, `_folder`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from changelake.errors import ChangelakeError
from changelake.spark import jvm


def _jar_recording(path: Path, digest: str) -> Path:
    """A jar whose manifest records `digest` (no classes: `jar()` reads the manifest only)."""
    with zipfile.ZipFile(path, "w") as out:
        out.writestr("META-INF/MANIFEST.MF",
                     f"Manifest-Version: 1.0\n{jvm.DIGEST_ATTRIBUTE}: {digest}\n")
    return path


def _broken_module(root: Path) -> Path:
    """A copy of the Maven module whose sources (`../../src/changelake/spark/jvm` of it) are
    one class that does not compile."""
    module = root / "jvm" / "spark-rules"
    module.mkdir(parents=True)
    shutil.copy(jvm.MODULE / "pom.xml", module / "pom.xml")
    sources = root / "src" / "changelake" / "spark" / "jvm"
    sources.mkdir(parents=True)
    (sources / "Broken.java").write_text("package changelake.jvm; class Broken { int x = ; }\n")
    return module


def test_a_current_packaged_jar_is_taken_without_maven_or_a_jdk(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Its recorded digest is the sources': taken as it is, with no Maven and no JDK on the
    machine (nothing is run)."""
    packaged = _jar_recording(tmp_path / "packaged.jar", jvm._digest())
    monkeypatch.setattr(jvm, "PACKAGED", packaged)
    monkeypatch.setattr(jvm, "_folder", lambda: tmp_path / "built")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert jvm.jar() == packaged
    assert not (tmp_path / "built").exists()


def test_a_stale_jar_is_built_by_maven_once_and_then_taken(tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    """A packaged jar of other sources: `jar()` builds one with Maven into the environment's
    folder, named by the digest it records; a second call takes it without running anything;
    and a packaged jar that is current again is taken before it."""
    packaged = _jar_recording(tmp_path / "packaged.jar", "0000000000000000")
    monkeypatch.setattr(jvm, "PACKAGED", packaged)
    monkeypatch.setattr(jvm, "_folder", lambda: tmp_path)
    built = jvm.jar()
    digest = jvm._digest()
    assert built == tmp_path / f"changelake-spark-rules-{digest}.jar"
    assert jvm.recorded_digest(built) == digest
    with zipfile.ZipFile(built) as archive:
        assert "changelake/jvm/DebeziumLine.class" in archive.namelist()
        assert not any(name.endswith("Test.class") for name in archive.namelist())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".build-")] == []
    inode = built.stat().st_ino
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no Maven: nothing is built again
    assert jvm.jar() == built and built.stat().st_ino == inode
    _jar_recording(packaged, digest)
    assert jvm.jar() == packaged


def test_without_maven_or_a_jdk_a_stale_jar_is_one_error_naming_what_is_missing(
        tmp_path: Path, monkeypatch: Any) -> None:
    mvn = shutil.which("mvn")
    assert mvn is not None, "the tests need Maven (mvn), as the install does"
    monkeypatch.setattr(jvm, "PACKAGED", tmp_path / "missing.jar")
    monkeypatch.setattr(jvm, "_folder", lambda: tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ChangelakeError, match=r"is missing\), which needs Maven \(`mvn`\)"
                       ) as raised:
        jvm.jar()
    assert "\n" not in str(raised.value)
    tools = tmp_path / "bin"  # Maven and nothing else: no javac anywhere
    tools.mkdir()
    (tools / "mvn").symlink_to(mvn)
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jre"))
    with pytest.raises(ChangelakeError, match=r"needs a JDK 17 or later \(`javac`\)") as raised:
        jvm.jar()
    assert "\n" not in str(raised.value)
    assert not list(tmp_path.glob("*.jar"))


def test_without_the_module_a_stale_jar_is_one_error(tmp_path: Path, monkeypatch: Any) -> None:
    """An installation without the Maven module (a wheel) whose jar is of other sources or
    another PySpark cannot build one: the error says to reinstall."""
    monkeypatch.setattr(jvm, "PACKAGED", _jar_recording(tmp_path / "old.jar", "0" * 16))
    monkeypatch.setattr(jvm, "MODULE", tmp_path / "no-module")
    monkeypatch.setattr(jvm, "_folder", lambda: tmp_path)
    with pytest.raises(ChangelakeError, match=r"is of other sources, another pom.xml or JUnit "
                       r"tests, or another PySpark \(digest 0{16}, not [0-9a-f]{16}\)\), and "
                       r"the Maven module .* is not there: reinstall changelake"):
        jvm.jar()


def test_a_failed_build_is_one_error_with_mavens_first_error(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    """Maven refusing the sources (offline, as `jar()` first builds): one line naming the
    file and javac's error, not tried again online, and no jar."""
    monkeypatch.setattr(jvm, "PACKAGED", tmp_path / "missing.jar")
    monkeypatch.setattr(jvm, "MODULE", _broken_module(tmp_path / "checkout"))
    monkeypatch.setattr(jvm, "_folder", lambda: tmp_path)
    with pytest.raises(ChangelakeError, match=r"with Maven failed: .*Broken\.java.*") as raised:
        jvm.jar()
    assert "\n" not in str(raised.value)
    assert not list(tmp_path.glob("*.jar"))


def test_a_failed_build_is_one_error_line_from_the_command_line(tmp_path: Path) -> None:
    """Through the CLI: the failed build is one `changelake: error:` line before Spark starts
    (the jar is required), not Python's traceback nor Maven's whole output."""
    source = tmp_path / "in.jsonl"
    source.write_text("\n")
    prefix = tmp_path / "env"  # a fresh environment folder: no jar built yet
    module = _broken_module(tmp_path / "checkout")
    run = ("import sys; from pathlib import Path; sys.prefix = sys.argv.pop(1); "
           "from changelake.spark import jvm; jvm.MODULE = Path(sys.argv.pop(1)); "
           "jvm.PACKAGED = Path(sys.argv.pop(1)); sys.argv[0] = 'changelake'; "
           "from changelake.cli import main; main()")
    done = subprocess.run(
        [sys.executable, "-c", run, str(prefix), str(module), str(tmp_path / "missing.jar"),
         "ingest", "--lake", str(tmp_path / "lake"), "--table", "t", "--master", "local[1]",
         str(source)], capture_output=True, text=True, timeout=300)
    [error] = done.stderr.splitlines()
    assert error.startswith("changelake: error: changelake's Spark path needs its jar, and "
                            "building it from its Java sources with Maven failed: ")
    assert "Broken.java" in error
    assert done.returncode == 2
    assert not list((prefix / "share" / "changelake").glob("*.jar"))


def test_processes_building_at_once_each_get_the_one_jar(tmp_path: Path) -> None:
    """Two processes that find the jar stale at once each build in a folder of their own and
    rename into place: both take the same path, which holds a whole jar of these sources, and
    no build folder is left."""
    prefix = tmp_path / "env"
    run = ("import sys; from pathlib import Path; sys.prefix = sys.argv[1]; "
           "from changelake.spark import jvm; jvm.PACKAGED = Path(sys.argv[2]); "
           "print(jvm.jar())")
    starts = [subprocess.Popen([sys.executable, "-c", run, str(prefix),
                                str(tmp_path / "missing.jar")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in starts]
    assert [p.returncode for p in starts] == [0, 0], [err for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    folder = prefix / "share" / "changelake"
    assert paths == {str(folder / f"changelake-spark-rules-{jvm._digest()}.jar")}
    assert jvm.recorded_digest(Path(paths.pop())) == jvm._digest()
    assert [p.name for p in folder.iterdir()] == [f"changelake-spark-rules-{jvm._digest()}.jar"]
