"""Which connections the dashboard's server keeps, and which it closes.

A connection arrives *waiting*: until one of its requests has shown the token (or, without
a token, was addressed to a loopback name) it holds one of a few waiting places, at most
some per client address, and it must be let in within a deadline of its arrival, whatever
it sends meanwhile (a client trickling a header byte at a time gets no more time than one
that sends nothing). When a newcomer finds its address's places or all of them taken, the
oldest waiting connection (of that address, else of any) is closed instead of the
newcomer: slow connections age out, they cannot keep a client that sends its request at
once from being answered. A connection that was let in holds one of the server's places
until it closes; waiting connections never hold those.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lakeshore.errors import InvalidArgument

__all__ = ["Gate"]


@dataclass
class _Held:
    client: str
    deadline: float
    inside: bool = False


class Gate:
    """The places of one server's connections (``conn``: anything with ``shutdown``).

    Args:
        max_connections: connections let in at once.
        max_waiting: connections not yet let in, at once.
        max_waiting_per_client: of those, from one client address.
        deadline_s: seconds from a connection's arrival to its being let in.
        monotonic: the clock of the deadlines.

    Raises:
        InvalidArgument: a limit or the deadline is not positive, or the per-client limit
            exceeds the waiting one.
    """

    def __init__(
        self,
        *,
        max_connections: int,
        max_waiting: int,
        max_waiting_per_client: int,
        deadline_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (
            max_connections > 0 and 0 < max_waiting_per_client <= max_waiting and deadline_s > 0
        ):
            raise InvalidArgument(
                "ui",
                "the connection limits and the header deadline must be positive, and the "
                "per-client limit at most the waiting one",
                "e.g. 256 connections, 64 waiting, 16 per client, 5 s",
            )
        self.max_connections = max_connections
        self.max_waiting = max_waiting
        self.max_waiting_per_client = max_waiting_per_client
        self.deadline_s = deadline_s
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._open: dict[Any, _Held] = {}  # every connection a thread serves, closed or not
        self._waiting: OrderedDict[Any, None] = OrderedDict()  # oldest first
        self._inside = 0

    def arrive(self, conn: Any, client: str) -> bool:
        """Take a waiting place for a new connection, closing the oldest waiting one when
        the newcomer's address or all waiting places are taken. False: the server serves
        as many connections as it ever will (the closed ones have not ended yet): close
        the newcomer at once."""
        with self._lock:
            if len(self._open) >= self.max_connections + 2 * self.max_waiting:
                return False
            mine = [c for c in self._waiting if self._open[c].client == client]
            if len(mine) >= self.max_waiting_per_client:
                self._close(mine[0])
            elif len(self._waiting) >= self.max_waiting:
                self._close(next(iter(self._waiting)))
            self._open[conn] = _Held(client, self.monotonic() + self.deadline_s)
            self._waiting[conn] = None
            return True

    def let_in(self, conn: Any) -> bool:
        """Move ``conn`` from its waiting place to one of the server's (a connection let in
        already stays). False: it was closed meanwhile, or every place is taken."""
        with self._lock:
            held = self._open.get(conn)
            if held is None:
                return False
            if held.inside:
                return True
            if conn not in self._waiting or self._inside >= self.max_connections:
                return False
            del self._waiting[conn]
            held.inside = True
            self._inside += 1
            return True

    def leave(self, conn: Any) -> None:
        """``conn`` is done: its place is free. Call before closing it (a place is never
        shut down after its socket was closed, when the number may be another's)."""
        with self._lock:
            held = self._open.pop(conn, None)
            self._waiting.pop(conn, None)
            if held is not None and held.inside:
                self._inside -= 1

    def sweep(self) -> None:
        """Close the waiting connections past their deadline."""
        with self._lock:
            now = self.monotonic()
            for conn in [c for c in self._waiting if self._open[c].deadline <= now]:
                self._close(conn)

    def counts(self) -> tuple[int, int]:
        """(waiting, let in) connections now."""
        with self._lock:
            return len(self._waiting), self._inside

    def _close(self, conn: Any) -> None:
        """Shut a waiting connection down (its thread reads the end and leaves); its place
        is free at once."""
        del self._waiting[conn]
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
