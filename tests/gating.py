"""Deterministic races: a store wrapper that stops one named thread at an exact request
until the test lets it go (:class:`Gate`), and a thread whose result or error the test
collects (:class:`Run`)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lakeshore.store import ObjectInfo, PutMode, Store
from lakeshore.store.base import OVERWRITE

WAIT_S = 60.0  # the longest a test waits for a thread to reach a trap (a bug, not a race)


@dataclass
class Trap:
    """Stop the thread named ``thread`` at its first ``verb`` on a key that ``match``es,
    before the request (or after it, with ``after``), until ``go`` is set."""

    verb: str
    match: Callable[[str], bool]
    thread: str
    after: bool = False
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def wait(self) -> None:
        assert self.reached.wait(WAIT_S), f"never reached {self.verb} in {self.thread}"


class Gate(Store):
    """Delegates to ``inner``; stops threads at traps and counts requests."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.url = inner, inner.url
        self.traps: list[Trap] = []
        self.counts: Counter[str] = Counter()

    def trap(
        self, verb: str, match: Callable[[str], bool], thread: str, after: bool = False
    ) -> Trap:
        t = Trap(verb, match, thread, after)
        self.traps.append(t)
        return t

    def _stop(self, verb: str, key: str, after: bool) -> None:
        me = threading.current_thread().name
        for t in self.traps:
            mine = (t.verb, t.thread, t.after) == (verb, me, after)
            if mine and not t.reached.is_set() and t.match(key):
                t.reached.set()
                assert t.go.wait(WAIT_S), "the test never let the thread go"

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self.counts["GET"] += 1
        self._stop("GET", key, False)
        try:
            return self.inner.get(key, max_bytes)
        finally:
            self._stop("GET", key, True)

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        self.counts["PUT"] += 1
        self._stop("PUT", key, False)
        try:
            return self.inner.put(key, data, mode)
        finally:
            self._stop("PUT", key, True)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self.counts["DELETE"] += 1
        self._stop("DELETE", key, False)
        try:
            self.inner.delete(key, if_match)
        finally:
            self._stop("DELETE", key, True)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        self.counts["LIST"] += 1
        return self.inner.list(prefix, start_after)

    def now(self) -> float:
        return self.inner.now()

    def location(self) -> tuple[str, dict[str, Any]] | None:
        return self.inner.location()


class Run:
    """Run ``fn`` in a thread named ``name``; ``result()`` returns what it returned or
    raises what it raised."""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None

        def body() -> None:
            try:
                self.value = fn()
            except BaseException as e:
                self.error = e

        self.thread = threading.Thread(target=body, name=name, daemon=True)
        self.thread.start()

    def result(self) -> Any:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.value
