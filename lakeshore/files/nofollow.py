"""A ``file://`` data root walked one folder at a time, never through a link.

A data root may be shared by users who do not trust each other (producers stage inputs,
workers write outputs). A link planted below the root (``job1/out`` -> someone's ~/.ssh)
would lead a write or a read outside it, and a check of the path followed by a use of the
same path can be raced. So every folder is opened relative to the one above it (openat with
O_NOFOLLOW | O_DIRECTORY), and the file itself is opened, created and renamed relative to
its folder's descriptor: what was checked is what is used.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from pathlib import Path

__all__ = ["NOFOLLOW_DIR", "READ_NOFOLLOW", "link_part", "open_last", "put_local", "walk"]

NOFOLLOW_DIR = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_DIRECTORY", 0)


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


_WALK_DIR = os.O_RDONLY | NOFOLLOW_DIR | _CLOEXEC


READ_NOFOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC


class _LinkFound(OSError):
    """A symbolic link below a ``file://`` root (``part``: the path to it, from the root)."""

    def __init__(self, part: str) -> None:
        super().__init__(errno.ELOOP, "a symbolic link", part)
        self.part = part


def link_part(e: BaseException) -> str | None:
    """The path (from the root) to the symbolic link that stopped a walk, when ``e`` is that
    refusal; None for any other error."""
    return e.part if isinstance(e, _LinkFound) else None


def _which(e: OSError, folder: int, name: str, part: str) -> OSError:
    """``e`` from opening ``name`` without following it: a link (``_LinkFound``), or the
    error as it was. O_NOFOLLOW reports a link as ELOOP, and with O_DIRECTORY some systems
    say ENOTDIR instead; a look at the entry itself tells which."""
    if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return e
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return e
    return _LinkFound(part) if stat.S_ISLNK(st.st_mode) else e


def walk(base: str, full: str, create: bool) -> tuple[int, str, bool]:
    """Open the folder that holds ``full`` below the root folder ``base``, one part at a time
    and without following a link (folders are created when ``create``). Returns its
    descriptor (the caller closes it), the file name, and whether the path is *private*:
    every folder on the way, the root included, belongs to this user and is writable by
    nobody else, so no one else can redirect it later.

    The root itself is opened as configured, links included: it is the operator's choice.

    Raises:
        _LinkFound: a part is a symbolic link.
        OSError: a part is missing (FileNotFoundError), a file (NotADirectoryError), or the
            filesystem failed.
    """
    if create:
        os.makedirs(base, exist_ok=True)
    *folders, name = full.split("/")
    fd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    try:
        private = _private(fd)
        for i, part in enumerate(folders):
            nxt = _open_folder(fd, part, "/".join(folders[: i + 1]), create)
            os.close(fd)
            fd = nxt
            private = private and _private(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, name, private


def _open_folder(fd: int, part: str, path: str, create: bool) -> int:
    for _ in range(8):  # a folder removed between our mkdir and our open: make it again
        try:
            return os.open(part, _WALK_DIR, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as e:
            raise _which(e, fd, part, path) from None
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o777, dir_fd=fd)  # the umask decides, as for any new folder
    raise FileNotFoundError(errno.ENOENT, "a folder kept disappearing", path)


def open_last(folder: int, name: str, flags: int, part: str = "") -> int:
    try:
        return os.open(name, flags, dir_fd=folder)
    except OSError as e:
        raise _which(e, folder, name, part or name) from None


def _private(fd: int) -> bool:
    getuid = getattr(os, "geteuid", None)
    if getuid is None:  # pragma: no cover - Windows: no owners or modes to check this way
        return True
    st = os.fstat(fd)
    return st.st_uid == getuid() and not stat.S_IMODE(st.st_mode) & 0o022


def put_local(path: Path, base: str, full: str) -> None:
    """Publish the staged file ``path`` at ``full`` below the ``file://`` root ``base``:
    copied into a fresh file beside the target, then renamed over it, both relative to the
    folder's descriptor. A reader sees the old file or the new one, never half of one; a
    link at the target's name is replaced, never written through.

    Raises:
        _LinkFound: a folder on the way is a symbolic link.
        OSError: the filesystem refused or failed.
    """
    folder, name, _ = walk(base, full, create=True)
    try:
        tmp = f".lakeshore-{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
        out = os.open(tmp, flags, 0o666, dir_fd=folder)
        try:
            with os.fdopen(out, "wb") as dst, open(path, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
            # unlike a move, a rename never puts the file *into* a folder of that name
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
    finally:
        os.close(folder)
