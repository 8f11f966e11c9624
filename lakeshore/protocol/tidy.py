"""Tidying after finished attempts, off the worker's claim path.

A worker that wrote an attempt's terminal record still has to delete the invocation's
ticket and free its admission slot. Neither is needed for the outcome to be visible, so a
background thread does them, and the slot moves on to its next claim at once. Ticket
deletes are unconditional (each rerun has a ticket key of its own, see ``keys.ticket``),
so they are batched: one ``delete_many`` (one S3 ``DeleteObjects`` request) for up to
``BATCH`` tickets, sent once the oldest has waited ``BATCH_S`` seconds, or at once when
the worker finds nothing to claim. A process that dies with deletes pending leaves stale
tickets, which claimers delete when they meet them.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from lakeshore.errors import LakeshoreError
from lakeshore.store.base import Store

__all__ = ["BATCH", "BATCH_S", "Tidier"]

log = logging.getLogger("lakeshore.worker")

BATCH = 1000  # tickets per batch delete: one S3 DeleteObjects request
BATCH_S = 1.0  # how long a ticket waits for others before its batch is sent


class Tidier:
    """A background thread for one store: runs tidying steps in order and batches ticket
    deletes. Started on first use; ``flush`` waits until everything handed in is done."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._clock = clock
        self._cond = threading.Condition()
        self._steps: list[Callable[[], object]] = []
        self._doomed: list[str] = []
        self._doomed_since = 0.0
        self._busy = 0  # steps and batches taken by the thread and not yet done
        self._thread: threading.Thread | None = None

    def later(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the background thread (after what was handed in before)."""
        with self._cond:
            self._steps.append(fn)
            self._start()
            self._cond.notify_all()

    def delete(self, key: str) -> None:
        """Delete ``key`` (unconditionally) with the next batch."""
        with self._cond:
            first = not self._doomed
            if first:
                self._doomed_since = self._clock()
            self._doomed.append(key)
            self._start()
            # The thread sleeps until the oldest delete is due: wake it only when that
            # changes (the first of a batch) or the batch is full, not once per attempt.
            if first or len(self._doomed) >= BATCH:
                self._cond.notify_all()

    def hurry(self) -> None:
        """Send the deletes that wait now, without waiting for them: the worker found nothing
        to claim, so no more are coming soon, and in other workers' listings they look like
        work (what they take of them costs them a request or two each)."""
        with self._cond:
            if self._doomed:
                self._doomed_since = -float("inf")  # due at once
                self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Send what waits now and wait until all is done; False if ``timeout`` passed."""
        with self._cond:
            self._doomed_since = -float("inf")  # due at once
            self._cond.notify_all()
            return self._cond.wait_for(self._idle, timeout)

    def _idle(self) -> bool:
        return not self._steps and not self._doomed and not self._busy

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lakeshore-tidy", daemon=True)
            self._thread.start()

    def _due(self) -> bool:
        return bool(self._doomed) and (
            len(self._doomed) >= BATCH or self._clock() - self._doomed_since >= BATCH_S
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._steps and not self._due():
                    wait = None
                    if self._doomed:
                        wait = max(0.0, self._doomed_since + BATCH_S - self._clock())
                    self._cond.wait(wait)
                steps, self._steps = self._steps, []
                batch: list[str] = []
                if self._due():
                    batch, self._doomed = self._doomed[:BATCH], self._doomed[BATCH:]
                    self._doomed_since = self._clock()
                self._busy = len(steps) + (1 if batch else 0)
            for fn in steps:
                self._run_one(fn)
            if batch:
                self._run_one(functools.partial(self._store.delete_many, batch))
            with self._cond:
                self._busy = 0
                self._cond.notify_all()

    @staticmethod
    def _run_one(fn: Callable[[], object]) -> None:
        try:
            fn()
        except LakeshoreError as e:  # a stale ticket or slot stays: others tidy it later
            log.debug("tidying after a finished attempt failed: %s", e)
        except Exception:  # a bug must not stop the thread (flush would wait for it)
            log.exception("tidying after a finished attempt failed")
