"""The documentation site builds (`mkdocs build --strict`: a broken link, a missing anchor, a
page left out of the nav or a bad API reference fails it), and its command reference has an
entry for every command and option of the click group, so a new option without one fails
here. Also the README's links, and the search index a reader's search box uses."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from tests.support.devtools import Page

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once, strictly, into a temporary directory (a few seconds)."""
    assert MKDOCS.exists(), "mkdocs is in the `docs` extra that scripts/install.sh installs"
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([str(MKDOCS), "build", "--strict", "--quiet", "-f",
                           str(ROOT / "mkdocs.yml"), "-d", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    return out


def walk(command: click.Command, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...],
                                                                         click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, (*path, name))


def sections(page: str) -> dict[str, str]:
    """The command reference's HTML cut at each command's heading (`id="changelake-..."`)."""
    cuts = [(m.start(), m.group(1)) for m in re.finditer(r'id="(changelake(?:-[\w-]+)?)"',
                                                         page)]
    return {name: page[start: (cuts[i + 1][0] if i + 1 < len(cuts) else len(page))]
            for i, (start, name) in enumerate(cuts)}


def test_the_site_builds_strictly(site: Path) -> None:
    for page in ("index.html", "getting-started/index.html", "reference/cli/index.html",
                 "reference/python/index.html", "guides/debezium/index.html",
                 "platform-notes/index.html", "security/index.html"):
        assert (site / page).is_file(), page
    # mkdocstrings rendered the public API from the docstrings
    api = (site / "reference" / "python" / "index.html").read_text()
    for name in ("changelake.protocol.Writer", "changelake.spark.decode",
                 "changelake.lake.catalog.Lake", "changelake.kafka.write_topic"):
        assert f'id="{name}"' in api, name


def test_every_command_and_option_has_a_reference_entry(site: Path) -> None:
    from changelake.cli import main

    page = html.unescape((site / "reference" / "cli" / "index.html").read_text())
    found = sections(page)
    missing = []
    for path, command in walk(main, ("changelake",)):
        anchor = "-".join(path)
        if anchor not in found:
            missing.append(" ".join(path))
            continue
        text = found[anchor]
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                missing.extend(f"{' '.join(path)} {opt}" for opt in
                               (*param.opts, *param.secondary_opts) if opt not in text)
        first_line = (command.help or "").split("\n")[0].strip()
        if first_line and first_line[:40] not in " ".join(text.split()):
            missing.append(f"{' '.join(path)}: its help text")
    assert not missing, f"no reference entry for: {missing}"


def test_the_search_index_finds_the_frontier(site: Path) -> None:
    """What the search box searches (Material's lunr index) holds the concepts page's
    sections on the frontier."""
    index = json.loads((site / "search" / "search_index.json").read_text())
    hits = [d["location"] for d in index["docs"] if "frontier" in d["text"].lower()]
    assert any(h.startswith("concepts/") for h in hits), hits[:10]


def test_the_readmes_links_lead_somewhere() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), target


def test_the_readme_still_opens_with_the_two_set_up_commands() -> None:
    """CI and the issue's reader take the first two commands from lines 3-6."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[2] == "```bash" and lines[5] == "```"
    assert lines[3].startswith("bash scripts/install.sh && .venv/bin/changelake demo   #")
    assert lines[4].startswith(".venv/bin/pytest ")


def test_each_commands_help_gives_an_example_and_its_docs_page() -> None:
    """`changelake --help` and each command's `--help` read like the reference's first
    paragraph: what it does, an example (of real options), and the docs page to read."""
    from changelake.cli import main

    for path, command in walk(main, ("changelake",)):
        text = command.help or ""
        assert "Example" in text, f"{' '.join(path)}: no example in its help"
        pages = re.findall(r"docs/[\w/.-]+\.md", text)
        assert pages, f"{' '.join(path)}: no docs page in its help"
        for page in pages:
            assert (ROOT / page).is_file(), f"{' '.join(path)}: {page}"
        shown = re.split(r"\n\s*(?:Guide|Docs)", text.split("Example", 1)[1])[0]
        example = " ".join(line.strip().rstrip("\\") for line in shown.splitlines()[1:])
        for line in re.split(r"(?=\bchangelake )", example):
            words = line.split()
            if not words:
                continue
            cmd: click.Command = main
            rest = words[1:]
            while isinstance(cmd, click.Group):
                cmd = cmd.commands[rest.pop(0)]
            known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
            given = {w for w in rest if w.startswith("--")}
            assert given <= known, f"{' '.join(path)}: {sorted(given - known)}"


def test_the_readmes_anchors_into_the_docs_exist(site: Path) -> None:
    """The README is not part of the site, so mkdocs does not check its links' anchors."""
    text = (ROOT / "README.md").read_text()
    for page, anchor in re.findall(r"\]\(docs/([^)#]+)\.md#([^)]+)\)", text):
        built = site / ("" if page == "index" else page) / "index.html"
        assert f'id="{anchor}"' in built.read_text(), f"docs/{page}.md#{anchor}"


