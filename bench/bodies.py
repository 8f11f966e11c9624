"""Bodies the benchmarks submit, in a module of their own so that every process (a worker,
or the benchmark run as ``python -m``) names them the same way."""

from __future__ import annotations


def noop(x: int) -> int:
    return x + 1
