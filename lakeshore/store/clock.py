"""Store clocks that a step of the wall clock cannot move.

Leases, backoffs and deadlines are judged in the store's clock. A wall clock (``time.time``)
can be stepped — by NTP after a VM pause, by hand — and a forward step would make every live
lease look expired at once. So the stores count elapsed time with a clock the kernel never
steps, and use the wall clock only to give that count an epoch:

* :class:`TickClock` (``MemoryStore``): the wall clock read once, when the store is made, plus
  the process's monotonic clock since then. One process owns a memory store, so one anchor
  serves every reader.
* :func:`machine_clock` (``LocalStore``): every process on the machine must agree, so the
  anchor is shared: the first process that opens the store after a boot writes
  ``<root>/.clock/<boot id>`` (create-only) with "wall clock minus boot-time clock"; later
  processes read it. ``CLOCK_BOOTTIME`` is system-wide, counts suspended time and is never
  stepped. Where there is no boot id (not Linux) the wall clock is used as it is.

The S3 store's clock comes from the server's ``Date`` headers (see ``lakeshore.store.s3``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from lakeshore.errors import StoreError

__all__ = ["TickClock", "machine_clock"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class TickClock:
    """``anchor + ticks()``: an epoch from the wall clock, elapsed time from a clock that is
    never stepped."""

    def __init__(
        self,
        anchor: float | None = None,
        ticks: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._ticks = ticks
        self._anchor = anchor if anchor is not None else wall() - ticks()

    def __call__(self) -> float:
        return self._anchor + self._ticks()


def _boot_ticks() -> Callable[[], float] | None:
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return None
    return lambda: time.clock_gettime(clock)


def machine_clock(
    root: Path,
    wall: Callable[[], float] = time.time,
    boot_id_file: Path = _BOOT_ID,
) -> Callable[[], float]:
    """The clock every process opening the store at ``root`` on this machine agrees on.

    Raises:
        StoreError: the anchor file exists but does not hold a time (remove it; it is
            written again by the next process that opens the store).
    """
    ticks = _boot_ticks()
    try:
        boot = boot_id_file.read_text().strip()
    except OSError:
        boot = ""
    if ticks is None or not boot or not boot.replace("-", "").isalnum():
        return wall
    path = root / ".clock" / boot
    try:
        text = path.read_text()
    except FileNotFoundError:
        text = _create_anchor(path, wall() - ticks())
    except OSError as e:
        raise StoreError(
            f"open {root}", f"cannot read the clock anchor {path} ({e.strerror})", "fix its mode"
        ) from e
    try:
        anchor = float(text)
        if anchor != anchor or abs(anchor) > 1e11:  # NaN, or not an epoch in seconds
            raise ValueError(text)
    except ValueError:
        raise StoreError(
            f"open {root}",
            f"the clock anchor {path} does not hold a time",
            "remove the file; the next process that opens the store writes it again",
            path=str(path),
        ) from None
    return TickClock(anchor, ticks)


def _create_anchor(path: Path, anchor: float) -> str:
    """Write the anchor create-only; the first process of a boot wins, the others read it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = repr(anchor)
    tmp = path.parent / f".tmp-{secrets.token_hex(8)}"
    try:
        tmp.write_text(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return path.read_text()
    except OSError as e:
        raise StoreError(
            f"open {path.parent.parent}",
            f"cannot write the clock anchor {path} ({e.strerror})",
            "pick a writable directory or fix its permissions",
        ) from e
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return text
