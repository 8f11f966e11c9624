"""The object-store contract every backend implements.

Six verbs, and conditional writes are a *mode* of ``put`` rather than extra verbs: ``get``,
``put`` (``OVERWRITE``, ``CREATE`` or ``if_match(etag)``; a lost condition raises
:class:`~lakeshore.errors.Conflict`), ``delete`` (an absent key is never an error),
``delete_many``, ``list`` (lazy, ascending by UTF-8 byte order) and ``now``, the store's
clock, in which leases are judged so that a worker with a skewed clock cannot take over a
live lease. Keys are checked here (:func:`check_key`) the same way for every backend.

Etags change on every write of different bytes; whether identical bytes change them depends
on the backend (S3's is a content hash), so callers that need ABA safety make their bytes
unique (records carry ``rev`` and a write id). Backends translate their own failures into the
lakeshore error tree.

The verbs, the optional hooks and the error tree: docs/store-contract.md#the-store-contract.
"""

from __future__ import annotations

import abc
import asyncio
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lakeshore.errors import Conflict, InvalidArgument, NotFound, TooLarge

__all__ = [
    "CREATE",
    "MAX_KEY_BYTES",
    "OVERWRITE",
    "ObjectInfo",
    "PutMode",
    "Store",
    "check_data",
    "check_key",
    "check_prefix",
    "conflict",
    "if_match",
    "not_found",
]

MAX_KEY_BYTES = 1024  # S3's limit; every backend enforces it so behaviour never differs


_RENAMED_HOOKS = {
    "files_location": "location() -> (url, options) | None",
    "pause": "on_write(callback); waiting is lakeshore.protocol.polling.pause",
}


@dataclass(frozen=True, slots=True)
class PutMode:
    """How ``put`` treats an existing object. Build with ``OVERWRITE``, ``CREATE`` or
    :func:`if_match`."""

    name: Literal["overwrite", "create", "if_match"]
    etag: str | None = None

    def __str__(self) -> str:
        return f"if_match({self.etag})" if self.name == "if_match" else self.name

    @property
    def kind(self) -> str:
        """Deprecated since 0.5: ``name``."""
        warnings.warn("PutMode.kind is now PutMode.name", DeprecationWarning, stacklevel=2)
        return self.name


OVERWRITE = PutMode("overwrite")
CREATE = PutMode("create")


