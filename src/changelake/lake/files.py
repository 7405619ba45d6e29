"""The lake's own file operations on the driver (manifests, the commit pointer, writer locks,
leftovers removed), on a local directory or on any Hadoop FileSystem URI (`s3a://`,
`hdfs://`, ...): the one place `lake/` touches storage outside Spark's readers and writers.

Why one module of over 500 lines: every operation that differs between a local and a remote
lake, side by side, so that a change to one is made to the other (the remote reads without a
JVM included).

A lake location is either a local `Path` (a plain path, or a `file:` URI) or a `RemotePath`:
a URI with the few `pathlib.Path` methods the lake uses (`/`, `name`, `parent`, `exists`,
`is_dir`, `iterdir`, `glob`, `rglob`, `read_text`, `write_text`, `mkdir`, `unlink`, `stat`),
each a call to the Hadoop FileSystem of the running Spark session's JVM
(`Path(uri).getFileSystem(hadoopConfiguration)`), so the store's connector, settings and
credentials are Spark's own (`spark.hadoop.fs.s3a.*`, the AWS SDK's environment). Code that
takes a table directory works on either without asking which: only the operations below
differ.

* `replace_whole(path, text)`: a manifest or pointer written so that a reader sees the old
  content or the new, whole. Local: written beside it, synced, renamed over it, its directory
  synced (exactly as before this module). Remote: one PUT, which an object store makes
  visible whole, and durable once acknowledged (no fsync to do).
* `remove_tree(path)`: a leftover directory (or object prefix) removed, if there.
* `create_exclusive(path, text)`: the file made only if nothing is at `path`, atomically
  (`O_EXCL` locally; on S3 a conditional PUT, `If-None-Match: *`, which S3A 3.5 sends for
  `fs.option.create.conditional.overwrite`): the remote writer lock (`commit.writer_lock`).
* `parquet_source(path)`: what pyarrow opens as a Parquet file, read as pyarrow asks
  (a remote file is never held whole).
* `storage_options(path)`: delta-rs's settings for a Delta table at `path` (None: local),
  from the session's S3A settings and the AWS SDK's environment.

Errors of the remote store (unreachable, no such bucket, no credentials) are `StoreError`s:
one line naming the URI, with no secret in it.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

from changelake.durable import fsync_directory, local_path
from changelake.errors import LakeError
from changelake.redact import redact

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/]*)(/.*)?$")


class StoreError(LakeError):
    """A remote lake's store refused or could not be reached: one line naming the URI."""


def is_remote(location: object) -> bool:
    """Whether `location` (a path, URI or `RemotePath`) is on a store other than the local
    file system."""
    return isinstance(location, RemotePath) or local_path(str(location)) is None


def lake_root(location: str | Path | RemotePath) -> Path | RemotePath:
    """A lake location as given (`--lake`): a local directory resolved, or a remote URI."""
    if isinstance(location, RemotePath):
        return location
    local = local_path(str(location))
    if local is not None:
        return Path(local).resolve()
    return RemotePath(str(location))


