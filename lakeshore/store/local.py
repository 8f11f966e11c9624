"""``LocalStore``: the store contract on a local directory ("file:///path").

Safe across threads and processes on one machine, with no server to run. Every write goes to
a private temp file and is published atomically, so no reader sees half an object. ``CREATE``
publishes with ``os.link``, which the kernel refuses when the key exists; ``OVERWRITE``,
``if_match`` and ``delete`` run under an ``flock`` on the key's lock stripe, so
check-then-rename is one step for every process. The etag is 16 random bytes in the object's
own header: it changes on every write and is read in the same ``open`` as the data.

No symbolic link below ``objects/`` is ever followed: paths are resolved below a descriptor of
``objects/`` with no link on any part, and files are linked, renamed and unlinked relative to
their folder's descriptor, so what was checked is what is used. A file without the header
reads as an object holding the whole file, for the layers above to judge. Fsync is off by
default (``fsync=True`` or ``?fsync=1``). Layout, name encoding and each operation:
docs/store-contract.md#localstore.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import random
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
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
# a folder to link into, rename into, unlink from (O_PATH: no read permission needed) ...
_FOLDER_FLAGS = getattr(os, "O_PATH", 0) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# ... and one to list or fsync, which needs a readable descriptor
_LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# openat2(2) (Linux 5.6+) resolves a whole path in one call, refusing a symbolic link on any
# part and anything outside the folder it starts from: no more system calls per read than a
# plain open. Its number is 437 on every architecture named here (not on alpha, ia64, mips).
_SYS_OPENAT2 = 437
_OPENAT2_MACHINES = frozenset(
    {"x86_64", "aarch64", "armv7l", "armv8l", "i686", "i386", "ppc64le", "ppc64", "s390x"}
    | {"riscv64", "loongarch64"}
)
_RESOLVE_NO_SYMLINKS_BENEATH = 0x04 | 0x08
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # missing, not a folder, or a link
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
        self._locks_s = str(self._locks)
        self._tmp_s = str(self._tmp)
        self._ticks = time.monotonic
        # CREATE from unnamed temp files where the system has them (see _create_unnamed)
        self._unnamed = hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd")
        self._objects_fd = -1  # every object path is resolved below it (see _open)
        self._crowded: dict[str, float] = {}  # folder under objects/ -> do not prune before
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
        try:
            # the root may be a link (the operator's choice), objects/ may not
            self._objects_fd = os.open(self._objects, _LIST_FLAGS)
        except OSError as e:
            linked = _is_link(-1, str(self._objects))
            raise StoreError(
                f"open {self.url}",
                f"{self._objects} is a symbolic link, which the store never follows"
                if linked
                else f"cannot open {self._objects} ({e.strerror})",
                "make it a real directory (only the root itself may be a link)"
                if linked
                else "fix its permissions",
                path=str(path),
            ) from e
        self._openat2 = _openat2(self._objects_fd)

    def __del__(self) -> None:
        if getattr(self, "_objects_fd", -1) >= 0:
            with contextlib.suppress(OSError):
                os.close(self._objects_fd)

    def location(self) -> tuple[str, dict[str, Any]] | None:
        return self.url, {}

    # -- paths and locks -------------------------------------------------------------------

    def _rel(self, key: str) -> str:
        """The object file of ``key``, relative to ``objects/``."""
        if "%" not in key and _SUFFIX not in key:
            return key + _SUFFIX  # no segment to encode: the common case, without a split
        *dirs, last = key.split("/")
        name = _encode(last) + _SUFFIX
        if not dirs:
            return name
        return f"{'/'.join(map(_encode, dirs))}/{name}"

    def _open(self, dir_fd: int, path: str, flags: int) -> int:
        """Open ``path`` below the folder ``dir_fd`` without following a link on any part
        (``flags`` hold ``O_NOFOLLOW`` for the last).

        Raises:
            OSError: ELOOP when a part is a symbolic link; ENOENT, ENOTDIR and the rest as
                ``open`` raises them.
        """
        if "/" not in path:
            return _open_part(dir_fd, path, flags)
        if self._openat2 is not None:
            return self._openat2(dir_fd, path, flags)
        *folders, last = path.split("/")
        fd = dir_fd
        try:
            for part in folders:
                nxt = _open_part(fd, part, _FOLDER_FLAGS)
                if fd != dir_fd:
                    os.close(fd)
                fd = nxt
            return _open_part(fd, last, flags)
        finally:
            if fd != dir_fd:
                os.close(fd)

    def _folder(self, folder: str, create: bool = False) -> int:
        """A descriptor of ``objects/<folder>``, reached without following a link; the store's
        own for ``""`` (release it with :meth:`_release`). With ``create``, missing folders
        are made on the way.

        Raises:
            OSError: ELOOP: a folder on the way is a link; FileNotFoundError: one is missing
                (with ``create``: pruned by a concurrent delete while it was being made).
        """
        if not folder:
            return self._objects_fd
        try:
            return self._open(self._objects_fd, folder, _FOLDER_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
        parent, _, name = folder.rpartition("/")
        if parent:
            # Most often only the last folder is new (an invocation's <id>/ at its claim):
            # make it in its parent, reached in one resolution, instead of walking the path.
            try:
                parent_fd = self._open(self._objects_fd, parent, _FOLDER_FLAGS)
            except FileNotFoundError:
                parent_fd = -1
            if parent_fd >= 0:
                try:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o777, dir_fd=parent_fd)
                    return _open_part(parent_fd, name, _FOLDER_FLAGS)
                finally:
                    os.close(parent_fd)
        fd = self._objects_fd
        try:
            for part in folder.split("/"):
                try:
                    nxt = _open_part(fd, part, _FOLDER_FLAGS)
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=fd)  # the umask decides, as for makedirs
                    nxt = _open_part(fd, part, _FOLDER_FLAGS)
                self._release(fd)
                fd = nxt
        except BaseException:
            self._release(fd)
            raise
        return fd

    def _release(self, fd: int) -> None:
        if fd != self._objects_fd:
            os.close(fd)

    def _lstat(self, dir_fd: int, path: str) -> os.stat_result:
        """The entry at ``path`` below ``dir_fd`` itself, a link included.

        Raises:
            FileNotFoundError: it is missing, or a folder on the way is a link.
        """
        folder, _, name = path.rpartition("/")
        try:
            fd = self._open(dir_fd, folder, _FOLDER_FLAGS) if folder else dir_fd
        except OSError as e:
            if e.errno in _GONE:
                raise FileNotFoundError(errno.ENOENT, "no such folder", path) from None
            raise
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        finally:
            if fd != dir_fd:
                os.close(fd)

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

    def _create_unnamed(self, rel: str, data: bytes) -> str | None:
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

            def link(_: str, name: str, dst_dir_fd: int) -> None:
                # linkat with AT_SYMLINK_FOLLOW: the magic link names the unnamed file
                os.link(proc, name, dst_dir_fd=dst_dir_fd, follow_symlinks=True)

            self._publish(link, proc, rel)
        finally:
            os.close(fd)
        return f'"{raw.hex()}"'

    def _read(
        self,
        key: str,
        path: str,
        header_only: bool = False,
        max_bytes: int | None = None,
        dir_fd: int = -1,
    ) -> tuple[bytes, str, int, float]:
        """``(data, etag, data size, mtime)`` of the object file at ``path``, below the folder
        ``dir_fd`` (default ``objects/``).

        A file without lakeshore's header (a stray or damaged file) is not an error: it
        reads as an object whose data is the whole file and whose etag is a hash of it, so
        the layers above judge the bytes like any other (a record that does not decode is
        failed and overwritten by a conditional write on that etag). Something other than a
        regular file (a link, a pipe, a device) is never followed or read: it reads as an
        empty foreign object whose etag comes from its metadata. A link in place of a folder
        on the way is no folder of the store: the object is missing (FileNotFoundError)."""
        folder = self._objects_fd if dir_fd < 0 else dir_fd
        # O_NOFOLLOW: a link to /dev/zero must not be read; O_NONBLOCK: a FIFO must not block
        try:
            fd = self._open(folder, path, _READ_FLAGS)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            st = self._lstat(folder, path)  # the link itself, if it is the file's name
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

    def _current_etag(self, key: str, rel: str) -> str | None:
        try:
            return self._read(key, rel, header_only=True)[1]
        except FileNotFoundError:
            return None

    def _publish(self, op: Callable[..., None], tmp: str, rel: str) -> None:
        """Run ``op(tmp, name, dst_dir_fd=<folder>)`` (``os.link``, ``os.rename``) into the
        object's folder, made where missing and never reached through a link, and again
        when a concurrent delete pruned a folder on the way.

        Raises:
            OSError: ELOOP: a folder on the way is a link; the filesystem failed.
            StoreError: the folder kept disappearing.
        """
        folder, _, name = rel.rpartition("/")
        for _ in range(_DIR_RETRIES):
            try:
                # a folder made here can be pruned before it is opened (a delete emptied
                # _tickets/ and removed it between our mkdir of _tickets/ and of _tickets/4)
                fd = self._folder(folder, create=True)
            except FileNotFoundError:
                continue
            try:
                op(tmp, name, dst_dir_fd=fd)
                return
            except FileNotFoundError:
                continue  # pruned after it was opened: a removed folder takes no new names
            finally:
                self._release(fd)
        raise StoreError(
            f"put {rel}", "parent directory kept disappearing", "retry; check for a cleaner"
        )

    # -- the contract ----------------------------------------------------------------------

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        check_key(key, "get")
        try:
            data, etag, _, _ = self._read(key, self._rel(key), max_bytes=max_bytes)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise not_found(key, self.url) from None
        except OSError as e:
            raise _os_error("get", key, e) from e
        return data, etag

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        check_key(key, "put")
        data = check_data(data, f"put {key}")
        rel = self._rel(key)
        if mode.name == "create":
            try:
                made = self._create_unnamed(rel, data)
            except FileExistsError:
                raise conflict("put", key, mode, self.url) from None
            except OSError as e:
                raise _os_error("put", key, e) from e
            if made is not None:
                if self.fsync:
                    self._fsync_parent("put", key, rel)
                return made
        try:
            tmp, etag = self._write_tmp(data)
        except OSError as e:
            raise _os_error("put", key, e) from e
        published = False
        try:
            if mode.name == "create":
                try:
                    self._publish(os.link, tmp, rel)
                except FileExistsError:
                    raise conflict("put", key, mode, self.url) from None
            else:
                with self._locked(key):
                    if mode.name == "if_match" and self._current_etag(key, rel) != mode.etag:
                        raise conflict("put", key, mode, self.url)
                    self._publish(os.rename, tmp, rel)
                    published = True  # the temp file's name is gone with the rename
        except OSError as e:
            raise _os_error("put", key, e) from e
        finally:
            if not published:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        if self.fsync:
            self._fsync_parent("put", key, rel)
        return etag

    def _fsync_parent(self, op: str, key: str, rel: str) -> None:
        # The rename/link itself lives in the directory: without this, power loss may undo it.
        try:
            fd = self._open(self._objects_fd, rel.rpartition("/")[0] or ".", _LIST_FLAGS)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise _os_error(op, key, e) from e

    def delete(self, key: str, if_match: str | None = None) -> None:
        check_key(key, "delete")
        try:
            self._delete(key, if_match)
        except OSError as e:
            raise _os_error("delete", key, e) from e

    def _delete(self, key: str, if_match: str | None) -> None:
        rel = self._rel(key)
        folder, _, name = rel.rpartition("/")
        with self._locked(key):
            if if_match is not None:
                current = self._current_etag(key, rel)
                if current is None:
                    return
                if current != if_match:
                    raise conflict("delete", key, PutMode("if_match", if_match), self.url)
            try:
                fd = self._folder(folder)
            except OSError as e:
                if e.errno in _GONE:
                    return  # missing, or behind a link: nothing of the store's to delete
                raise
            try:
                os.unlink(name, dir_fd=fd)  # a link in the file's place: the link goes
            except FileNotFoundError:
                return
            finally:
                self._release(fd)
        self._prune(folder)

    def delete_many(self, keys: Sequence[str]) -> None:
        """``delete`` of each key, unconditionally, folder by folder: each folder is reached
        once (without following a link) and pruned once, after its last key; every unlink
        still holds its key's lock stripe, as a single delete does.

        Raises:
            InvalidArgument: a key is malformed (nothing is deleted).
            StoreError: the filesystem failed (keys deleted before stay deleted).
        """
        for key in keys:
            check_key(key, "delete")
        by_folder: dict[str, list[tuple[str, str]]] = {}
        for key in keys:
            folder, _, name = self._rel(key).rpartition("/")
            by_folder.setdefault(folder, []).append((key, name))
        for folder, entries in by_folder.items():
            try:
                fd = self._folder(folder)
            except OSError as e:
                if e.errno in _GONE:
                    continue  # missing, or behind a link: nothing of the store's to delete
                raise _os_error("delete", entries[0][0], e) from e
            try:
                for key, name in entries:
                    try:
                        with self._locked(key):
                            os.unlink(name, dir_fd=fd)  # a link in the file's place: it goes
                    except FileNotFoundError:
                        continue
                    except OSError as e:
                        raise _os_error("delete", key, e) from e
            finally:
                self._release(fd)
            self._prune(folder)

    def _prune(self, folder: str) -> None:
        """Remove ``objects/<folder>`` and its parents while they are empty, each from its
        parent's descriptor (a link is never removed through, nor is ``objects/`` itself).

        Empty directories would make every later listing slower; a racing writer that loses
        its parent recreates it (see _publish). A directory that held many entries is tried
        at most every ``_CROWDED_S`` seconds: ``rmdir`` of a large directory scans it (ext4
        reads past every deleted entry) while holding its lock, which made each delete of a
        busy queue cost more than the write it tidied. One left empty meanwhile is removed
        by the next listing that walks it (see _walk)."""
        while folder:
            if self._crowded and self._crowded.get(folder, 0.0) > self._ticks():
                return
            parent, _, name = folder.rpartition("/")
            try:
                fd = self._folder(parent)
            except OSError:
                return
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    self._note_crowded(folder, fd, name)
                return
            finally:
                self._release(fd)
            folder = parent

    def _note_crowded(self, folder: str, parent_fd: int, name: str) -> None:
        try:
            size = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_size
        except OSError:
            return
        if size <= _CROWDED_BYTES:
            return
        now = self._ticks()
        with self._crowded_lock:
            if len(self._crowded) > 4096:  # forget the stale ones: directories come and go
                self._crowded = {k: t for k, t in self._crowded.items() if t > now}
            self._crowded[folder] = now + _CROWDED_S

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        base = prefix[: prefix.rfind("/") + 1]  # deepest directory the prefix pins down
        folder = "/".join(map(_encode, base.split("/")[:-1]))
        return self._list(folder, base, prefix, start_after)

    def _list(
        self, folder: str, base: str, prefix: str, start_after: str | None
    ) -> Iterator[ObjectInfo]:
        try:
            fd = self._open(self._objects_fd, folder or ".", _LIST_FLAGS)
        except OSError as e:
            if e.errno in _GONE:
                return  # nothing there, or a link: no folder of the store
            raise _os_error("list", base or "/", e) from e
        try:
            yield from self._walk(fd, base, prefix, start_after, None)
        finally:
            os.close(fd)

    def _walk(
        self,
        fd: int,
        dir_key: str,
        prefix: str,
        start_after: str | None,
        parent: tuple[int, str] | None,
    ) -> Iterator[ObjectInfo]:
        """List the folder open as ``fd`` (``parent``: its parent's descriptor and its name
        there, None for the folder the listing starts in). Subfolders are opened relative
        to it without following a link, so a link swapped in mid-walk is skipped too."""
        try:
            with os.scandir(fd) as it:
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
        if not entries and parent is not None:
            # left empty by a delete whose prune was skipped (see _prune): tidy it now; a
            # writer that loses it to this recreates it
            with contextlib.suppress(OSError):
                os.rmdir(parent[1], dir_fd=parent[0])
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
                try:
                    child = os.open(name, _LIST_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in _GONE:
                        continue  # deleted while we listed, or a link swapped in
                    raise _os_error("list", key, e) from e
                try:
                    yield from self._walk(child, key, prefix, start_after, (fd, name))
                finally:
                    os.close(child)
                continue
            if not key.startswith(prefix) or (start_after is not None and key <= start_after):
                continue
            try:
                _, etag, size, mtime = self._read(key, name, header_only=True, dir_fd=fd)
            except (FileNotFoundError, IsADirectoryError):
                continue  # deleted while we listed (or a stray directory: not an object)
            except OSError as e:
                raise _os_error("list", key, e) from e
            yield ObjectInfo(key, etag, size, mtime)

    def now(self) -> float:
        return self._clock()

    async def anow(self) -> float:
        return self._clock()  # a local clock: nothing to wait for


def _open_part(dir_fd: int, name: str, flags: int) -> int:
    """Open one name in the folder ``dir_fd`` (``flags`` hold ``O_NOFOLLOW``).

    Raises:
        OSError: ELOOP when it is a symbolic link (with ``O_DIRECTORY`` Linux says ENOTDIR,
            some systems EMLINK: a look at the entry tells), else as ``open`` raises it.
    """
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.EMLINK) and _is_link(dir_fd, name):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        st = os.stat(name, dir_fd=None if dir_fd < 0 else dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISLNK(st.st_mode)


def _openat2(probe_fd: int) -> Callable[[int, str, int], int] | None:
    """``openat2(dir_fd, path, flags)`` refusing a symbolic link on any part of ``path``
    (ELOOP) and any escape from ``dir_fd``, or None where the kernel, the architecture or a
    sandbox's system call filter has no ``openat2``: the caller then walks part by part."""
    if sys.platform != "linux" or os.uname().machine not in _OPENAT2_MACHINES:
        return None
    import ctypes  # only here: the one system call the os module does not offer

    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    # syscall(number, dir_fd, path, &how, sizeof how). No argtypes: converting each argument
    # cost more than the call; the two 64-bit ones are passed ready-made, the kernel reads
    # dir_fd as an int and the bytes go as pointers.
    number, size = ctypes.c_long(_SYS_OPENAT2), ctypes.c_size_t(24)
    # struct open_how {u64 flags, mode, resolve} per flags; without O_NOFOLLOW, because with
    # it O_PATH would open a link at the end instead of refusing it: the resolve flags
    # refuse every link, the last one included
    hows = {
        flags: struct.pack("=QQQ", flags & ~os.O_NOFOLLOW, 0, _RESOLVE_NO_SYMLINKS_BENEATH)
        for flags in (_READ_FLAGS, _FOLDER_FLAGS, _LIST_FLAGS)
    }

    def openat2(dir_fd: int, path: str, flags: int) -> int:
        fd: int = syscall(number, dir_fd, os.fsencode(path), hows[flags], size)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        return fd

    try:
        os.close(openat2(probe_fd, ".", _FOLDER_FLAGS))
    except OSError:  # ENOSYS (before Linux 5.6), EPERM (a seccomp filter), ...
        return None
    return openat2


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
    if e.errno == errno.ELOOP:
        return StoreError(
            f"{op} {key}",
            "a folder on its way under objects/ is a symbolic link, which the store never follows",
            "remove the link (a key's folders must be real directories)",
            key=key,
        )
    return StoreError(
        f"{op} {key}", f"filesystem error: {e.strerror or e}", "check disk space and permissions"
    )
