"""``LocalStore``: the store contract on a local directory ("file:///path").

Safe across threads and processes on one machine:

* every write goes to a private temp file first and is published atomically, so a reader
  never sees half an object;
* ``CREATE`` publishes with ``os.link``, which fails if the key exists — atomic without a lock
  (on Linux from an unnamed ``O_TMPFILE``, so a crash leaves no temp file behind);
* ``OVERWRITE``, ``if_match`` and ``delete`` run under an exclusive ``flock`` on the key's
  lock stripe, so check-then-rename is one step for every process that uses the directory.

On-disk layout under the root directory::

    objects/<seg>/<seg>/<last>.obj   one file per object: 4-byte magic, 16-byte etag, data
    .locks/<00..ff>                  lock stripes (a key hashes to one of 256)

Segments are stored as they are, except that ``%`` becomes ``%25`` and a trailing ``.obj``
becomes ``%2Eobj``: then no directory name can ever equal an object's file name.
    .tmp/                            temp files being written (leftovers of a crash are inert)

The etag is 16 random bytes stored in the object's own header, so it changes on every write
(even of identical bytes) and is read in the same ``open`` as the data. A file without the
header (stray or damaged) reads as an object holding the whole file, with a hash of the file
as its etag: the layers above judge its bytes (and overwrite it by ``if_match``) instead of
the store refusing every read and listing that meets it. The ``.obj`` suffix
lets ``a`` and ``a/b`` both exist as keys, as they can on S3. Fsync is off by default (a
crashed *process* loses nothing; a crashed *machine* may lose the last writes): pass
``fsync=True`` or ``?fsync=1`` in the URL to fsync each object and its directory entry.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import random
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lakeshore.errors import InvalidArgument, LakeshoreError, StoreError
from lakeshore.store.base import (
    OVERWRITE,
    ObjectInfo,
    PutMode,
    Store,
    check_data,
    check_key,
    check_prefix,
    conflict,
    not_found,
    too_large,
)
from lakeshore.store.clock import machine_clock

__all__ = ["LocalStore"]

_MAGIC = b"LSO1"
_HEADER = len(_MAGIC) + 16
_SUFFIX = ".obj"
_DIR_RETRIES = 50  # an empty parent may be pruned by a concurrent delete between mkdir and link
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_UNNAMED_FLAGS = getattr(os, "O_TMPFILE", 0) | os.O_WRONLY | os.O_CLOEXEC
# O_TMPFILE refused: by the filesystem, or by a kernel that predates it (EISDIR)
_NO_UNNAMED = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)
_CROWDED_BYTES = 4096  # a directory larger than one block holds (or held) many entries
_CROWDED_S = 0.5  # how long a crowded directory is not pruned again after a failed try


def _encode(segment: str) -> str:
    """Segment -> file-system name that never ends in ``.obj``, so a directory can never take
    the name of an object file (keys ``x`` and ``x.obj/y`` coexist). Reversible."""
    name = segment.replace("%", "%25")
    return name[:-4] + "%2Eobj" if name.endswith(_SUFFIX) else name


def _decode(name: str) -> str:
    return name.replace("%2Eobj", ".obj").replace("%25", "%") if "%" in name else name


class LocalStore(Store):
    """A store on a local directory; see the module docstring for the guarantees."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = False,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        path = Path(root).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        self.root = path
        self.url = f"file://{path}"
        self.fsync = fsync
        self._objects = path / "objects"
        self._locks = path / ".locks"
        self._tmp = path / ".tmp"
        # the hot path joins strings: pathlib's parsing cost more than the syscalls it names
        self._objects_s = str(self._objects)
        self._locks_s = str(self._locks)
        self._tmp_s = str(self._tmp)
        self._ticks = time.monotonic
        # CREATE from unnamed temp files where the system has them (see _create_unnamed)
        self._unnamed = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
        self._root_fd = -1
        self._crowded: dict[str, float] = {}  # directory -> do not try to prune before
        self._crowded_lock = threading.Lock()
        try:
            for d in (self._objects, self._locks, self._tmp):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(
                f"open {self.url}",
                f"cannot create the store directory ({e.strerror})",
                "pick a writable directory or fix its permissions",
                path=str(path),
            ) from e
        # one clock for every process on this machine, and no wall-clock step moves it
        self._clock = machine_clock(path, wall_clock)
        if self._unnamed:
            try:
                self._root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                self._unnamed = False

    def __del__(self) -> None:
        if getattr(self, "_root_fd", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._root_fd)

    def location(self) -> tuple[str, dict[str, Any]] | None:
        return self.url, {}

    # -- paths and locks -------------------------------------------------------------------

    def _path(self, key: str) -> str:
        *dirs, last = key.split("/")
        name = _encode(last) + _SUFFIX
        if not dirs:
            return f"{self._objects_s}/{name}"
        return f"{self._objects_s}/{'/'.join(map(_encode, dirs))}/{name}"

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        stripe = hashlib.blake2b(key.encode(), digest_size=1).digest()[0]  # 1 of 256
        # A fresh open per acquisition: flock conflicts between open file descriptions, so
        # threads of one process exclude each other exactly like separate processes do.
        fd = os.open(f"{self._locks_s}/{stripe:02x}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write_tmp(self, data: bytes) -> tuple[str, str]:
        """A new private file in ``.tmp/`` holding the header and ``data``; its path and etag.
        Raw ``os`` calls: a buffered file object costs three more syscalls per write."""
        while True:
            # not secret, only unique (O_EXCL catches the 1 in 2**128): no syscall for it
            raw = random.getrandbits(128).to_bytes(16, "big")
            tmp = f"{self._tmp_s}/{raw.hex()}"
            try:
                fd = os.open(tmp, _TMP_FLAGS, 0o644)
                break
            except FileExistsError:
                continue
        try:
            try:
                self._fill(fd, raw, data)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return tmp, f'"{raw.hex()}"'

    def _fill(self, fd: int, raw: bytes, data: bytes) -> None:
        _write_all(fd, _MAGIC + raw + data)
        # listings report the store's clock, not the wall clock (see now()); after the last
        # write, which would set the wall clock's time again
        t = self._clock()
        os.utime(fd, (t, t))
        if self.fsync:
            os.fsync(fd)

    def _create_unnamed(self, path: str, data: bytes) -> str | None:
        """``CREATE`` from an unnamed temp file (Linux ``O_TMPFILE``), linked into place
        through ``/proc/self/fd``: no name in ``.tmp/`` to make and remove, and nothing left
        behind by a crash. Returns the etag; None where the system has no such files (the
        caller then uses a named temp file).

        Raises:
            FileExistsError: the key exists.
            OSError: the filesystem failed.
        """
        if not self._unnamed:
            return None
        try:
            fd = os.open(self._tmp_s, _UNNAMED_FLAGS, 0o644)
        except OSError as e:
            if e.errno in _NO_UNNAMED:
                self._unnamed = False
                return None
            raise
        try:
            raw = random.getrandbits(128).to_bytes(16, "big")
            self._fill(fd, raw, data)
            proc = f"/proc/self/fd/{fd}"

            def link(_: str, dst: str) -> None:
                # src_dir_fd makes os.link call linkat with AT_SYMLINK_FOLLOW (the path is
                # absolute, so the directory itself is not used)
                os.link(proc, dst, src_dir_fd=self._root_fd, follow_symlinks=True)

            self._publish(link, proc, path)
        finally:
            os.close(fd)
        return f'"{raw.hex()}"'

    def _read(
        self, key: str, path: str, header_only: bool = False, max_bytes: int | None = None
    ) -> tuple[bytes, str, int, float]:
        """``(data, etag, data size, mtime)`` of the object file at ``path``.

        A file without lakeshore's header (a stray or damaged file) is not an error: it
        reads as an object whose data is the whole file and whose etag is a hash of it, so
        the layers above judge the bytes like any other (a record that does not decode is
        failed and overwritten by a conditional write on that etag). Something other than a
        regular file (a link, a pipe, a device) is never followed or read: it reads as an
        empty foreign object whose etag comes from its metadata."""
        # O_NOFOLLOW: a link to /dev/zero must not be read; O_NONBLOCK: a FIFO must not block
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            st = os.lstat(path)  # a symbolic link: never followed
            return b"", _odd_etag(st), 0, st.st_mtime
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "a directory", path)
            if not stat.S_ISREG(st.st_mode):
                return b"", _odd_etag(st), 0, st.st_mtime
            if max_bytes is not None and st.st_size > max_bytes + _HEADER:
                raise too_large(key, self.url, st.st_size - _HEADER, max_bytes)
            # at most what the file held when opened: a file that grows is not followed
            blob = _read_upto(fd, _HEADER if header_only else st.st_size)
            if len(blob) < _HEADER or not blob.startswith(_MAGIC):
                if st.st_size > _HASHED:  # not read whole on every listing
                    return b"" if header_only else blob, _odd_etag(st), st.st_size, st.st_mtime
                if header_only:
                    return b"", _foreign_etag(fd), st.st_size, st.st_mtime
                return blob, _hash_etag(blob), st.st_size, st.st_mtime
        finally:
            os.close(fd)
        etag = f'"{blob[len(_MAGIC) : _HEADER].hex()}"'
        return blob[_HEADER:], etag, st.st_size - _HEADER, st.st_mtime

    def _current_etag(self, key: str, path: str) -> str | None:
        try:
            return self._read(key, path, header_only=True)[1]
        except FileNotFoundError:
            return None

    def _publish(self, op: Callable[[str, str], None], tmp: str, path: str) -> None:
        """Run ``op(tmp, path)``, recreating parent directories a concurrent delete pruned."""
        for _ in range(_DIR_RETRIES):
            try:
                op(tmp, path)
                return
            except FileNotFoundError:
                # makedirs itself can lose a parent to a prune between its steps (it saw
                # _tickets/, a delete emptied and removed it, mkdir of _tickets/4 then fails)
                with contextlib.suppress(FileNotFoundError):
                    os.makedirs(os.path.dirname(path), exist_ok=True)
        raise StoreError(
            f"put {path}", "parent directory kept disappearing", "retry; check for a cleaner"
        )

    # -- the contract ----------------------------------------------------------------------

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        check_key(key, "get")
        try:
            data, etag, _, _ = self._read(key, self._path(key), max_bytes=max_bytes)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise not_found(key, self.url) from None
        except OSError as e:
            raise _os_error("get", key, e) from e
        return data, etag

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        check_key(key, "put")
        data = check_data(data, f"put {key}")
        path = self._path(key)
        if mode.name == "create":
            try:
                made = self._create_unnamed(path, data)
            except FileExistsError:
                raise conflict("put", key, mode, self.url) from None
            except OSError as e:
                raise _os_error("put", key, e) from e
            if made is not None:
                if self.fsync:
                    self._fsync_parent("put", key, path)
                return made
        try:
            tmp, etag = self._write_tmp(data)
        except OSError as e:
            raise _os_error("put", key, e) from e
        published = False
        try:
            if mode.name == "create":
                try:
                    self._publish(os.link, tmp, path)
                except FileExistsError:
                    raise conflict("put", key, mode, self.url) from None
            else:
                with self._locked(key):
                    if mode.name == "if_match" and self._current_etag(key, path) != mode.etag:
                        raise conflict("put", key, mode, self.url)
                    self._publish(os.rename, tmp, path)
                    published = True  # the temp file's name is gone with the rename
        except OSError as e:
            raise _os_error("put", key, e) from e
        finally:
            if not published:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        if self.fsync:
            self._fsync_parent("put", key, path)
        return etag

    def _fsync_parent(self, op: str, key: str, path: str) -> None:
        try:
            self._fsync_dir(os.path.dirname(path))
        except OSError as e:
            raise _os_error(op, key, e) from e

    def _fsync_dir(self, d: str) -> None:
        # The rename/link itself lives in the directory: without this, power loss may undo it.
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self, key: str, if_match: str | None = None) -> None:
        check_key(key, "delete")
        try:
            self._delete(key, if_match)
        except OSError as e:
            raise _os_error("delete", key, e) from e

    def _delete(self, key: str, if_match: str | None) -> None:
        path = self._path(key)
        with self._locked(key):
            if if_match is not None:
                current = self._current_etag(key, path)
                if current is None:
                    return
                if current != if_match:
                    raise conflict("delete", key, PutMode("if_match", if_match), self.url)
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
        self._prune(os.path.dirname(path))

    def _prune(self, d: str) -> None:
        """Remove ``d`` and its parents while they are empty, up to ``objects/``.

        Empty directories would make every later listing slower; a racing writer that loses
        its parent recreates it (see _publish). A directory that held many entries is tried
        at most every ``_CROWDED_S`` seconds: ``rmdir`` of a large directory scans it (ext4
        reads past every deleted entry) while holding its lock, which made each delete of a
        busy queue cost more than the write it tidied. One left empty meanwhile is removed
        by the next listing that walks it (see _walk)."""
        root = self._objects_s
        while len(d) > len(root) and d.startswith(root + "/"):
            if self._crowded and self._crowded.get(d, 0.0) > self._ticks():
                return
            try:
                os.rmdir(d)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    self._note_crowded(d)
                return
            d = os.path.dirname(d)

    def _note_crowded(self, d: str) -> None:
        try:
            size = os.stat(d).st_size
        except OSError:
            return
        if size <= _CROWDED_BYTES:
            return
        now = self._ticks()
        with self._crowded_lock:
            if len(self._crowded) > 4096:  # forget the stale ones: directories come and go
                self._crowded = {k: t for k, t in self._crowded.items() if t > now}
            self._crowded[d] = now + _CROWDED_S

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        base = prefix[: prefix.rfind("/") + 1]  # deepest directory the prefix pins down
        dirs = base.split("/")[:-1]
        start = self._objects_s + "".join("/" + _encode(d) for d in dirs)
        return self._walk(start, base, prefix, start_after, top=True)

    def _walk(
        self, directory: str, dir_key: str, prefix: str, start_after: str | None, top: bool
    ) -> Iterator[ObjectInfo]:
        try:
            with os.scandir(directory) as it:
                entries = []
                for e in it:
                    if e.name.endswith(_SUFFIX):
                        entries.append((_decode(e.name[: -len(_SUFFIX)]), False, e.name))
                    elif e.is_dir(follow_symlinks=False):
                        entries.append((_decode(e.name) + "/", True, e.name))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as e:
            raise _os_error("list", dir_key or "/", e) from e
        if not entries and not top:
            # left empty by a delete whose prune was skipped (see _prune): tidy it now; a
            # writer that loses it to this recreates it
            with contextlib.suppress(OSError):
                os.rmdir(directory)
            return
        # Sorting a directory's entries by "name" for objects and "name/" for subdirectories
        # gives exactly the byte order of the full keys, as S3 lists them.
        entries.sort()
        for sort_name, is_dir, name in entries:
            key = dir_key + sort_name
            if is_dir:
                if not (key.startswith(prefix) or prefix.startswith(key)):
                    continue
                if (
                    start_after is not None
                    and key <= start_after
                    and not start_after.startswith(key)
                ):
                    continue
                yield from self._walk(f"{directory}/{name}", key, prefix, start_after, False)
                continue
            if not key.startswith(prefix) or (start_after is not None and key <= start_after):
                continue
            try:
                _, etag, size, mtime = self._read(key, f"{directory}/{name}", header_only=True)
            except (FileNotFoundError, IsADirectoryError):
                continue  # deleted while we listed (or a stray directory: not an object)
            except OSError as e:
                raise _os_error("list", key, e) from e
            yield ObjectInfo(key, etag, size, mtime)

    def now(self) -> float:
        return self._clock()