# -- the site as a reader sees it: headless Chromium (Debian's `chromium`, which .ci/run
# installs) over the built pages served on 127.0.0.1

CHROMIUM = shutil.which("chromium")
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--window-size=1280,900", "--virtual-time-budget=15000"]
"""Without the background-networking flags Chromium keeps asking hosts this machine cannot
reach; the virtual time lets the page's scripts (search, Mermaid) finish before the dump."""

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (the search index is fetched by a script, which a
    file:// page may not do), stopped after."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    http.server.SimpleHTTPRequestHandler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def chromium(tmp_path: Path, *args: str) -> str:
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, *HEADLESS, f"--user-data-dir={tmp_path / 'profile'}",
                           *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def artifacts(tmp_path: Path) -> Path:
    """Where the screenshots are kept: `CHANGELAKE_TEST_ARTIFACTS` if set, else the test's
    temporary directory."""
    folder = Path(os.environ.get("CHANGELAKE_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@needs_chromium
@pytest.mark.parametrize("page", ["", "guides/debezium/"])
def test_a_page_renders_with_its_diagrams(served: str, tmp_path: Path, page: str) -> None:
    """The home page and a guide, screenshotted, and the home page's Mermaid diagram drawn by
    the runtime the site serves itself: nothing is fetched from a CDN."""
    shot = artifacts(tmp_path) / f"docs-{page.strip('/').replace('/', '-') or 'home'}.png"
    chromium(tmp_path, f"--screenshot={shot}", f"{served}/{page}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    dom = chromium(tmp_path, "--dump-dom", f"{served}/{page}")
    if page == "":
        # Material draws each diagram into a shadow root of a `div.mermaid` that replaces the
        # `pre.mermaid` holding its source; a source left as it is was never drawn.
        assert '<div class="mermaid">' in dom, dom[:3000]
        assert '<pre class="mermaid">' not in dom, dom[:3000]


@needs_chromium
def test_the_search_box_finds_frontier(served: str, tmp_path: Path) -> None:
    """The search box, given "frontier" (`?q=`, as a shared search link opens it), lists
    matching pages, the Concepts page among them."""
    # The search index is built by a web worker, on wall time, which a `--dump-dom` does not
    # wait for (it dumps when Chromium's virtual time runs out: on a loaded machine, before
    # the index). So the page is asked over the DevTools protocol until it lists results.
    browser = [a for a in HEADLESS if not a.startswith("--virtual-time-budget")]
    meta = "(document.querySelector('.md-search-result__meta') || {}).textContent || ''"
    assert CHROMIUM is not None
    with Page(CHROMIUM, [*browser, f"--user-data-dir={tmp_path / 'profile'}"],
              f"{served}/?q=frontier", tmp_path) as page:
        found = page.wait_for(f"/matching document/.test({meta}) && {meta}", 120)
        items = page.evaluate("Array.from(document.querySelectorAll("
                              "'.md-search-result__item'), e => e.textContent)")
        shown = page.evaluate(meta)
    counted = re.match(r"(\d+) matching document", found or "")
    assert counted and int(counted.group(1)) > 0, shown
    assert any("Concepts" in item for item in items), items[:3]