def if_match(etag: str) -> PutMode:
    """Mode for a compare-and-swap: write only if the object's current etag is ``etag``.

    Raises:
        InvalidArgument: ``etag`` is empty.
    """
    if not isinstance(etag, str) or not etag:
        raise InvalidArgument(
            "if_match",
            f"etag must be a non-empty string, got {etag!r}",
            "pass the etag get() returned",
        )
    return PutMode("if_match", etag)


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One entry of a listing."""

    key: str
    etag: str
    size: int
    last_modified: float  # seconds since the epoch, in the store's clock


def check_key(key: str, op: str = "key") -> str:
    """Validate an object key and return it.

    Keys are relative POSIX-style paths: non-empty segments separated by ``/``, no ``.`` or
    ``..`` segment, no leading or trailing slash, no NUL or control characters, at most 1024
    bytes of UTF-8. The same rules hold on every backend so a key that works on a laptop works
    on S3 and cannot escape a local store's directory.

    Raises:
        InvalidArgument: the key breaks one of the rules.
    """
    if not isinstance(key, str):
        raise InvalidArgument(op, f"key must be a str, got {type(key).__name__}", "pass a str key")
    problem = _key_problem(key)
    if problem:
        raise InvalidArgument(
            op,
            f"invalid key {key!r}: {problem}",
            "use a relative path of non-empty segments like 'a/b/c'",
            key=key,
        )
    return key


def check_prefix(prefix: str, op: str = "list") -> str:
    """Validate a listing prefix: empty, or a key-like string that may end with ``/``.

    Raises:
        InvalidArgument: the prefix could never match a valid key.
    """
    if prefix == "":
        return prefix
    if not isinstance(prefix, str):
        raise InvalidArgument(
            op, f"prefix must be a str, got {type(prefix).__name__}", "pass a str"
        )
    check_key(prefix[:-1] if prefix.endswith("/") else prefix, op)
    return prefix


# A whole valid key in one match: segments of anything but "/" and control characters, none
# of them "." or "..". Keys are checked on every store call: the per-character Python loop
# of _key_problem cost more than a put to the memory store.
_SEGMENT = r"(?!\.\.?(?:/|\Z))[^/\x00-\x1f\x7f]+"
_VALID_KEY = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*\Z")


def _key_problem(key: str) -> str | None:
    if _VALID_KEY.match(key) and (
        len(key) * 4 <= MAX_KEY_BYTES  # no str this short is over the limit in UTF-8
        or len(key.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES
    ):
        return None
    return _key_problem_of(key)


def _key_problem_of(key: str) -> str | None:
    """What is wrong with ``key`` (None if nothing): the rules one by one, for the message."""
    if not key:
        return "it is empty"
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"it is longer than {MAX_KEY_BYTES} bytes"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        return "it contains a control character"
    if key.startswith("/") or key.endswith("/"):
        return "it starts or ends with '/'"
    for segment in key.split("/"):
        if segment == "":
            return "it has an empty segment ('//')"
        if segment in (".", ".."):
            return f"it has a {segment!r} segment"
    return None


class Store(abc.ABC):
    """Abstract object store. See the module docstring for the contract.

    Implementations are safe to share between threads. ``url`` describes the store for
    messages and for ``open_store`` round trips.
    """

    url: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # 0.4.0's hooks: an override of one would now be silently ignored (files would move)
        for old, new in _RENAMED_HOOKS.items():
            if old in vars(cls):
                raise TypeError(
                    f"{cls.__qualname__} defines {old}(), which stores no longer have: "
                    f"implement {new} instead"
                )

    @abc.abstractmethod
    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        """Return ``(data, etag)`` of ``key``. With ``max_bytes``, an object larger than
        that is not read (anything in the store may be hostile: a huge object must not
        exhaust a reader's memory).

        Raises:
            NotFound: the key does not exist.
            TooLarge: the object is larger than ``max_bytes``.
            InvalidArgument: the key is malformed.
            StoreError: the backend failed (``StoreUnavailable`` after retries).
        """

    @abc.abstractmethod
    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        """Write ``data`` under ``key`` according to ``mode``; return the new etag.

        Raises:
            Conflict: ``mode`` is ``CREATE`` and the key exists, or ``if_match`` and the
                current etag differs or the key is absent.
            InvalidArgument: the key or data is malformed.
            StoreError: the backend failed (``StoreUnavailable`` after retries).
        """

    @abc.abstractmethod
    def delete(self, key: str, if_match: str | None = None) -> None:
        """Delete ``key``; an absent key is not an error.

        Raises:
            Conflict: ``if_match`` is given and the object exists with another etag.
            InvalidArgument: the key is malformed.
            StoreError: the backend failed.
        """

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete every key in ``keys``, unconditionally; absent keys are not an error. One
        request per 1000 keys where the backend has a batch delete (S3's ``DeleteObjects``),
        else one ``delete`` each. Keys deleted before a failure stay deleted.

        Raises:
            InvalidArgument: a key is malformed (nothing is deleted).
            StoreError: the backend failed.
        """
        for key in keys:
            check_key(key, "delete")
        for key in keys:
            self.delete(key)

    @abc.abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Yield the objects whose key starts with ``prefix``, ascending, strictly after
        ``start_after`` when given. Pages are fetched lazily as the iterator advances.

        Raises:
            InvalidArgument: the prefix is malformed.
            StoreError: the backend failed.
        """

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock, in seconds since the epoch.

        Raises:
            StoreError: the clock could not be read (S3: no response yet and the store is
                unreachable).
        """

    # -- the async verbs: an optional capability (docs/store-contract.md#async-verbs) ---------

    @property
    def native_async(self) -> bool:
        """Whether :meth:`aget`, :meth:`aput` and :meth:`anow` run on an async client now
        (no thread per call); False when they run the blocking verb in a thread."""
        return False

    async def aget(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        """:meth:`get`, awaited: the same result and errors. By default ``get`` runs in a
        thread; a backend with an async client overrides it.

        Raises:
            as :meth:`get`.
        """
        return await asyncio.to_thread(self.get, key, max_bytes)

    async def aput(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        """:meth:`put`, awaited: the same modes, result and errors. By default ``put`` runs
        in a thread; a backend with an async client overrides it.

        Raises:
            as :meth:`put`.
        """
        return await asyncio.to_thread(self.put, key, data, mode)

    async def anow(self) -> float:
        """:meth:`now`, awaited. By default ``now`` runs in a thread.

        Raises:
            as :meth:`now`.
        """
        return await asyncio.to_thread(self.now)

    def probe_within(self, prefix: str) -> None:  # noqa: B027 - optional hook
        """Say where requests of the store's own making belong: a prefix this client is
        granted. S3 reads its clock with one LIST there (least-privilege policies grant
        listing only inside a namespace); stores that send no such requests ignore it.

        Raises:
            InvalidArgument: the prefix is malformed.
        """

    def location(self) -> tuple[str, dict[str, Any]] | None:
        """Where this store keeps its objects, for a filesystem client (fsspec) that should
        keep other things beside them: a URL and the options that reach it with this store's
        endpoint and credentials. ``None`` when no filesystem can reach that place. Options
        may hold credentials: never log them."""
        return None

    def on_write(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Have ``callback`` called after every write this store makes (put, delete), so a
        waiter in this process learns of it at once instead of at its next poll. Returns the
        function that cancels the callback, or ``None`` when this store cannot see every
        write (another process may write to the same place): then polling is the only way
        to learn. The callback runs on the writer's thread once the write is done, so it
        should only signal (set an event); one that raises is logged, and neither fails the
        write nor keeps other callbacks from running. Cancelling twice is harmless."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing
        """Release connections or file handles. The store must not be used afterwards."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def check_data(data: bytes, op: str) -> bytes:
    """Accept bytes-like data and return ``bytes``.

    Raises:
        InvalidArgument: ``data`` is not bytes-like.
    """
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise InvalidArgument(op, f"data must be bytes, got {type(data).__name__}", "encode it first")


def conflict(op: str, key: str, mode: PutMode | str, where: str) -> Conflict:
    """The standard error for a lost condition on ``key``."""
    return Conflict(
        f"{op} {key}",
        f"condition {mode} did not hold on {where}",
        "someone else wrote first: re-read the object and decide again",
        key=key,
        condition=str(mode),
    )


def not_found(key: str, where: str, op: str = "get") -> NotFound:
    """The standard error for an absent key."""
    return NotFound(
        f"{op} {key}",
        f"no object under this key in {where}",
        "check the key, or create the object first",
        key=key,
    )


def too_large(key: str, where: str, size: int, limit: int) -> TooLarge:
    """The standard error for an object over a reader's ``max_bytes``."""
    return TooLarge(
        f"get {key}",
        f"the object is {size} bytes in {where}, more than the {limit} this reader allows",
        "it was not read; if lakeshore did not write it, delete it",
        key=key,
        size=size,
        limit=limit,
    )
