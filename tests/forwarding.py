"""A store that hands every verb to another one: the base of the tests' store wrappers,
which override only the verbs they inject something into."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from lakeshore.store import ObjectInfo, PutMode, Store
from lakeshore.store.base import OVERWRITE


class Forwarding(Store):
    def __init__(self, inner: Store) -> None:
        self.inner, self.url = inner, inner.url

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        return self.inner.get(key, max_bytes)

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        return self.inner.put(key, data, mode)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self.inner.delete(key, if_match)

    def delete_many(self, keys: Sequence[str]) -> None:
        self.inner.delete_many(keys)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)

    def now(self) -> float:
        return self.inner.now()

    def location(self) -> tuple[str, dict[str, Any]] | None:
        return self.inner.location()

    def probe_within(self, prefix: str) -> None:
        self.inner.probe_within(prefix)

    def on_write(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        return self.inner.on_write(callback)


class AsyncDriven(Forwarding):
    """Every verb that has an async spelling goes through it (``aget``, ``aput``, ``anow``),
    each call in an event loop of its own: the store contract suite run over this wrapper
    holds the async verbs to the same contract as the blocking ones."""

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        return asyncio.run(self.inner.aget(key, max_bytes))

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        return asyncio.run(self.inner.aput(key, data, mode))

    def now(self) -> float:
        return asyncio.run(self.inner.anow())