_HASHED = 16 << 20  # foreign files up to this size get an etag from their content


def _odd_etag(st: os.stat_result) -> str:
    """The etag of something under objects/ that is not a regular file (never read), or of
    a large foreign file: from its metadata."""
    ident = f"{st.st_mode}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()
    return f'"x{hashlib.blake2b(ident, digest_size=15).hexdigest()}"'


def _foreign_etag(fd: int) -> str:
    """The etag of a file without our header: a hash of its content (read in chunks)."""
    h = hashlib.blake2b(digest_size=16)
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        h.update(chunk)
        offset += len(chunk)
    return f'"{h.hexdigest()}"'


def _hash_etag(blob: bytes) -> str:
    """The same etag as :func:`_foreign_etag`, of bytes already read."""
    return f'"{hashlib.blake2b(blob, digest_size=16).hexdigest()}"'


def _read_upto(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd`` (fewer only at its end)."""
    blob = os.read(fd, n)
    if len(blob) == n or not blob:
        return blob
    parts = [blob]
    got = len(blob)
    while got < n and (more := os.read(fd, n - got)):
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _os_error(op: str, key: str, e: OSError) -> LakeshoreError:
    if e.errno == errno.ENAMETOOLONG:
        return InvalidArgument(
            f"{op} {key}", "a key segment is too long for this filesystem", "use shorter segments"
        )
    return StoreError(
        f"{op} {key}", f"filesystem error: {e.strerror or e}", "check disk space and permissions"
    )
