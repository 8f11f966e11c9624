"""Bodies the benchmarks submit, in a module of their own so that every process (a worker,
or the benchmark run as ``python -m``) names them the same way."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path


def noop(x: int) -> int:
    return x + 1


def count_to(n: int) -> Iterator[int]:
    """A fast generator: the streaming benchmark's frames."""
    yield from range(n)


def size_of(data: bytes) -> int:
    """The payload benchmark's body: the argument travels, the result is small."""
    return len(data)


def gate() -> None:
    """The ``on_start`` hook of ``bench/queue.py``'s worker processes: once imported, say so
    (a file ``$BENCH_GATE.<pid>``) and wait for the file ``$BENCH_GATE``, so that all of them
    start draining together, their start-up behind them. No-op without ``BENCH_GATE``."""
    gate = os.environ.get("BENCH_GATE")
    if not gate:
        return
    Path(f"{gate}.{os.getpid()}").touch()
    while not os.path.exists(gate):
        time.sleep(0.002)  # a file is the signal: another process creates it


def nap(seconds: float) -> tuple[float, float]:
    """The scale benchmark's body: a slot busy for ``seconds``, the CPU left to the queue.
    Returns when it began and ended by this machine's clock, which every process shares (the
    store's clock, from Date headers in whole seconds, is too coarse to time a drain with)."""
    began = time.time()
    time.sleep(seconds)
    return began, time.time()
