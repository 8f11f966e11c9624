"""How the queue waits for news: object storage cannot push, so every waiter polls.

A waiter (a result, an idle worker, a stream reader) pauses between reads with a backoff.
A store that sees every write (memory: one process) says so through ``Store.on_write``; the
pause then ends at the next write, so a waiter in the same process wakes at once instead of
at its next poll.
"""

from __future__ import annotations

import threading
import time

from lakeshore.store.base import Store

__all__ = ["pause"]

_STOP_LOOK_S = 0.05  # a stop event cannot wake another event: look at it this often


def pause(store: Store, seconds: float, stop: threading.Event | None = None) -> None:
    """Wait up to ``seconds`` before polling ``store`` again; sooner when ``stop`` is set
    or, on a store that sees every write, when one lands."""
    woke = threading.Event()
    cancel = store.on_write(woke.set)
    if cancel is None:
        if stop is not None:
            stop.wait(seconds)
        else:
            time.sleep(seconds)  # polling a store that cannot notify: the pause is the backoff
        return
    try:
        if stop is None:
            woke.wait(seconds)
            return
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or woke.wait(min(left, _STOP_LOOK_S)):
                return
    finally:
        cancel()
