"""Bodies the benchmarks submit, in a module of their own so that every process (a worker,
or the benchmark run as ``python -m``) names them the same way."""

from __future__ import annotations

from collections.abc import Iterator


def noop(x: int) -> int:
    return x + 1


def count_to(n: int) -> Iterator[int]:
    """A fast generator: the streaming benchmark's frames."""
    yield from range(n)


def size_of(data: bytes) -> int:
    """The payload benchmark's body: the argument travels, the result is small."""
    return len(data)
