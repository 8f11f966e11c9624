"""Upstream's ``run_worker(q, ...)``, over lakeshore's worker.

Given a ``SyncQueue`` it serves that queue's functions (``@dls.udf(queue=...)`` calls and
thunks) on the queue's plane; given a lakeshore plane (a ``Dispatch``, or its ``Plane``) it is
lakeshore's ``run_worker``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import lakeshore
from dreamlake.lakeshore.queues import SyncQueue
from dreamlake.lakeshore.transport import TransportError
from lakeshore.plane import Plane

__all__ = ["WorkerError", "run_worker"]


class WorkerError(RuntimeError):
    """A job could not be run (upstream's name; lakeshore fails the job with the reason)."""


def run_worker(
    q: SyncQueue | lakeshore.Dispatch | Plane,
    *,
    root: Any | None = None,
    registry: dict[str, Callable[..., Any]] | None = None,
    once: bool = False,
    poll: float = 0.05,
    retries: int = 1,
    stop: Callable[[], bool] | None = None,
    allow_pickled: bool | None = None,
    runtime_policy: str = "minor",
    **lakeshore_options: Any,
) -> int:
    """Claim and run the queue's calls until ``stop()`` is true (or one, with ``once``);
    returns how many ran. ``registry`` functions are declared on the plane, so they may
    run. ``root``, ``retries`` and ``runtime_policy`` are accepted and have no effect here:
    files go to the plane's data root, attempts are fixed at submit (two for a
    ``@dls.udf`` call, as ``retries=1``), and a worker runs only functions it declared.

    Raises:
        TransportError: ``allow_pickled=True`` on a plane that does not take pickles.
    """
    if not isinstance(q, SyncQueue):
        return lakeshore.run_worker(q, once=once, **lakeshore_options)
    plane = q.dispatch
    if allow_pickled and not plane.plane.allow_pickle:
        raise TransportError(
            "run_worker(allow_pickled=True): make the plane with allow_pickle=True, on the "
            "submitting and the working side"
        )
    for fn in (registry or {}).values():
        plane.udf(getattr(fn, "fn", fn), queue=q.name)
    options: dict[str, Any] = {"queues": [q.name], "isolation": "thread"}
    options.update(lakeshore_options)
    if once:
        return lakeshore.run_worker(plane, once=True, **options)
    event = threading.Event()
    watcher = None
    if stop is not None:
        if stop():  # checked before any claim, as upstream's loop does
            return 0

        def watch() -> None:
            while not event.is_set():
                if stop():
                    event.set()
                event.wait(max(poll, 0.01))

        watcher = threading.Thread(target=watch, name="dls-stop-watch", daemon=True)
        watcher.start()
    try:
        return lakeshore.run_worker(plane, stop=event, max_poll_s=max(poll, 0.05), **options)
    finally:
        event.set()
        if watcher is not None:
            watcher.join()
