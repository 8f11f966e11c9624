"""Bodies for tests/queue/test_trust.py, in a module no other test imports: a worker must never
import it because a record names it, only when its operator allows it. Each import appends
the importing process's pid to the file ``$LAKESHORE_TEST_CANARY`` names (when set)."""

from __future__ import annotations

import os
from pathlib import Path

import lakeshore as dls

_mark = os.environ.get("LAKESHORE_TEST_CANARY")
if _mark:
    with open(_mark, "a") as f:
        f.write(f"{os.getpid()}\n")


def touch(path: str) -> int:
    """A plain function: runs only where the worker's operator allows it."""
    Path(path).write_text("ran")
    return os.getpid()


@dls.udf
def stamp(path: str) -> int:
    """Decorated: declared wherever this module is imported."""
    Path(path).write_text("ran")
    return os.getpid()
