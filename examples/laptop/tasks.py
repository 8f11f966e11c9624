"""Bodies for the laptop example. Workers import them by name (``tasks:thumbnail``), so this
folder must be on ``PYTHONPATH`` for the workers; ``run.sh`` sets it. They are plain
functions (submitted with ``lakeshore submit tasks:thumbnail``), so the workers run them only
because their command allows it: ``--allow 'tasks:*'``."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("laptop_example")


def warm_up() -> None:
    """``--on-start`` hook: runs once in each worker slot's child process."""
    print(f"[hook] warming up in pid {os.getpid()}", flush=True)


def thumbnail(name: str, size: int = 128) -> dict[str, object]:
    """Pretend to make a thumbnail: a little work, a print, a log line."""
    if not name.endswith(".jpg"):
        raise ValueError(f"{name!r} is not a .jpg")
    print(f"resizing {name} to {size}px")
    time.sleep(0.3)
    log.warning("done with %s", name)
    return {"name": name, "size": size, "pid": os.getpid()}


def long_render(seconds: float) -> str:
    """An invocation that is still running when the workers are stopped."""
    for i in range(int(seconds)):
        print(f"rendering frame {i}", flush=True)
        time.sleep(1)
    return "rendered"
