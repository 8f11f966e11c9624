"""How waiters pause between polls: a store that sees every write ends a pause at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lakeshore.protocol.polling import pause
from lakeshore.store import LocalStore, MemoryStore
from lakeshore.store.base import Store


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_a_pause_returns_once_stop_is_set(kind: str, tmp_path: Path) -> None:
    store: Store = MemoryStore() if kind == "memory" else LocalStore(tmp_path)
    stop = threading.Event()
    stop.set()
    t0 = time.monotonic()
    pause(store, 30.0, stop)
    assert time.monotonic() - t0 < 5.0  # a set stop ends the pause (30 s otherwise)


def test_a_stop_set_during_a_pause_ends_it(tmp_path: Path) -> None:
    for store in (MemoryStore(), LocalStore(tmp_path)):
        stop = threading.Event()
        threading.Timer(0.1, stop.set).start()
        t0 = time.monotonic()
        pause(store, 30.0, stop)
        assert time.monotonic() - t0 < 5.0, f"{store!r}: a stop set meanwhile ends the pause"


@pytest.mark.parametrize("with_stop", [False, True])
def test_a_pause_on_the_memory_store_ends_at_a_write(with_stop: bool) -> None:
    store = MemoryStore()
    woke = threading.Event()

    def waiter() -> None:
        pause(store, 30.0, threading.Event() if with_stop else None)
        woke.set()

    t = threading.Thread(target=waiter)
    t0 = time.monotonic()
    t.start()
    while not woke.is_set() and time.monotonic() - t0 < 10.0:
        store.put("k", b"v")  # a write wakes the pause whenever it has begun
        woke.wait(0.05)
    assert woke.is_set() and time.monotonic() - t0 < 10.0, "a write must end a 30 s pause"
    t.join(5)
    assert not store._watchers, "a pause cancels its watcher when it ends"


def test_a_pause_on_a_store_that_cannot_see_writes_lasts_its_time(tmp_path: Path) -> None:
    store: Store = LocalStore(tmp_path)
    assert store.on_write(lambda: None) is None  # other processes write there too
    t0 = time.monotonic()
    pause(store, 0.2)
    assert time.monotonic() - t0 >= 0.19, "no write can end it early: it is the backoff"
