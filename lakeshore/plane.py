"""``Plane``: what the queue code needs of a plane — its store, namespace, limits, the
functions declared on it, one ``QueueOps`` per queue, the id lookup and the data root.

``Dispatch`` (the public facade) holds a ``Plane`` (``q.plane``) and shows the user's verbs
only. The submit, worker and attempt code take a ``Plane`` and never import the facade;
what takes a plane from users takes either (``plane_of``), so the layering runs one way:
store → protocol → plane → submit/worker → facade → CLI.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from lakeshore.errors import InvalidArgument, NotFound
from lakeshore.files.root import DataRoot, data_root
from lakeshore.keys import DEFAULT_QUEUE, QueueKeys, check_id, check_name, probe_prefix
from lakeshore.model.record import Record
from lakeshore.protocol.claims import Claimer
from lakeshore.protocol.queue_record import QueueSettings
from lakeshore.protocol.steps import QueueOps, read_id_index
from lakeshore.running.bodies import Declared
from lakeshore.store import MemoryStore, Store, open_store

__all__ = ["DEFAULT_URL", "HasPlane", "Plane", "plane_of"]

DEFAULT_URL = "file://~/.lakeshore"


class Plane:
    """A plane on one store: the state the queue code shares (see ``Dispatch`` for the
    arguments)."""

    def __init__(
        self,
        url: str | None = None,
        ns: str = "default",
        *,
        store: Store | None = None,
        spill_bytes: int = 64 * 1024,
        max_attempts: int = 3,
        lease_s: float = 30.0,
        retry_backoff_s: float = 1.0,
        allow_pickle: bool = False,
        data: str | None = None,
        data_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        max_payload_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        if url == "":  # a variable that was meant to hold a URL, most likely: never the default
            raise InvalidArgument(
                "Dispatch",
                "the store URL is empty",
                "give one (file:///dir, s3://bucket/prefix, :memory:), or pass None for "
                "$LAKESHORE_URL, else the default store",
            )
        self.url = url or os.environ.get("LAKESHORE_URL") or DEFAULT_URL
        self.ns = check_name(ns, "namespace")
        if (
            spill_bytes < 0
            or max_attempts < 1
            or not (math.isfinite(lease_s) and lease_s > 0)
            or not (math.isfinite(retry_backoff_s) and retry_backoff_s >= 0)
            or max_payload_bytes < 1
        ):
            raise InvalidArgument(
                "Dispatch",
                "spill_bytes, max_attempts, lease_s, retry_backoff_s or max_payload_bytes out "
                "of range",
                "use spill_bytes >= 0, max_attempts >= 1, finite lease_s > 0 and "
                "retry_backoff_s >= 0, max_payload_bytes >= 1",
            )
        self.store = store if store is not None else open_store(self.url)
        self.store.probe_within(probe_prefix(self.ns))  # inside what every role may list
        self.spill_bytes = spill_bytes
        self.max_attempts = max_attempts
        self.lease_s = lease_s
        self.retry_backoff_s = retry_backoff_s
        self.allow_pickle = allow_pickle
        self.max_payload_bytes = max_payload_bytes
        self.registry: dict[str, Declared] = {}
        self._ops: dict[str, QueueOps] = {}
        self._claimers: dict[tuple[str, str], Claimer] = {}
        self.settings = QueueSettings(self.store, self.ns)
        self._data = (data or os.environ.get("LAKESHORE_DATA") or "", data_options, cache_dir)
        self._data_root: DataRoot | None = None
        self._make_root: Callable[[], DataRoot] | None = None
        self._where: dict[str, str] = {}  # id -> queue; ids never move, so this never goes stale
        self._lock = threading.Lock()

    @property
    def data_root(self) -> DataRoot:
        """Where this plane's bodies read and write files (see ``data`` above).

        Raises:
            InvalidArgument: the data root URL is unusable or its fsspec driver is missing.
        """
        if self._data_root is None and self._make_root is not None:
            self._data_root = self._make_root()
        if self._data_root is None:
            url, options, cache = self._data
            if not url or (options is None and url.startswith("s3://")):
                where = self.store.location()
                base, store_options = where or (
                    "",
                    {"why": f"{type(self.store).__name__} has no default place for files"},
                )
                if not url:
                    url, options = (f"{base}/data/{self.ns}" if base else ""), store_options
                elif base.startswith("s3://"):  # same endpoint and credentials
                    options = store_options
            self._data_root = (
                data_root(url, options, cache or "") if url else DataRoot("", options or {})
            )
        return self._data_root

    def resolve_data_root(self, make: Callable[[], DataRoot]) -> None:
        """Resolve the data root with ``make`` at its first use, instead of from ``data``:
        for a facade whose default place for files is another one (dreamlake's run root,
        the working directory at first use)."""
        self._make_root = make

    @property
    def in_process(self) -> bool:
        """The store lives in this process (``:memory:``): every worker of it is here, so a
        function known only to this plane's registry can still be run."""
        return isinstance(self.store, MemoryStore)

    def queues(self) -> list[str]:
        """Queues this plane knows in this process (declared by ``@udf`` or used)."""
        names = {u.queue for u in self.registry.values()} | set(self._ops)
        return sorted(names or {DEFAULT_QUEUE})

    def claimer(self, queue: str, worker: str) -> Claimer:
        """The claim scheduler of ``worker`` on ``queue`` (one per worker id and queue, so
        what it remembers lasts across ``run_worker`` calls of this process with that id;
        workers with other ids have their own and compete as separate processes would)."""
        with self._lock:
            key = (queue, worker)
            found = self._claimers.get(key)
        if found is None:
            ops = self.ops(queue)
            with self._lock:
                found = self._claimers.setdefault(key, Claimer(ops, worker))
        return found

    def ops(self, queue: str) -> QueueOps:
        """The protocol steps of ``queue`` (one object per queue per plane, shared by the
        plane's users in this process: its tidier batches their ticket deletes)."""
        with self._lock:
            if queue not in self._ops:
                self._ops[queue] = QueueOps(self.store, QueueKeys(self.ns, queue))
            return self._ops[queue]

    def locate(self, inv: str) -> tuple[QueueOps, Record, str]:
        """The queue's steps, the record and its etag of invocation ``inv``: the queue this
        process saw it in, the default queue, the queues it knows, then the id index.

        Raises:
            InvalidArgument: ``inv`` is not an id. NotFound: no such invocation.
        """
        inv = check_id(inv)
        tried: list[str] = []
        cached = self._where.get(inv)
        candidates = list(
            dict.fromkeys([*([cached] if cached else []), DEFAULT_QUEUE, *self.queues()])
        )
        for queue in candidates:
            ops = self.ops(queue)
            try:
                rec, etag = ops.read(inv)
            except NotFound:
                tried.append(queue)
                continue
            self._where[inv] = queue
            return ops, rec, etag
        queue = read_id_index(self.store, self.ns, inv)
        if queue and queue not in tried:
            ops = self.ops(queue)
            try:
                rec, etag = ops.read(inv)
                self._where[inv] = queue
                return ops, rec, etag
            except NotFound:
                pass
        raise NotFound(
            f"lookup {inv}",
            f"no invocation with this id in namespace {self.ns!r} of {self.store.url}",
            "check the id, the namespace and the store URL",
            id=inv,
        )

    def remember(self, inv: str, queue: str) -> None:
        """This process knows where ``inv`` lives (ids never move: it never goes stale)."""
        self._where[inv] = queue


class HasPlane(Protocol):
    """What holds a plane and hands it over: ``Dispatch`` (``q.plane``)."""

    @property
    def plane(self) -> Plane: ...


def plane_of(x: Plane | HasPlane) -> Plane:
    """The plane of what a user passes where a plane is taken: a ``Dispatch`` (its
    ``plane``) or a ``Plane`` itself.

    Raises:
        InvalidArgument: ``x`` is neither.
    """
    if isinstance(x, Plane):
        return x
    found = getattr(x, "plane", None)
    if isinstance(found, Plane):
        return found
    raise InvalidArgument(
        "plane",
        f"a {type(x).__name__} is not a plane",
        "pass a Dispatch (or its .plane)",
    )
