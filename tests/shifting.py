"""Store wrappers for schedule tests: a store clock the test moves (and skews per process),
a process that dies at a chosen write, and a log of the requests a store served."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from lakeshore.store import ObjectInfo, PutMode, Store
from lakeshore.store.base import OVERWRITE
from tests.forwarding import Forwarding


class Moved:
    """Seconds added to a store's clock, moved by the test (shared by several stores). A
    frozen one stands still at ``frozen`` + ``by`` however long the test takes, so that
    what is due depends on what the test did, never on how busy the machine is."""

    def __init__(self, by: float = 0.0, frozen: float | None = None) -> None:
        self.by, self.frozen = by, frozen


class Shifted(Forwarding):
    """``inner`` with its clock moved by ``moved.by`` (time passing, shared) plus ``skew``
    (this process's clock off from the others')."""

    def __init__(self, inner: Store, moved: Moved, skew: float = 0.0) -> None:
        super().__init__(inner)
        self.moved, self.skew = moved, skew

    def now(self) -> float:
        base = self.moved.frozen if self.moved.frozen is not None else self.inner.now()
        return base + self.moved.by + self.skew


class Crash(BaseException):
    """A process dying at a request: nothing after it runs (not an error lakeshore handles)."""


class Dying(Shifted):
    """A firer that dies at its first ``put`` whose key ``match``es: before the request, or
    after it landed (``after``)."""

    def __init__(
        self, inner: Store, moved: Moved, match: Callable[[str], bool], after: bool = False
    ) -> None:
        super().__init__(inner, moved)
        self.match, self.after = match, after
        self.died = False

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        if self.died or not self.match(key):
            return self.inner.put(key, data, mode)
        self.died = True
        if self.after:
            self.inner.put(key, data, mode)
        raise Crash(key)


class Logged(Shifted):
    """Logs every request as ``(verb, key or prefix)``."""

    def __init__(self, inner: Store, moved: Moved | None = None) -> None:
        super().__init__(inner, moved or Moved())
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def _note(self, verb: str, key: str) -> None:
        with self._lock:
            self.log.append((verb, key))

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self._note("GET", key)
        return self.inner.get(key, max_bytes)

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        self._note("PUT", key)
        return self.inner.put(key, data, mode)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self._note("DELETE", key)
        self.inner.delete(key, if_match)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._note("LIST", prefix)
        return self.inner.list(prefix, start_after)

    def count(self, verb: str, has: str = "") -> int:
        with self._lock:
            return sum(1 for v, k in self.log if v == verb and has in k)

    def requests(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.log)

    def clear(self) -> Any:
        with self._lock:
            self.log.clear()
