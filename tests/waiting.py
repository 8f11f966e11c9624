"""Waiting on conditions with a deadline (never a bare sleep), and whether a process lives."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def poll(check: Any, timeout: float = 60.0, what: str = "condition") -> Any:
    """Call ``check`` every 50 ms until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached in {timeout} s")


def alive(pid: int) -> bool:
    """The process runs (a zombie waiting to be reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
