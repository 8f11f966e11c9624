"""``LocalStore``: the store contract on a local directory ("file:///path").

Safe across threads and processes on one machine:

* every write goes to a private temp file first and is published atomically, so a reader
  never sees half an object;
* ``CREATE`` publishes with ``os.link``, which fails if the key exists — atomic without a lock;
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
import io
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

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

    def files_location(self) -> tuple[str, dict[str, Any]]:
        return self.url, {}

    # -- paths and locks -------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        *dirs, last = key.split("/")
        return self._objects.joinpath(*map(_encode, dirs), _encode(last) + _SUFFIX)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        stripe = hashlib.blake2b(key.encode(), digest_size=1).digest()[0]  # 1 of 256
        # A fresh open per acquisition: flock conflicts between open file descriptions, so
        # threads of one process exclude each other exactly like separate processes do.
        fd = os.open(self._locks / f"{stripe:02x}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _write_tmp(self, data: bytes) -> tuple[Path, str]:
        raw = secrets.token_bytes(16)
        tmp = self._tmp / f"{raw.hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + raw + data)
                f.flush()  # a write after the utime would set the wall clock's time again
                # listings report the store's clock, not the wall clock (see now())
                t = self._clock()
                os.utime(f.fileno(), (t, t))
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return tmp, f'"{raw.hex()}"'

    def _read(
        self, key: str, path: Path, header_only: bool = False, max_bytes: int | None = None
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
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            st = os.lstat(path)  # a symbolic link: never followed
            return b"", _odd_etag(st), 0, st.st_mtime
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "a directory", str(path))
            if not stat.S_ISREG(st.st_mode):
                return b"", _odd_etag(st), 0, st.st_mtime
            if max_bytes is not None and st.st_size > max_bytes + _HEADER:
                raise too_large(key, self.url, st.st_size - _HEADER, max_bytes)
            # at most what the file held when opened: a file that grows is not followed
            blob = f.read(_HEADER) if header_only else f.read(st.st_size)
            if len(blob) < _HEADER or not blob.startswith(_MAGIC):
                if st.st_size > _HASHED:  # not read whole on every listing
                    return b"" if header_only else blob, _odd_etag(st), st.st_size, st.st_mtime
                if header_only:
                    f.seek(0)
                    return b"", _foreign_etag(f), st.st_size, st.st_mtime
                return blob, _foreign_etag(io.BytesIO(blob)), st.st_size, st.st_mtime
        etag = f'"{blob[len(_MAGIC) : _HEADER].hex()}"'
        return blob[_HEADER:], etag, st.st_size - _HEADER, st.st_mtime

    def _current_etag(self, key: str, path: Path) -> str | None:
        try:
            return self._read(key, path, header_only=True)[1]
        except FileNotFoundError:
            return None

    def _publish(self, op: Callable[[Path, Path], None], tmp: Path, path: Path) -> None:
        """Run ``op(tmp, path)``, recreating parent directories a concurrent delete pruned."""
        for _ in range(_DIR_RETRIES):
            try:
                op(tmp, path)
                return
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
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
        try:
            tmp, etag = self._write_tmp(data)
        except OSError as e:
            raise _os_error("put", key, e) from e
        try:
            if mode.kind == "create":
                try:
                    self._publish(os.link, tmp, path)
                except FileExistsError:
                    raise conflict("put", key, mode, self.url) from None
            else:
                with self._locked(key):
                    if mode.kind == "if_match" and self._current_etag(key, path) != mode.etag:
                        raise conflict("put", key, mode, self.url)
                    self._publish(os.rename, tmp, path)
        except OSError as e:
            raise _os_error("put", key, e) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        if self.fsync:
            try:
                self._fsync_dir(path.parent)
            except OSError as e:
                raise _os_error("put", key, e) from e
        return etag

    def _fsync_dir(self, d: Path) -> None:
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
                path.unlink()
            except FileNotFoundError:
                return
        self._prune(path.parent)

    def _prune(self, d: Path) -> None:
        # Empty directories would make every later listing slower; a racing writer that loses
        # its parent recreates it (see _publish).
        while d != self._objects and self._objects in d.parents:
            try:
                d.rmdir()
            except OSError:
                return
            d = d.parent

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        base = prefix[: prefix.rfind("/") + 1]  # deepest directory the prefix pins down
        start = self._objects.joinpath(*map(_encode, base.split("/")[:-1]))
        return self._walk(start, base, prefix, start_after)

    def _walk(
        self, directory: Path, dir_key: str, prefix: str, start_after: str | None
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
                yield from self._walk(directory / name, key, prefix, start_after)
                continue
            if not key.startswith(prefix) or (start_after is not None and key <= start_after):
                continue
            try:
                _, etag, size, mtime = self._read(key, directory / name, header_only=True)
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


def _foreign_etag(f: BinaryIO) -> str:
    """The etag of a file without our header: a hash of its content (read in chunks)."""
    h = hashlib.blake2b(digest_size=16)
    while chunk := f.read(1 << 20):
        h.update(chunk)
    return f'"{h.hexdigest()}"'


def _os_error(op: str, key: str, e: OSError) -> LakeshoreError:
    if e.errno == errno.ENAMETOOLONG:
        return InvalidArgument(
            f"{op} {key}", "a key segment is too long for this filesystem", "use shorter segments"
        )
    return StoreError(
        f"{op} {key}", f"filesystem error: {e.strerror or e}", "check disk space and permissions"
    )
