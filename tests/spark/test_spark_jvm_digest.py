"""`changelake.spark.jvm._digest`: what the jar is built from, the module's `pom.xml` and JUnit
sources with the Java sources and PySpark's version; and `is_current`, which takes a packaged
jar in an installed package (no module) by its sources alone."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path
from typing import Any

from changelake.spark import jvm


def _module_copy(root: Path) -> Path:
    """A copy of the Maven module's pom and JUnit sources."""
    module = root / "spark-rules"
    shutil.copytree(jvm.MODULE / "src" / "test", module / "src" / "test")
    shutil.copy(jvm.MODULE / "pom.xml", module / "pom.xml")
    return module


def test_the_digest_covers_the_pom_and_the_junit_sources(tmp_path: Path) -> None:
    module = _module_copy(tmp_path)
    digest = jvm._digest(module)
    assert digest == jvm._digest()  # the same files, wherever the module is
    sources, _, rest = digest.partition("-")
    assert len(sources) == len(rest) == 16
    pom = module / "pom.xml"
    pom.write_text(pom.read_text().replace("</project>", "<!-- changed --></project>"))
    changed = jvm._digest(module)
    assert changed != digest and changed.startswith(sources + "-")
    shutil.copy(jvm.MODULE / "pom.xml", pom)
    assert jvm._digest(module) == digest
    test = next((module / "src" / "test").rglob("YdbLineTest.java"))
    test.write_text(test.read_text() + "\n")
    assert jvm._digest(module) not in (digest, changed)
    shutil.copy(next((jvm.MODULE / "src" / "test").rglob("YdbLineTest.java")), test)
    assert jvm._digest(module) == digest
    (test.parent / "MoreTest.java").write_text("class MoreTest {}\n")
    assert jvm._digest(module) != digest
    # without the module (an installed package): the sources' part alone
    assert jvm._digest(tmp_path / "none") == sources


def test_a_packaged_jar_is_current_by_its_sources_only_without_the_module() -> None:
    full = jvm._digest()
    sources = full.partition("-")[0]
    assert jvm.is_current(full, full)
    assert not jvm.is_current(f"{sources}-0000000000000000", full)  # another pom or tests
    assert not jvm.is_current(sources, full)
    assert not jvm.is_current(None, full)
    assert jvm.is_current(full, sources)  # installed: no module to tell the rest by
    assert jvm.is_current(sources, sources)
    assert not jvm.is_current("0000000000000000-" + full.partition("-")[2], sources)


def test_an_installed_package_takes_its_jar_without_a_module(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    """No module beside the package, no Maven, no JDK: the packaged jar the checkout built
    (its digest with the module's part) is taken."""
    packaged = tmp_path / "packaged.jar"
    with zipfile.ZipFile(packaged, "w") as out:
        out.writestr("META-INF/MANIFEST.MF", f"Manifest-Version: 1.0\n"
                                             f"{jvm.DIGEST_ATTRIBUTE}: {jvm._digest()}\n")
    monkeypatch.setattr(jvm, "PACKAGED", packaged)
    monkeypatch.setattr(jvm, "MODULE", tmp_path / "no-module")
    monkeypatch.setattr(jvm, "_folder", lambda: tmp_path / "built")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert jvm.jar() == packaged
    assert not (tmp_path / "built").exists()
