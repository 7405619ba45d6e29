"""Headless Chromium driven over the DevTools protocol on a pipe, for what a page's scripts do
on wall time: `--dump-dom` dumps when Chromium's virtual time runs out, and a web worker (the
docs site's search index) works on wall time, so on a loaded machine a dump comes before it.

`--remote-debugging-pipe`: the browser reads the protocol's JSON messages, each ending in a
NUL byte, from its file descriptor 3 and writes its own to 4 (the bash that starts it puts
the pipes there: no `preexec_fn` in a test process that has threads).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

REPLY_SECONDS = 60
"""How long a message to the browser may wait for its reply."""


def _above(fd: int, least: int) -> int:
    """`fd` moved to a descriptor number of at least `least`."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, least)  # `pass_fds` hands it on
    os.close(fd)
    return moved


class Page:
    """One page opened in a headless Chromium of its own; `evaluate` runs a JavaScript
    expression in it and returns its value. Close it (`with`)."""

    def __init__(self, chromium: str, args: list[str], url: str, cwd: Path) -> None:
        browser_reads, to_browser = os.pipe()  # its fd 3
        from_browser, browser_writes = os.pipe()  # its fd 4
        # Above 4, so that putting them at 3 and 4 moves no other.
        browser_reads, browser_writes = (_above(fd, 10) for fd in (browser_reads, browser_writes))
        script = (f'exec "$0" "$@" 3<&{browser_reads} 4>&{browser_writes} '
                  f'{browser_reads}<&- {browser_writes}>&-')
        self._process = subprocess.Popen(
            ["bash", "-c", script, chromium, *args, "--remote-debugging-pipe", url],
            pass_fds=(browser_reads, browser_writes), cwd=cwd,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(browser_reads)
        os.close(browser_writes)
        self._out = os.fdopen(to_browser, "wb", buffering=0)
        self._in = os.fdopen(from_browser, "rb", buffering=0)
        self._pending = b""
        self._id = 0
        try:
            targets = self._call("Target.getTargets")["targetInfos"]
            page = next(t for t in targets if t["type"] == "page")
            self._session = self._call(
                "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True}
            )["sessionId"]
        except BaseException:
            self.close()
            raise

    def _call(self, method: str, params: dict[str, Any] | None = None,
              session: str | None = None) -> dict[str, Any]:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        while True:  # events and other replies until this one's
            while b"\0" not in self._pending:
                if not select.select([self._in], [], [], REPLY_SECONDS)[0]:
                    raise RuntimeError(f"Chromium did not answer {method} in {REPLY_SECONDS} s")
                chunk = self._in.read(1 << 16)
                if not chunk:
                    raise RuntimeError(f"Chromium closed its pipe during {method}")
                self._pending += chunk
            raw, self._pending = self._pending.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str) -> Any:
        result = self._call("Runtime.evaluate",
                            {"expression": expression, "returnByValue": True}, self._session)
        return result["result"].get("value")

    def wait_for(self, expression: str, seconds: float) -> Any:
        """The first truthy value of `expression`, evaluated every quarter second for up to
        `seconds` of wall time; the last value if none was."""
        deadline = time.monotonic() + seconds
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() >= deadline:
                return value
            time.sleep(0.25)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self._call("Browser.close")
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._out.close()
        self._in.close()

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