class RemotePath:
    """A file or directory on a Hadoop FileSystem, named by its URI (see the module
    docstring). Immutable; compares by its URI."""

    __slots__ = ("uri",)

    def __init__(self, uri: str) -> None:
        found = _SCHEME.match(uri)
        if found is None or not found.group(2):
            raise LakeError(f"lake {redact(uri)}: not a URI of the form scheme://bucket/path")
        parts = [p for p in (found.group(3) or "").split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise LakeError(f"lake {redact(uri)}: a path with . or .. in it")
        self.uri = f"{found.group(1).lower()}://{found.group(2)}" + "".join(
            f"/{p}" for p in parts)

    # ---------------------------------------------------------------------- pure path ops

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"RemotePath({redact(self.uri)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __truediv__(self, part: str | PurePosixPath) -> RemotePath:
        return RemotePath(f"{self.uri}/{part}")

    @property
    def _authority(self) -> str:
        scheme, _, rest = self.uri.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"

    @property
    def _parts(self) -> list[str]:
        rest = self.uri[len(self._authority):]
        return [p for p in rest.split("/") if p]

    @property
    def name(self) -> str:
        parts = self._parts
        return parts[-1] if parts else ""

    @property
    def parent(self) -> RemotePath:
        parts = self._parts
        return RemotePath(self._authority + "".join(f"/{p}" for p in parts[:-1]))

    @property
    def parents(self) -> list[RemotePath]:
        out, here = [], self
        while here._parts:
            here = here.parent
            out.append(here)
        return out

    def resolve(self) -> RemotePath:
        return self

    absolute = resolve

    def is_relative_to(self, other: RemotePath) -> bool:
        return isinstance(other, RemotePath) and (
            self.uri == other.uri or self.uri.startswith(other.uri.rstrip("/") + "/"))

    def relative_to(self, other: RemotePath) -> PurePosixPath:
        if not self.is_relative_to(other):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.uri[len(other.uri):].lstrip("/") or ".")

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def with_suffix(self, suffix: str) -> RemotePath:
        return self.with_name(PurePosixPath(self.name).with_suffix(suffix).name)

    # ------------------------------------------------------------------- the store itself

    def _java(self) -> tuple[Any, Any]:
        """(Hadoop FileSystem, Hadoop Path) of this URI in the running session's JVM."""
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is None:
            raise LakeError(f"lake {redact(self.uri)}: a remote lake is read through Spark, "
                            "and no Spark session is running")
        jvm = context._jvm
        path = jvm.org.apache.hadoop.fs.Path(self.uri)
        return _call(self, lambda: path.getFileSystem(context._jsc.hadoopConfiguration())), path

    def _status(self) -> Any | None:
        if _no_jvm():
            return _arrow_status(self)
        fs, path = self._java()
        try:
            return _call(self, lambda: fs.getFileStatus(path))
        except FileNotFoundError:
            return None

    def exists(self) -> bool:
        return self._status() is not None

    def is_dir(self) -> bool:
        status = self._status()
        return status is not None and bool(status.isDirectory())

    def is_file(self) -> bool:
        status = self._status()
        return status is not None and bool(status.isFile())

    def is_symlink(self) -> bool:
        return False

    def stat(self) -> SimpleNamespace:
        status = self._status()
        if status is None:
            raise FileNotFoundError(self.uri)
        return SimpleNamespace(st_size=int(status.getLen()),
                               st_mtime=int(status.getModificationTime()) / 1000.0)

    def iterdir(self) -> Iterator[RemotePath]:
        if _no_jvm():
            return iter(_arrow_list(self))
        fs, path = self._java()
        try:
            listed = _call(self, lambda: fs.listStatus(path))
        except FileNotFoundError:
            return iter(())
        return iter([self / str(s.getPath().getName()) for s in listed])

    def glob(self, pattern: str) -> Iterator[RemotePath]:
        """The children whose names match `pattern` (no `/` in it)."""
        return (p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern))

    def rglob(self, pattern: str) -> Iterator[RemotePath]:
        """Every file below whose name matches `pattern` (one listing of the prefix)."""
        if _no_jvm():
            return iter(sorted((p for p in _arrow_list(self, recursive=True)
                                if fnmatch.fnmatchcase(p.name, pattern)), key=str))
        fs, path = self._java()
        try:
            files = _call(self, lambda: fs.listFiles(path, True))
            found = []
            while _call(self, files.hasNext):
                status = files.next()
                child = RemotePath(str(status.getPath().toString()))
                if fnmatch.fnmatchcase(child.name, pattern):
                    found.append(child)
        except FileNotFoundError:
            return iter(())
        return iter(sorted(found, key=str))

    def __lt__(self, other: RemotePath) -> bool:
        return self.uri < other.uri

    def read_bytes(self) -> bytes:
        if _no_jvm():
            return _arrow_read(self)
        fs, path = self._java()
        stream = _call(self, lambda: fs.open(path))
        try:
            jvm = _jvm()
            return bytes(_call(self, lambda: jvm.org.apache.commons.io.IOUtils.toByteArray(
                stream)))
        finally:
            stream.close()

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def write_bytes(self, data: bytes) -> int:
        fs, path = self._java()

        def put() -> None:
            stream = fs.create(path, True)
            try:
                stream.write(bytearray(data))
            finally:
                stream.close()

        _call(self, put)
        return len(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> int:
        return self.write_bytes(text.encode(encoding))

    def touch(self) -> None:
        if not self.exists():
            self.write_bytes(b"")

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """A directory where the store has them; on an object store nothing to do (a
        "directory" is the prefix of the objects below it)."""
        del parents, exist_ok
        fs, path = self._java()
        _call(self, lambda: fs.mkdirs(path))

    def unlink(self, missing_ok: bool = False) -> None:
        fs, path = self._java()
        if not _call(self, lambda: fs.delete(path, False)) and not missing_ok:
            raise FileNotFoundError(self.uri)


# ---------------------------------------------------- reads without a JVM (pyarrow's S3)


def _no_jvm() -> bool:
    """Whether no Spark session runs in this process: then a remote lake's reads (the Arrow
    path of `snapshot` and `status`, `arrow.py`) go through pyarrow's S3 file system, with
    the AWS SDK's environment (`arrow_s3`)."""
    pyspark = sys.modules.get("pyspark")  # not imported: no session (and none imported)
    return pyspark is None or pyspark.SparkContext._active_spark_context is None


def arrow_s3(root: RemotePath) -> Any:
    """pyarrow's S3FileSystem for `root` (an `s3a://`/`s3://` URI): the endpoint, key pair and
    region from the AWS SDK's environment (as `object_store_conf` gives them to S3A), path-
    style addressing where an endpoint is named. Other schemes are read on Spark."""
    import pyarrow.fs as pafs

    scheme = root.uri.split("://", 1)[0]
    if scheme not in ("s3a", "s3"):
        raise LakeError(f"lake {redact(root.uri)}: read without Spark only on s3a://")
    endpoint = next((os.environ[v] for v in ENDPOINT_ENV if os.environ.get(v)), None)
    options: dict[str, Any] = {
        "region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        or "us-east-1"}
    if endpoint:
        scheme_part, _, host = endpoint.partition("://")
        options.update(endpoint_override=host.rstrip("/") if host else endpoint,
                       scheme=scheme_part if host else "https", force_virtual_addressing=False)
    if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
        options.update(access_key=os.environ["AWS_ACCESS_KEY_ID"],
                       secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                       session_token=os.environ.get("AWS_SESSION_TOKEN"))
    options.update(connect_timeout=15, request_timeout=30,
                   retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2))
    return pafs.S3FileSystem(**options)


def arrow_probe(root: RemotePath) -> None:
    """`probe` for the reads without a JVM: the bucket asked once, so that a store that
    cannot be reached or a bucket that does not exist is one `StoreError` naming the URI."""
    import pyarrow.fs as pafs

    bucket = _arrow_key(root).split("/", 1)[0]
    info = _arrow_call(root, lambda fs: fs.get_file_info(bucket))
    if info.type == pafs.FileType.NotFound:
        raise StoreError(f"lake {redact(root.uri)}: the bucket {bucket} does not exist")


def _arrow_key(path: RemotePath) -> str:
    return path.uri.split("://", 1)[1]


def _arrow_call(path: RemotePath, action: Any) -> Any:
    try:
        return action(arrow_s3(path))
    except FileNotFoundError:
        raise
    except OSError as error:
        text = " ".join(str(error).split())
        for secret in (os.environ[v] for v in _SECRET_ENV if os.environ.get(v)):
            text = text.replace(secret, "***")
        raise StoreError(f"lake {redact(path.uri)}: {redact(text)[:500]}") from None


def _arrow_status(path: RemotePath) -> Any | None:
    import pyarrow.fs as pafs

    info = _arrow_call(path, lambda fs: fs.get_file_info(_arrow_key(path)))
    if info.type == pafs.FileType.NotFound:
        return None
    directory = info.type == pafs.FileType.Directory
    mtime = info.mtime.timestamp() * 1000 if info.mtime is not None else 0
    return SimpleNamespace(isDirectory=lambda: directory, isFile=lambda: not directory,
                           getLen=lambda: info.size or 0, getModificationTime=lambda: mtime)


def _arrow_list(path: RemotePath, *, recursive: bool = False) -> list[RemotePath]:
    """The children of `path` (`recursive`: every file below it)."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(_arrow_key(path), allow_not_found=True, recursive=recursive)
    found = _arrow_call(path, lambda fs: fs.get_file_info(selector))
    if not recursive:
        return [path / info.base_name for info in found]
    top = _arrow_key(path).rstrip("/") + "/"
    return [path / info.path[len(top):] for info in found
            if info.type == pafs.FileType.File and info.path.startswith(top)]


def _arrow_read(path: RemotePath) -> bytes:
    def read(fs: Any) -> bytes:
        with fs.open_input_stream(_arrow_key(path)) as stream:
            return stream.read()

    return _arrow_call(path, read)


def _jvm() -> Any:
    from pyspark import SparkContext

    return SparkContext._active_spark_context._jvm


JAVA_NOT_FOUND = ("java.io.FileNotFoundException",)
JAVA_EXISTS = ("org.apache.hadoop.fs.FileAlreadyExistsException",
               "java.nio.file.FileAlreadyExistsException")


def _call(where: RemotePath, action: Any) -> Any:
    """`action()`, with the store's Java exceptions as Python's: FileNotFoundError,
    FileExistsError (a conditional create that found an object), else a `StoreError` naming
    `where` in one line."""
    from py4j.protocol import Py4JJavaError

    try:
        return action()
    except Py4JJavaError as error:
        chain = _causes(error.java_exception)
        names = [str(c.getClass().getName()) for c in chain]
        if names and names[0] in JAVA_NOT_FOUND:
            raise FileNotFoundError(where.uri) from None
        if any(n in JAVA_EXISTS for n in names) or any(
                "412" in str(c.getMessage() or "") and "PreconditionFailed" in
                str(c.getMessage() or "").replace(" ", "") for c in chain):
            raise FileExistsError(where.uri) from None
        raise StoreError(f"lake {redact(where.uri)}: {store_reason(chain)}") from None


def _causes(throwable: Any) -> list[Any]:
    chain = []
    while throwable is not None and len(chain) < 12:
        chain.append(throwable)
        throwable = throwable.getCause()
    return chain


_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


def store_reason(chain: list[Any]) -> str:
    """The store's reason in one line: the first message of the exception chain that says
    something (a class name where none does), with every known secret masked."""
    for throwable in chain:
        message = str(throwable.getMessage() or "").strip()
        if message:
            line = " ".join(message.split("\n", 1)[0].split())
            break
    else:
        line = str(chain[0].getClass().getName()) if chain else "unknown error"
    known = [os.environ[v] for v in _SECRET_ENV if os.environ.get(v)]
    for secret in known:
        line = line.replace(secret, "***")
    return redact(line)[:500]


# ----------------------------------------------------------------- the differing operations


def replace_whole(path: Path | RemotePath, text: str) -> None:
    """`path` holds `text`, whole, or what it held before (see the module docstring)."""
    if isinstance(path, RemotePath):
        path.write_text(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)


def remove_tree(path: Path | RemotePath) -> None:
    """Remove the directory (or file) at `path` and everything below it, if there."""
    if isinstance(path, RemotePath):
        fs, hpath = path._java()
        _call(path, lambda: fs.delete(hpath, True))
        return
    shutil.rmtree(path, ignore_errors=True)


def create_exclusive(path: Path | RemotePath, text: str, *,
                     before_put: Callable[[], None] | None = None) -> bool:
    """Create `path` holding `text` if nothing is there, atomically; False where something
    already was (nothing written). On a remote store the check is the PUT's own: an object
    another writer makes after this one began (`before_put` runs there: for the tests) still
    wins over it."""
    if isinstance(path, RemotePath):
        fs, hpath = path._java()

        def put() -> None:
            builder = fs.createFile(hpath).overwrite(False)
            if fs.hasPathCapability(hpath, CONDITIONAL_CREATE):
                builder.must(CONDITIONAL_CREATE, True)
            # else a file system whose create without overwrite is atomic (HDFS), or a
            # store with conditional writes off (fs.s3a.create.conditional.enabled=false):
            # there a check before the PUT, which two writers can both pass
            stream = builder.build()
            try:
                stream.write(bytearray(text.encode()))
                if before_put is not None:
                    before_put()
            finally:
                stream.close()  # the PUT, with If-None-Match: *

        try:
            _call(path, put)
        except FileExistsError:
            return False
        return True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fo:
        fo.write(text)
        fo.flush()
        os.fsync(fo.fileno())
    fsync_directory(path.parent)
    return True


CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite"
"""Hadoop's create option for a PUT that fails where an object already is (S3A 3.5)."""


@contextmanager
def parquet_source(path: Path | RemotePath) -> Iterator[Any]:
    """What `pyarrow.parquet.ParquetFile` opens for the file at `path`, while the `with`
    lasts: a local path as it is; a remote file as a seekable stream that reads what pyarrow
    asks for (the footer, then each column chunk it reads), never the whole object at once.
    With a Spark session, through the session's Hadoop FileSystem (`RemoteInput`), so the
    store's settings and credentials are Spark's; without one, pyarrow's S3 file system."""
    if not isinstance(path, RemotePath):
        yield path
        return
    if _no_jvm():
        stream = _arrow_call(path, lambda fs: fs.open_input_file(_arrow_key(path)))
    else:
        stream = RemoteInput(path)
    with stream:
        yield stream


class RemoteInput(io.RawIOBase):
    """A remote file read through the session's Hadoop FileSystem as a seekable binary file:
    each `readinto` one positioned read of at most `CHUNK` bytes (`InputStream.readNBytes`,
    which py4j hands back as bytes), so memory holds what the caller asked for, not the
    object."""

    CHUNK = 8 << 20

    def __init__(self, path: RemotePath) -> None:
        super().__init__()
        fs, java_path = path._java()
        self._path = path
        self._size = int(_call(path, lambda: fs.getFileStatus(java_path)).getLen())
        self._stream = _call(path, lambda: fs.open(java_path))
        self._position = 0
        self.fetched = 0  # bytes read from the store so far

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def read(self, size: int = -1) -> bytes:
        """`size` bytes (all that is left if fewer, or if `size` < 0): whole, as pyarrow
        expects of a read, in positioned reads of `CHUNK` bytes."""
        wanted = self._size - self._position if size < 0 else \
            min(size, max(0, self._size - self._position))
        out = bytearray(wanted)
        done = 0
        while done < wanted:
            got = self.readinto(memoryview(out)[done:])
            if got == 0:
                break
            done += got
        return bytes(out[:done])

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(len(view), self.CHUNK, max(0, self._size - self._position))
        if wanted == 0:
            return 0
        stream, position = self._stream, self._position

        def read() -> bytes:
            stream.seek(position)
            return bytes(stream.readNBytes(wanted))

        data = _call(self._path, read)
        view[:len(data)] = data
        self._position += len(data)
        self.fetched += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


def probe(root: RemotePath) -> None:
    """Ask the store about the lake's location once, so that an unreachable store, a bucket
    that does not exist or missing credentials is one `StoreError` naming the URI, before
    anything else is done. A fresh FileSystem instance with few retries: a store that is not
    there is said so in seconds, not after S3A's minutes of retrying."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    jvm = context._jvm
    conf = jvm.org.apache.hadoop.conf.Configuration(context._jsc.hadoopConfiguration())
    scheme = root.uri.split("://", 1)[0]
    conf.setBoolean(f"fs.{scheme}.impl.disable.cache", True)
    for key, value in PROBE_SETTINGS.items():
        conf.set(key, value)
    path = jvm.org.apache.hadoop.fs.Path(root.uri)
    fs = _call(root, lambda: path.getFileSystem(conf))
    try:
        _call(root, lambda: fs.exists(path))
    finally:
        fs.close()


PROBE_SETTINGS = {
    "fs.s3a.attempts.maximum": "1",
    "fs.s3a.retry.limit": "1",
    "fs.s3a.retry.interval": "100ms",
    "fs.s3a.retry.throttle.limit": "1",
    "fs.s3a.connection.establish.timeout": "15s",
    "fs.s3a.connection.timeout": "15s",
}
"""S3A's retries for `probe` only (the session keeps S3A's defaults for its work)."""


# --------------------------------------------------------------- settings of a remote lake

ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""The AWS SDKs' own variables for a service endpoint (S3's, then every service's)."""


