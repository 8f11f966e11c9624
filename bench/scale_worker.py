"""``lakeshore worker`` for ``bench/scale.py``: the process loads what a worker imports,
says so (a file ``$BENCH_GATE.<pid>``), waits for the file ``$BENCH_GATE``, then runs the
command line with its arguments. Everything after the gate — opening the store, the first
listing, starting body processes — is the worker's start-up as a launched worker pays it;
the interpreter's own start is left out, so that P processes started on two cores measure
the queue rather than Python's import of itself P times."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import lakeshore.cli
import lakeshore.worker  # loaded before the gate, like the command line itself


def main() -> int:
    gate = os.environ["BENCH_GATE"]
    Path(f"{gate}.{os.getpid()}").touch()
    while not os.path.exists(gate):
        time.sleep(0.002)  # a file is the signal: the benchmark creates it
    return lakeshore.cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
