"""Run contexts: the files of one body run, one local call or one producer block, and the
``dls.run`` verbs that use the one in effect.

A body asks for local paths: ``read(key)`` fetches the object at ``<data root>/<scope>/<key>``
into a per-worker cache, ``write(key)`` hands out a staging path, and the keys the body
returns (or yields) are uploaded then; a key written and never returned fails the invocation.
Uploads of a worker's body are fenced: before each batch, the context's ``fence`` proves the
attempt still holds its lease. Contexts live in a context variable, so concurrent bodies in
one worker never see each other's files. This is the only module of lakeshore that imports
fsspec. The whole contract: docs/files.md and docs/protocol.md#files-the-data-root.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lakeshore.errors import (
    Fenced,
    InvalidArgument,
    LakeshoreError,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
    UnreturnedWrite,
)
from lakeshore.files.nofollow import READ_NOFOLLOW, link_part, open_last, put_local, walk
from lakeshore.files.root import (
    STAGING_NAME,
    DataRoot,
    Fence,
    exclusive_file,
    local_name,
    private_dir,
    slot_dir,
    slot_path,
)
from lakeshore.scope import keys_in, mirror, prefixed, resolve

__all__ = ["RunContext", "active", "flush", "pending", "read", "scope", "write"]

_CTX: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "lakeshore_run", default=None
)


_LOCAL_PROTOCOLS = ("file", "local")


log = logging.getLogger("lakeshore.run")


_CACHE_LAYOUT = "v2"  # the cache's layout; folders of another layout are never read


class RunContext:
    """The files of one body run (``role="body"``), one local call (``"local"``) or one
    producer block (``"producer"``). ``root`` may be a callable, resolved on first use, so a
    body that touches no files never opens anything."""

    def __init__(
        self,
        root: DataRoot | Callable[[], DataRoot],
        role: str,
        prefix: str = "",
        staging_name: str = "run",
        in_child: bool = False,
        fence: Fence | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self._root = root
        self.role = role
        self.prefix = prefix  # the scope returned keys are read in
        # names its staging folder
        self.staging_name = staging_name if STAGING_NAME.fullmatch(staging_name) else "run"
        self.in_child = in_child
        self.fence = fence  # a worker's body: proves the lease before each batch of uploads
        self.stop = stop  # set once the attempt stopped: upload nothing more
        self.pending: dict[str, Path] = {}
        self._lock = threading.Lock()  # threads that copied a producer's context share it
        self._fs: Any = None
        self._base = ""
        self._staging: Path | None = None

    @property
    def root(self) -> DataRoot:
        if callable(self._root):
            self._root = self._root()
        return self._root

    def _filesystem(self, op: str) -> tuple[Any, str]:
        if self._fs is None:
            root = self.root
            if not root.url:
                raise InvalidArgument(
                    op,
                    f"this plane has no data root ({root.options.get('why', 'none set')})",
                    "pass Dispatch(..., data='<fsspec URL>') or set LAKESHORE_DATA",
                )
            if root.protocol == "memory" and self.in_child:
                raise InvalidArgument(
                    op,
                    f"the data root {root.url} lives in the worker's memory; this body runs "
                    "in a child process that cannot see it",
                    "run the worker with isolation='thread', or use a file:// or s3:// root",
                )
            import fsspec

            try:
                self._fs = fsspec.filesystem(root.protocol, **root.options)
            except (ImportError, ValueError) as e:
                s3 = root.protocol in ("s3", "s3a")
                raise InvalidArgument(
                    op,
                    f"cannot open the data root {root.url}: {e}",
                    "pip install 'lakeshore-queue[s3]'" if s3 else "install its fsspec driver",
                ) from None
            self._base = self._fs._strip_protocol(root.url).rstrip("/")
        return self._fs, self._base

    def local_call(self, prefix: str) -> RunContext:
        """The context of a decorated function called directly inside this one: the same
        root, and the same fence and stop (its uploads are the enclosing body's)."""
        return RunContext(self._root, "local", prefix=prefix, fence=self.fence, stop=self.stop)

    def same_root(self, root: DataRoot) -> bool:
        return self._root is root or self.root == root

    def location(self, full: str) -> str:
        """The URL of a full key under the data root."""
        return f"{self.root.url}/{full}"

    # -- reading ------------------------------------------------------------------------------

    def read(self, full: str) -> str:
        """A local path holding the object ``full`` (this run's own writes first).

        Raises:
            NotFound: no such object. PermissionDenied, StoreUnavailable: the root failed.
        """
        mine = self.pending.get(full)
        if mine is not None and mine.exists():
            return str(mine)
        op = f"run.read {full!r}"
        fs, base = self._filesystem(op)
        if self.root.protocol in _LOCAL_PROTOCOLS:
            return self._read_local(base, full, op)
        remote = f"{base}/{full}"
        try:
            fs.invalidate_cache(remote)  # a listing cached by the driver may be stale
            info = fs.info(remote)
        except Exception as e:
            raise _io_error(op, self.location(full), e) from None
        if info.get("type") == "directory":
            raise NotFound(op, f"{self.location(full)} is a folder, not an object", "name a file")
        stamp, size = _fingerprint(info), info.get("size")

        def fetch(tmp: Path) -> None:
            if self.root.protocol == "memory":
                # fsspec's memory files share one read position between readers: copy bytes
                tmp.write_bytes(fs.cat_file(remote))
            else:
                fs.get_file(remote, str(tmp))

        return self._cached(full, stamp, None if size is None else int(size), fetch, op)

    def _read_local(self, base: str, full: str, op: str) -> str:
        """A local path holding ``full`` on a ``file://`` root, reached without following a
        link below the root: the file itself when nobody else can change the folders on the
        way to it, else a private copy (another user could swap a folder for a link between
        this check and the body's own open).

        Raises:
            PermissionDenied: a link, or something that is not a regular file, on the way.
            NotFound: no such file, or it is a folder.
        """
        where = self.location(full)
        try:
            folder, name, private = walk(base, full, create=False)
            try:
                fd = open_last(folder, name, READ_NOFOLLOW, full)
            finally:
                os.close(folder)
        except OSError as e:
            raise self._walk_error(op, full, e) from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise NotFound(op, f"{where} is a folder, not an object", "name a file")
            if not stat.S_ISREG(st.st_mode):
                raise PermissionDenied(
                    op,
                    f"{where} is not a regular file (a pipe, a socket or a device); lakeshore "
                    "reads only plain files from a data root",
                    "replace it with a plain file",
                    key=full,
                    location=where,
                )
            if private:
                return f"{base}/{full}"  # in place: nobody else can redirect this path
            if st.st_nlink > 1:
                # Another user who may write a folder on the way can plant a hard link to a
                # file outside the root (where the system lets them link files they cannot
                # read): read with this user's rights, it would leak like a symlink.
                raise PermissionDenied(
                    op,
                    f"{where} has {st.st_nlink} hard links and lies in a folder other users "
                    "may change; lakeshore reads only singly linked files there, since a "
                    "hard link could lead a read outside the data root",
                    "copy the file into place instead of linking it",
                    key=full,
                    location=where,
                )
            stamp = f"local:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"

            def fetch(tmp: Path) -> None:
                # from the descriptor the walk opened, not by name: the name may be a link now
                os.lseek(fd, 0, os.SEEK_SET)
                with open(tmp, "wb") as out:
                    while chunk := os.read(fd, 1 << 20):
                        out.write(chunk)

            return self._cached(full, stamp, st.st_size, fetch, op)
        finally:
            os.close(fd)

    def _walk_error(self, op: str, full: str, e: Exception) -> LakeshoreError:
        part = link_part(e)
        if part is not None:
            return PermissionDenied(
                op,
                f"{part!r} in the data root {self.root.url} is a symbolic link; lakeshore "
                "follows no link below a file:// data root, since one could lead a read or a "
                "write outside it",
                "replace the link with the real folder or file (a link is refused even when "
                "it points inside the root)",
                key=full,
                location=self.location(full),
            )
        return _io_error(op, self.location(full), e)

    def _cached(
        self,
        full: str,
        stamp: str,
        size: int | None,
        fetch: Callable[[Path], None],
        op: str,
    ) -> str:
        """The cached copy of ``full``, fetched again (by ``fetch`` into a fresh file) unless
        the copy was stamped with ``stamp`` and is untouched locally.

        Layout, under ``<cache>/v2/<digest of the root URL>/``: one folder per key (named by
        the key's digest) holding ``meta`` (the stamp) and ``f/<file name>`` (the bytes).
        The key's file name lives alone in ``f/``, so no key can collide with the note or
        with the temporary files (made beside ``meta``). Caches of the earlier layout
        (``<cache>/<digest>/``, where a key named ``.meta`` was its own note) are never read.
        """
        digest = hashlib.sha256(self.root.url.encode()).hexdigest()[:16]
        cache = private_dir(self.root, "cache", op)
        slot = cache / _CACHE_LAYOUT / digest / slot_dir(full)
        local = slot / "f" / local_name(full)
        meta = slot / "meta"
        if local.exists() and meta.exists():
            st = local.stat()
            if meta.read_text() == f"{stamp}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}":
                return str(local)  # unchanged remotely, untouched locally
        local.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Fresh names, created exclusively (O_EXCL, mode 0600): never a file someone else
        # put there, never through a symlink.
        tmp = tmp_meta = None
        try:
            tmp = exclusive_file(slot)
            tmp_meta = exclusive_file(slot)
            fetch(tmp)
            st = tmp.stat()
            if size is not None and st.st_size != size:
                raise OSError(f"got {st.st_size} bytes of {size}")
            # Stamp the file we fetched (its inode survives the rename), so a concurrent
            # reader that replaced the file after us can never be stamped with our version.
            tmp_meta.write_text(f"{stamp}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}")
            os.replace(tmp, local)
            os.replace(tmp_meta, meta)
        except Exception as e:
            for t in (tmp, tmp_meta):
                if t is not None:
                    with contextlib.suppress(OSError):
                        t.unlink(missing_ok=True)
            raise _io_error(op, self.location(full), e) from None
        return str(local)

    # -- writing ------------------------------------------------------------------------------

    def write(self, full: str) -> str:
        """A local path to write ``full`` to; uploaded when the body returns it."""
        with self._lock:
            path = self.pending.get(full)
            if path is None:
                if self._staging is None:
                    op = f"run.write {self._relative(full)!r}"
                    base = private_dir(self.root, "staging", op)
                    self._staging = Path(tempfile.mkdtemp(prefix=f"{self.staging_name}-", dir=base))
                path = self._staging / slot_path(full)
                path.parent.mkdir(parents=True, exist_ok=True)
                self.pending[full] = path
        return str(path)

    def publish(self, value: Any) -> None:
        """Upload the pending keys ``value`` (a yielded item) names.

        Raises:
            InvalidArgument: a named key's file was never created.
            StoreUnavailable, PermissionDenied: the upload failed.
        """
        if self.pending:
            self._publish(sorted(keys_in(value, self.prefix) & self.pending.keys()))

    def finish(self, value: Any, verb: str = "return") -> None:
        """End of a body: every written key must be in ``value`` (what it returned, or all it
        yielded — ``verb`` says which, for the message); upload them all.

        Raises:
            UnreturnedWrite: a key was written and not returned (nothing is uploaded).
            InvalidArgument: a returned key's file was never created.
        """
        if not self.pending:
            return
        named = keys_in(value, self.prefix)
        missing = sorted(set(self.pending) - named)
        if missing and self.role != "producer":
            shown = ", ".join(repr(self._relative(k)) for k in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise UnreturnedWrite(
                "run.write",
                f"the body wrote {shown}{more} but did not {verb} it",
                "return (or yield) every key you write — or don't write it — so the output is "
                "never orphaned in storage",
                keys=[self.location(k) for k in missing],
            )
        self._publish(sorted(self.pending))

    def _publish(self, keys: list[str]) -> None:
        """Upload one batch of a body's files, fenced: every file must exist, then the fence
        must confirm the lease, then each file goes up unless the attempt stopped meanwhile.

        Raises:
            InvalidArgument: a file was never written (nothing is uploaded).
            Fenced: the attempt lost its lease or stopped (nothing more is uploaded).
            StoreUnavailable: the lease could not be confirmed (nothing is uploaded).
        """
        if not keys:
            return
        for full in keys:
            self._written(full)
        if self.fence is not None:
            try:
                held = self.fence()
            except LakeshoreError as e:  # the store failed or refused: the lease is unknown
                raise StoreUnavailable(
                    "run.write",
                    "could not confirm that this attempt still holds its lease before "
                    f"publishing its files ({e.op}: {e.what}); nothing was uploaded",
                    "nothing to do: the attempt fails and is retried while attempts remain",
                ) from None
            if not held:
                raise self._fenced(keys)
        for full in keys:
            if self.stop is not None and self.stop.is_set():
                raise self._fenced(keys)
            self._upload(full)

    def _fenced(self, keys: list[str]) -> Fenced:
        shown = ", ".join(repr(self._relative(k)) for k in keys[:5])
        return Fenced(
            "run.write",
            f"the attempt no longer holds its lease (cancelled, timed out, or taken over by "
            f"another worker), so {shown} {'was' if len(keys) == 1 else 'were'} not uploaded",
            "nothing to do: the invocation's current attempt publishes its own outputs",
        )

    def flush(self, created_only: bool = False) -> None:
        """Upload every pending key (producer blocks: at block end). ``created_only`` leaves
        paths whose file does not exist yet for later (before a submit, a producer may hold
        paths it has not written)."""
        with self._lock:
            keys = sorted(self.pending)
        for full in keys:
            path = self.pending.get(full)
            if path is not None and (path.is_file() or not created_only):
                self._upload(full)

    def _relative(self, full: str) -> str:
        p = f"{self.prefix}/" if self.prefix else ""
        return full[len(p) :] if p and full.startswith(p) else full

    def _written(self, full: str) -> str:
        """The op name for uploading ``full``, once its staging file is known to exist.

        Raises:
            InvalidArgument: ``run.write`` handed out the path and nobody wrote it.
        """
        op = f"run.write {self._relative(full)!r}"
        path = self.pending.get(full)
        if path is not None and not path.is_file():
            raise InvalidArgument(
                op,
                f"the path run.write gave ({path}) was never written",
                "create the file before returning its key, or don't return the key",
            )
        return op

    def _upload(self, full: str) -> None:
        path = self.pending.get(full)
        if path is None:
            return  # another thread of this producer block uploaded it
        op = self._written(full)
        fs, base = self._filesystem(op)
        remote = f"{base}/{full}"
        try:
            if self.root.protocol in _LOCAL_PROTOCOLS:
                put_local(path, base, full)
            elif self.root.protocol == "memory":
                # a memory file is visible while it is being written: publish it whole
                fs.pipe_file(remote, path.read_bytes())
            else:
                fs.put_file(str(path), remote)
        except Exception as e:
            raise self._walk_error(op, full, e) from None
        with self._lock:
            self.pending.pop(full, None)
        path.unlink(missing_ok=True)

    def close(self) -> None:
        """Forget what was not uploaded and remove the staging directory."""
        self.pending.clear()
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    @contextlib.contextmanager
    def activate(self) -> Iterator[RunContext]:
        token = _CTX.set(self)
        try:
            yield self
        finally:
            _CTX.reset(token)


def _fingerprint(info: dict[str, Any]) -> str:
    change = next(
        (info[k] for k in ("ETag", "etag", "mtime", "LastModified", "created") if k in info), ""
    )
    return f"{info.get('size')}:{change}"


def _io_error(op: str, where: str, e: Exception) -> LakeshoreError:
    """fsspec drivers raise OSError subclasses; turn them into the lakeshore tree."""
    if isinstance(e, LakeshoreError):
        return e
    if isinstance(e, FileNotFoundError):
        return NotFound(
            op,
            f"no object at {where}",
            "check the key and the scope; inputs must be written before the submit",
            location=where,
        )
    if isinstance(e, FileExistsError | NotADirectoryError | IsADirectoryError):
        return InvalidArgument(
            op,
            f"{where}: a file and a folder cannot share a name on this data root ({e})",
            "rename one of the keys (object stores allow both; filesystems do not)",
            location=where,
        )
    if isinstance(e, PermissionError):
        return PermissionDenied(op, f"access to {where} denied ({e})", "check the credentials")
    return StoreUnavailable(
        op, f"{where}: {type(e).__name__}: {e}", "check that the data root is reachable"
    )


def active() -> RunContext | None:
    """The run context in effect here, if any."""
    return _CTX.get()


def _context(op: str) -> RunContext:
    ctx = _CTX.get()
    if ctx is not None:
        return ctx
    raise InvalidArgument(
        op,
        "no body or scope block here, so no data root to use",
        "in a producer, use `with q.scope(prefix):` (or `with dls.scope(prefix):` for the "
        "default plane); in a thread a body started, run the code under "
        "contextvars.copy_context() taken in the body",
    )


def read(keys: Any) -> Any:
    """Local path(s) for the object(s) at ``keys`` in the current scope: a str, or a list,
    tuple or dict of them (the result has the same shape).

    Inside a body the worker's data root is used; in a producer, the one of the enclosing
    ``q.scope(...)`` (or ``dls.scope(...)``) block. Objects are cached per worker and
    fetched again only when they changed; treat the paths as read-only.

    Raises:
        NotFound: no object at a key (the message names the full location).
        InvalidArgument: a malformed key, one that climbs out of the data root, or no body
            or scope block around the call.
        PermissionDenied, StoreUnavailable: the data root refused or failed.
    """
    ctx = _context("run.read")
    return mirror(keys, lambda k: ctx.read(resolve(k, f"run.read {k!r}")), "run.read")


def write(keys: Any) -> Any:
    """Local path(s) to write the object(s) at ``keys`` to (a str, or a list, tuple or dict
    of them; the result has the same shape). The files are uploaded when the body returns
    (or yields) the keys; a body that writes a key must return it.

    Raises:
        InvalidArgument: a malformed key, or ``write`` outside a body and a scope block.
    """
    ctx = _context("run.write")
    return mirror(keys, lambda k: ctx.write(resolve(k, f"run.write {k!r}")), "run.write")


def pending() -> bool:
    """Whether :func:`flush` has files to upload now (a producer block holding written
    paths): an async submit flushes in a thread only then."""
    ctx = _CTX.get()
    return ctx is not None and ctx.role == "producer" and bool(ctx.pending)


def flush() -> None:
    """Upload the files written so far in the current producer block (``submit`` does this
    itself). Inside a body it does nothing: the body's return uploads its files.

    Raises:
        InvalidArgument: a written path was never created.
        PermissionDenied, StoreUnavailable: the upload failed.
    """
    ctx = _CTX.get()
    if ctx is not None and ctx.role == "producer":
        ctx.flush(created_only=True)


@contextlib.contextmanager
def scope(
    prefix: str = "",
    *,
    root: DataRoot | None = None,
    default_root: Callable[[], DataRoot] | None = None,
) -> Iterator[str]:
    """Resolve data keys under ``prefix`` inside the block; yields the full prefix.

    Scopes nest (prefixes join) and ``..`` climbs to a parent scope, never out of the data
    root. ``submit`` records the scope in the invocation, and the worker re-installs it
    around the body, so a key names the same object in both places. Outside a body, the
    outermost block also collects the files ``run.write`` hands out and uploads them before
    each ``submit`` inside it and when it ends (an exception discards them). ``q.scope``
    binds the block to plane ``q``'s data root; without ``root``, the block uses the
    enclosing block's, else ``default_root()`` (``dls.scope`` passes the default plane's).

    Raises:
        InvalidArgument: ``prefix`` is absolute, a URL, or climbs out of the data root; or
            neither ``root`` nor ``default_root`` is given outside any block.
    """
    with prefixed(prefix) as full:
        ctx = _CTX.get()
        if ctx is not None and (root is None or ctx.same_root(root)):
            yield full
            return
        source: DataRoot | Callable[[], DataRoot]
        if root is not None:
            source = root
        elif default_root is not None:
            source = default_root
        else:
            raise InvalidArgument(
                "scope",
                "no data root: not inside a body or scope block, and none given",
                "use `with q.scope(prefix):` (or `with dls.scope(prefix):` for the default plane)",
            )
        fresh = RunContext(source, "producer", prefix=full)
        try:
            with fresh.activate():
                yield full
            fresh.flush()
        finally:
            fresh.close()