def object_store_conf(given: dict[str, str] | None) -> dict[str, str]:
    """The Spark settings of a session on a remote lake: `given`, plus S3A's endpoint from
    the AWS SDKs' `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` where `given` names none
    (`spark.hadoop.fs.s3a.endpoint`), with path-style access (`bucket` in the path, not the
    host name: what S3-compatible servers on a host and port want) unless `given` says. S3A
    takes the key pair from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (or
    `spark.hadoop.fs.s3a.access.key` / `.secret.key`) itself."""
    conf = dict(given or {})
    endpoint = next((os.environ[v] for v in ENDPOINT_ENV if os.environ.get(v)), None)
    if endpoint and "spark.hadoop.fs.s3a.endpoint" not in conf:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf.setdefault("spark.hadoop.fs.s3a.path.style.access", "true")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        conf.setdefault("spark.hadoop.fs.s3a.endpoint.region", region)
    return conf


def local_home(root: RemotePath) -> Path:
    """The local directory that keeps a remote lake's embedded metastore (Derby cannot live
    on an object store) and Spark's warehouse directory: under `CHANGELAKE_STATE_HOME`
    (default `$XDG_STATE_HOME/changelake`, else `~/.local/state/changelake`), one folder
    per lake URI, private to this user."""
    import hashlib

    base = os.environ.get(STATE_HOME_ENV)
    if not base:
        xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        base = str(Path(xdg) / "changelake")
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", root.uri.split("://", 1)[1])[:80]
    digest = hashlib.sha256(root.uri.encode()).hexdigest()[:12]
    home = Path(base).resolve() / "lakes" / f"{readable}-{digest}"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


