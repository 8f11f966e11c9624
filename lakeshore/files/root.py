"""Where a plane's files live (``DataRoot``), and the local folders a worker caches and
stages them in, which must be this user's alone: a folder another user controls could feed
a body their files or receive its outputs."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lakeshore.errors import InvalidArgument
from lakeshore.files.nofollow import NOFOLLOW_DIR

__all__ = [
    "STAGING_NAME",
    "DataRoot",
    "Fence",
    "data_root",
    "discard_staging",
    "exclusive_file",
    "local_name",
    "private_dir",
    "slot_dir",
    "slot_path",
]

log = logging.getLogger("lakeshore.run")

Fence = Callable[[], bool]
"""Asked right before a batch of a body's files is published: True when the attempt still
holds its lease (and has a whole lease ahead), False when it lost it (nothing may be
published); raises a ``LakeshoreError`` (``StoreError``) when the store cannot tell."""


@dataclass(frozen=True)
class DataRoot:
    """Where a plane's files live: an fsspec URL, the options to reach it, and the local
    directory for the cache and staging files (default ``$LAKESHORE_CACHE``, else a
    per-user folder in the system's temporary directory)."""

    url: str
    options: dict[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials
    cache_dir: str = ""

    @property
    def protocol(self) -> str:
        head, sep, _ = self.url.partition("://")
        return head if sep else "file"

    def local_dir(self) -> Path:
        base = self.cache_dir or os.environ.get("LAKESHORE_CACHE") or ""
        if not base:
            base = os.path.join(tempfile.gettempdir(), f"lakeshore-{_user()}")
        return Path(base).expanduser()


def _user() -> str:
    try:
        return str(os.getuid())
    except AttributeError:  # pragma: no cover - Windows
        return os.environ.get("USERNAME", "user")


def data_root(url: str, options: dict[str, Any] | None = None, cache_dir: str = "") -> DataRoot:
    """A data root for ``url`` (a path becomes ``file://``). The fsspec driver is loaded on
    first use, so a plane whose bodies touch no files needs none.

    Raises:
        InvalidArgument: no URL given.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgument("data root", f"no URL given ({url!r})", "e.g. 's3://bucket/data'")
    url = url.strip().rstrip("/") or "/"
    if "://" not in url:
        url = "file://" + os.path.abspath(os.path.expanduser(url))
    elif url.startswith("file://~"):
        url = "file://" + os.path.expanduser(url[len("file://") :])
    return DataRoot(url, dict(options or {}), cache_dir)


# A run's staging name (``<id>-<attempt>``) names its staging folder and is globbed to remove
# it: only plain characters, so an odd name can never reach outside the staging folder.
STAGING_NAME = re.compile(r"[0-9A-Za-z_][0-9A-Za-z_-]{0,63}")


def private_dir(root: DataRoot, sub: str, op: str) -> Path:
    """The folder ``sub`` (``cache`` or ``staging``) of the root's local directory, created
    if needed, after checking that the local directory and ``sub`` are this user's alone.

    Cached objects and staged outputs may be private data, and a folder another user
    controls (a symlink planted in a shared /tmp, a folder they own or may write to) could
    feed a body their files or receive its outputs. Only a real folder owned by this user is
    used; if it is writable by group or others, those bits are removed (``sub``, which holds
    the files, is made 0700).

    Raises:
        InvalidArgument: the folder is a symlink, not a folder, owned by another user, or
            cannot be created.
    """
    base = root.local_dir()
    _own_dir(base, op, 0o022)
    path = base / sub
    _own_dir(path, op, 0o077)
    return path


def _own_dir(path: Path, op: str, strip: int) -> None:
    todo = (
        "point Dispatch(cache_dir=...) or $LAKESHORE_CACHE at a folder of your own "
        "(a real folder, mode 0700), or remove the one in the way"
    )

    def refuse(what: str) -> InvalidArgument:
        return InvalidArgument(op, f"the cache folder {path} {what}", todo, path=str(path))

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise refuse(f"cannot be created ({e})") from None
    try:
        st = os.lstat(path)
    except OSError as e:
        raise refuse(f"cannot be checked ({e})") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" to {os.readlink(path)}"
        except OSError:
            target = ""
        raise refuse(f"is a symlink{target}; lakeshore uses only a real folder of its own")
    if not stat.S_ISDIR(st.st_mode):
        raise refuse("is not a folder")
    getuid = getattr(os, "getuid", None)
    if getuid is None:  # pragma: no cover - Windows: no owners or modes to check this way
        return
    # Check and fix through a handle that cannot follow a symlink swapped in meanwhile.
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW_DIR)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise refuse("was replaced while it was checked") from None
        raise refuse(f"cannot be opened ({e})") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != getuid():
            raise refuse(f"is owned by uid {st.st_uid}, not by this user (uid {getuid()})")
        mode = stat.S_IMODE(st.st_mode)
        if mode & strip:
            os.fchmod(fd, mode & ~strip)
            log.warning(
                "the cache folder %s was open to others (mode %o); made it %o",
                path,
                mode,
                mode & ~strip,
            )
    except OSError as e:
        raise refuse(f"cannot be made private ({e})") from None
    finally:
        os.close(fd)


def exclusive_file(folder: Path) -> Path:
    """A new, empty file of this user's in ``folder`` (created with O_EXCL, mode 0600)."""
    fd, name = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    os.close(fd)
    return Path(name)


def slot_path(full: str) -> str:
    """A local relative path for a full key: a folder per key (named by its digest) holding
    the key's file name. Keys ``a`` and ``a/b`` may both exist in an object store; as plain
    local paths one would have to be a file and a folder at once."""
    return f"{slot_dir(full)}/{local_name(full)}"


def slot_dir(full: str) -> str:
    digest = hashlib.sha256(full.encode()).hexdigest()
    return f"{digest[:2]}/{digest[2:24]}"


def local_name(full: str) -> str:
    """The key's file name, kept so that tools that look at extensions still work."""
    name = full.rpartition("/")[2]
    if len(name.encode()) > 120:  # S3 allows names no local filesystem does: keep the suffix
        digest = hashlib.sha256(full.encode()).hexdigest()
        _, dot, ext = name.rpartition(".")
        name = f"{digest[:32]}.{ext}" if dot and 0 < len(ext) <= 16 else digest[:32]
    return name


def discard_staging(root: DataRoot, staging_name: str) -> None:
    """Remove the staging folders of a run that was killed before it could clean up (none
    if the local directory is not this user's own)."""
    if not STAGING_NAME.fullmatch(staging_name):  # '/', '..' or '*' would reach past it
        return
    try:
        base = private_dir(root, "staging", "discard staging")
    except InvalidArgument:
        return
    for path in base.glob(f"{staging_name}-*"):
        shutil.rmtree(path, ignore_errors=True)
