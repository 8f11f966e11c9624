"""``MemoryStore``: the whole store in one process's memory (":memory:").

Per instance (two ``MemoryStore()`` share nothing) and thread-safe: one lock makes every verb
atomic, so compare-and-swap races between threads behave exactly like a correct S3 server.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

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
from lakeshore.store.clock import TickClock

log = logging.getLogger(__name__)

__all__ = ["MemoryStore"]

_PAGE = 1000  # entries copied out of the lock at a time, so a long listing never blocks writers


@dataclass(frozen=True, slots=True)
class _Obj:
    data: bytes
    etag: str
    mtime: float


class MemoryStore(Store):
    """An in-process store. Etags are unique per write, so they change even when the bytes
    do not (stricter than S3)."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self.url = ":memory:"
        self._lock = threading.Lock()
        # called after every write; replaced, never changed in place, so a writer can call
        # the ones it read without holding the lock
        self._watchers: tuple[tuple[object, Callable[[], None]], ...] = ()
        self._objs: dict[str, _Obj] = {}
        self._keys: list[str] = []  # sorted; str order is code-point order = UTF-8 byte order
        self._counter = itertools.count(1)
        self._instance = f"{id(self):x}"
        self._files = secrets.token_hex(6)  # ids of dead objects come back; this does not
        self._clock = TickClock(wall=wall_clock)  # a step of the wall clock does not move it

    def location(self) -> tuple[str, dict[str, Any]] | None:
        # fsspec's memory filesystem is shared by the process: one folder per store.
        return f"memory://lakeshore-{self._files}", {}

    def _etag(self) -> str:
        return f'"m{self._instance}-{next(self._counter)}"'

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        check_key(key, "get")
        with self._lock:
            obj = self._objs.get(key)
        if obj is None:
            raise not_found(key, self.url)
        if max_bytes is not None and len(obj.data) > max_bytes:
            raise too_large(key, self.url, len(obj.data), max_bytes)
        return obj.data, obj.etag

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        check_key(key, "put")
        data = check_data(data, f"put {key}")
        with self._lock:
            current = self._objs.get(key)
            if mode.name == "create" and current is not None:
                raise conflict("put", key, mode, self.url)
            if mode.name == "if_match" and (current is None or current.etag != mode.etag):
                raise conflict("put", key, mode, self.url)
            obj = _Obj(data, self._etag(), self._clock())
            if current is None:
                bisect.insort(self._keys, key)
            self._objs[key] = obj
        self._notify()
        return obj.etag

    def delete(self, key: str, if_match: str | None = None) -> None:
        check_key(key, "delete")
        with self._lock:
            current = self._objs.get(key)
            if current is None:
                return
            if if_match is not None and current.etag != if_match:
                raise conflict("delete", key, PutMode("if_match", if_match), self.url)
            del self._objs[key]
            del self._keys[bisect.bisect_left(self._keys, key)]
        self._notify()

    def _notify(self) -> None:
        # after the lock is released: a watcher may read the store, and one that fails
        # neither undoes the write nor keeps the others from hearing of it
        for _, callback in self._watchers:
            try:
                callback()
            except Exception:
                log.exception("a watcher of %s failed", self.url)

    def on_write(self, callback: Callable[[], None]) -> Callable[[], None]:
        token = object()
        with self._lock:
            self._watchers = (*self._watchers, (token, callback))

        def cancel() -> None:
            with self._lock:
                self._watchers = tuple(w for w in self._watchers if w[0] is not token)

        return cancel

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        cursor = prefix if start_after is None else max(prefix, start_after)
        inclusive = start_after is None or start_after < prefix
        while True:
            with self._lock:
                i = (bisect.bisect_left if inclusive else bisect.bisect_right)(self._keys, cursor)
                page = [(k, self._objs[k]) for k in self._keys[i : i + _PAGE]]
            for key, obj in page:
                if not key.startswith(prefix):
                    return  # sorted: the prefix range is contiguous and now exhausted
                yield ObjectInfo(key, obj.etag, len(obj.data), obj.mtime)
            if len(page) < _PAGE:
                return
            cursor, inclusive = page[-1][0], False

    def now(self) -> float:
        return self._clock()

    async def anow(self) -> float:
        return self._clock()  # a local clock: nothing to wait for