STATE_HOME_ENV = "CHANGELAKE_STATE_HOME"


def storage_options(path: Path | RemotePath) -> dict[str, str] | None:
    """delta-rs's `storage_options` for a Delta table at `path`: None for a local one; for
    `s3a://` (`s3://`) the endpoint, path style, region and key pair S3A uses (its Hadoop
    settings, else the AWS SDK's environment, which delta-rs reads itself too)."""
    if not isinstance(path, RemotePath):
        return None

    def setting(key: str) -> str | None:
        if _no_jvm():  # the AWS SDK's environment alone (`arrow_s3`)
            return "true" if key == "fs.s3a.path.style.access" and any(
                os.environ.get(v) for v in ENDPOINT_ENV) else None
        from pyspark import SparkContext

        value = SparkContext._active_spark_context._jsc.hadoopConfiguration().get(key)
        return None if value is None else str(value)

    options: dict[str, str] = {}
    endpoint = setting("fs.s3a.endpoint") or next(
        (os.environ[v] for v in ENDPOINT_ENV if os.environ.get(v)), None)
    if endpoint:
        if "://" not in endpoint:
            secure = (setting("fs.s3a.connection.ssl.enabled") or "true") == "true"
            endpoint = f"{'https' if secure else 'http'}://{endpoint}"
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if (setting("fs.s3a.path.style.access") or "false") == "true":
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    region = setting("fs.s3a.endpoint.region") or os.environ.get("AWS_REGION") \
        or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    options["AWS_REGION"] = region
    for key, option in (("fs.s3a.access.key", "AWS_ACCESS_KEY_ID"),
                        ("fs.s3a.secret.key", "AWS_SECRET_ACCESS_KEY"),
                        ("fs.s3a.session.token", "AWS_SESSION_TOKEN")):
        value = setting(key) or os.environ.get(option)
        if value:
            options[option] = value
    return options


def delta_uri(path: Path | RemotePath) -> str:
    """The URI delta-rs opens for the Delta table at `path` (`s3a://` as `s3://`: the same
    objects)."""
    text = str(path)
    return "s3://" + text[len("s3a://"):] if text.startswith("s3a://") else text
