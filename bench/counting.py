"""A store wrapper that counts requests by S3 price class, for the benchmarks."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence

from lakeshore.store import ObjectInfo, PutMode, Store
from lakeshore.store.base import OVERWRITE
from tests.forwarding import Forwarding

# S3 Standard, us-east-1: PUT, COPY, POST, LIST per 1000; GET, SELECT per 1000; DELETE free
PRICE_CLASS_A = 0.005 / 1000
PRICE_CLASS_B = 0.0004 / 1000


class Counting(Forwarding):
    """Counts the requests a store serves: ``PUT``, ``LIST``, ``BATCH_DELETE`` (class A: a
    batch delete is a POST), ``GET`` (class B), ``DELETE`` (free). A LIST is counted once per
    call (one page per 1000 keys). Also counts the keys listings return (``keys``) and the
    bytes GETs return (``bytes``), and logs each GET's key and bound in ``gets``."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = Counter()
        self.gets: list[tuple[str, int | None]] = []
        self._lock = threading.Lock()

    def _count(self, verb: str, n: int = 1) -> None:
        with self._lock:
            self.counts[verb] += n

    def get(self, key: str, max_bytes: int | None = None) -> tuple[bytes, str]:
        self._count("GET")
        with self._lock:
            self.gets.append((key, max_bytes))
        data, etag = self.inner.get(key, max_bytes)
        self._count("bytes", len(data))
        return data, etag

    def put(self, key: str, data: bytes, mode: PutMode = OVERWRITE) -> str:
        self._count("PUT")
        return self.inner.put(key, data, mode)

    def delete(self, key: str, if_match: str | None = None) -> None:
        self._count("DELETE")
        self.inner.delete(key, if_match)

    def delete_many(self, keys: Sequence[str]) -> None:
        # as S3 serves it: one DeleteObjects POST (class A) per 1000 keys
        self._count("BATCH_DELETE", -(-len(keys) // 1000))
        self.inner.delete_many(keys)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._count("LIST")  # at the call, as a server counts it, not when first iterated
        return self._keys(self.inner.list(prefix, start_after))

    def _keys(self, listing: Iterator[ObjectInfo]) -> Iterator[ObjectInfo]:
        for info in listing:
            self._count("keys")
            yield info

    def reset(self) -> Counter[str]:
        with self._lock:
            seen, self.counts, self.gets = self.counts, Counter(), []
        return seen


def classes(counts: Counter[str], per: int = 1) -> dict[str, float]:
    """Class A, class B and DELETE requests (per ``per`` units) and their dollar cost per
    million units at S3 Standard prices."""
    a = (counts["PUT"] + counts["LIST"] + counts["BATCH_DELETE"]) / per
    b = counts["GET"] / per
    return {
        "class_a": a,
        "class_b": b,
        "delete": counts["DELETE"] / per,
        "batch_delete": counts["BATCH_DELETE"] / per,
        "usd_per_million": 1e6 * (a * PRICE_CLASS_A + b * PRICE_CLASS_B),
    }
