"""Upstream's plane and its error, over lakeshore.

``Dispatch(path)`` is lakeshore's ``Dispatch`` with upstream's signature and defaults: the
first argument is any lakeshore URL (``":memory:"``, a directory, ``"s3://bucket/prefix"``),
the default is ``":memory:"`` as upstream's, and a retry is claimable at once (upstream has
no backoff). Results that ended badly raise :class:`DispatchError`, as upstream's do.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import lakeshore
from lakeshore.errors import InvalidArgument, JobError, Killed, NotFinished, NotFound
from lakeshore.files.root import data_root

__all__ = ["Dispatch", "DispatchError", "default_dispatch", "translated"]


class DispatchError(RuntimeError):
    """A job ended other than succeeded, an id is unknown, or a claim was lost (upstream's
    one error for all three)."""


class Dispatch(lakeshore.Dispatch):
    """A lakeshore plane spelled as upstream's: ``Dispatch(path=":memory:", *, ns=...)``;
    every other keyword is lakeshore's (``allow_pickle``, ``lease_s``, ...). Its files live
    in the working directory, as upstream's run root, unless the plane is a bucket or
    ``data=`` says otherwise."""

    def __init__(self, path: str = ":memory:", *, ns: str = "default", **options: Any) -> None:
        options.setdefault("retry_backoff_s", 0.0)
        super().__init__(path, ns=ns, **options)
        # upstream's files live under its run root, the working directory when first used:
        # so do a plane's of this machine (a bucket, or data=, keep lakeshore's data root)
        if "data" not in options and not str(path).startswith("s3://"):
            self.plane.resolve_data_root(lambda: data_root(str(Path.cwd())))

    def close(self) -> None:
        """Release the store's resources (upstream's ``Dispatch.close``)."""
        self.store.close()


_default: Dispatch | None = None
_lock = threading.Lock()


def default_dispatch() -> Dispatch:
    """The plane upstream names take when given none: ``$LAKESHORE_URL`` (a lakeshore URL
    here, not upstream's control plane), else lakeshore's embedded default store."""
    global _default
    with _lock:
        if _default is None:
            _default = Dispatch(os.environ.get("LAKESHORE_URL") or lakeshore.DEFAULT_URL)
        return _default


def translated(op: str, inv: str, e: BaseException, timeout: float | None) -> BaseException:
    """The upstream error for a lakeshore one met while reading ``inv``."""
    if isinstance(e, NotFinished):
        return TimeoutError(f"invocation {inv} still {e.details.get('state')!r} after {timeout}s")
    if isinstance(e, Killed):
        return DispatchError(f"invocation {inv} was cancelled")
    if isinstance(e, JobError):
        kind, message = e.details.get("remote_type", ""), e.details.get("remote_message", "")
        error = message if kind == "Nacked" else f"{kind}: {message}"
        if op == "stream":
            return DispatchError(f"stream {inv}: producer raised {error}")
        return DispatchError(f"invocation {inv} failed: {error}")
    if isinstance(e, (NotFound, InvalidArgument)):
        return DispatchError(f"{op}: unknown invocation {inv!r}")
    return e
