"""Queue settings on the store: read (briefly cached) and changed by compare-and-swap.

Submitters read a queue's record at most every ``CACHE_S`` seconds, so a changed limit takes
effect within that time for every producer. A queue without a record has the defaults; only
an operator (``lakeshore queue set``, ``Dispatch.configure``) writes one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from lakeshore.errors import Conflict, NotFound, RecordError, TooLarge
from lakeshore.keys import QueueKeys
from lakeshore.model.provider import ProviderConfig
from lakeshore.model.queue_config import QueueConfig
from lakeshore.protocol.steps import MAX_SMALL_BYTES
from lakeshore.store.base import CREATE, Store, if_match

__all__ = ["CACHE_S", "QueueSettings"]

CACHE_S = 5.0


class QueueSettings:
    """The queue records of one namespace."""

    def __init__(self, store: Store, ns: str) -> None:
        self.store = store
        self.ns = ns
        self._cache: dict[str, tuple[QueueConfig, float]] = {}
        self._lock = threading.Lock()

    def _key(self, queue: str) -> str:
        return QueueKeys(self.ns, queue).queue_record

    def read(self, queue: str) -> tuple[QueueConfig, str | None]:
        """The queue's settings and etag (defaults and None when it has no record yet).

        Raises:
            RecordError: the queue record is corrupt or newer.
        """
        try:
            data, etag = self.store.get(self._key(queue), max_bytes=MAX_SMALL_BYTES)
        except NotFound:
            return QueueConfig(), None
        except TooLarge as e:
            raise RecordError(
                f"read {self._key(queue)}",
                f"the queue record is {e.details.get('size')} bytes: not one lakeshore wrote",
                "delete it with the store's tools; the next submit writes it again",
            ) from None
        return QueueConfig.from_bytes(data, self._key(queue)), etag

    def cached(self, queue: str) -> QueueConfig | None:
        """The settings :meth:`get` would return without a request; None when it would read."""
        with self._lock:
            hit = self._cache.get(queue)
        return hit[0] if hit is not None and time.monotonic() - hit[1] < CACHE_S else None

    def get(self, queue: str) -> QueueConfig:
        """Settings for a submit: cached for ``CACHE_S``; defaults while the queue has no
        record. Never writes: only operators change ``_queue`` (producers' policy denies it).
        """
        with self._lock:
            hit = self._cache.get(queue)
        if hit is not None and time.monotonic() - hit[1] < CACHE_S:
            return hit[0]
        conf, _ = self.read(queue)
        with self._lock:
            self._cache[queue] = (conf, time.monotonic())
        return conf

    def configure(self, queue: str, **changes: Any) -> QueueConfig:
        """Change some settings of ``queue``; other fields keep their current value even if
        someone changes them at the same time (compare-and-swap, retried).

        Raises:
            InvalidArgument: an unknown setting or a bad value (nothing is written).
        """
        # validate before touching the store; provider.NAME fields alone are checked against
        # a stand-in block of the kind that takes every field (the queue's own comes later)
        dotted = any(k.startswith("provider.") for k in changes) and "provider" not in changes
        QueueConfig(provider=ProviderConfig("slurm") if dotted else None).with_changes(**changes)
        while True:
            conf, etag = self.read(queue)
            new = conf.with_changes(**changes)
            try:
                if etag is None:
                    self.store.put(self._key(queue), new.to_bytes(), CREATE)
                else:
                    self.store.put(self._key(queue), new.to_bytes(), if_match(etag))
            except Conflict:
                continue
            with self._lock:
                self._cache[queue] = (new, time.monotonic())
            return new
