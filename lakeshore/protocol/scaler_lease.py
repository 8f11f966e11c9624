"""The scaler's lease: one object per queue naming the one scaler that may launch workers.

``lakeshore/<ns>/<queue>/_scaler`` holds the owner, when the lease runs out (in the store's
clock, as job leases are judged) and when the queue last had workers launched. Every change
is one conditional write: a scaler takes a missing lease with a create-only put and an
expired (or unreadable) one with ``if_match`` on the etag it read, and renews its own with
``if_match`` on the etag it wrote. Two scalers started at once both try; one write wins and
the other is a clean miss, so it launches nothing.

A lease is trusted no further than anything else in the store: bytes that are not a lease,
or one that claims to last more than ``MAX_LEASE_S`` from now (give or take a minute of
clock difference between scalers), count as expired, so a forged object cannot stop scaling
for longer than that.
"""

from __future__ import annotations

import contextlib
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeGuard

from lakeshore.codec import pack_plain, unpack_plain
from lakeshore.errors import Conflict, InvalidArgument, NotFound, TooLarge
from lakeshore.keys import QueueKeys
from lakeshore.store.base import CREATE, PutMode, Store, if_match

__all__ = ["MAX_LEASE_S", "Held", "ScalerLease", "ScalerLeases"]

MAX_LEASE_S = 600.0  # also how long one forged lease can hold scaling off
_MAX_BYTES = 4096
_CLOCK_SLACK_S = 60.0


@dataclass(frozen=True)
class ScalerLease:
    owner: str
    expires_at: float
    launched_at: float | None = None
    wid: str = ""

    def to_bytes(self) -> bytes:
        return pack_plain(
            {
                "v": 1,
                "owner": self.owner,
                "expires_at": self.expires_at,
                "launched_at": self.launched_at,
                "wid": self.wid,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ScalerLease | None:
        """The lease, or None when the bytes are not one this version can trust."""
        try:
            obj = unpack_plain(data)
        except Exception:
            return None
        if type(obj) is not dict or obj.get("v") != 1:
            return None
        owner, expires, launched = obj.get("owner"), obj.get("expires_at"), obj.get("launched_at")
        if type(owner) is not str or not 0 < len(owner) <= 200 or not _time(expires):
            return None
        if launched is not None and not _time(launched):
            return None
        return cls(owner, float(expires), None if launched is None else float(launched))


def _time(x: object) -> TypeGuard[float]:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


@dataclass(frozen=True)
class Held:
    """A lease this scaler wrote, and the etag that proves it is still the current one."""

    lease: ScalerLease
    etag: str


class ScalerLeases:
    """Take, renew, mark and give back one queue's scaler lease for ``owner``.

    Raises (every method): StoreError when the store fails — a scaler that cannot reach
    the store holds nothing and must not launch.
    """

    def __init__(
        self,
        store: Store,
        keys: QueueKeys,
        owner: str,
        lease_s: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not (isinstance(lease_s, int | float) and 1.0 <= lease_s <= MAX_LEASE_S):
            raise InvalidArgument(
                "scaler lease",
                f"lease_s must be 1..{MAX_LEASE_S:g} s, got {lease_s!r}",
                "give a lease within those bounds",
            )
        self.store, self.key, self.owner = store, keys.scaler_lease, owner
        self.lease_s = float(lease_s)
        self.clock = clock or store.now

    def read(self) -> tuple[ScalerLease | None, str | None]:
        """The current lease (None if missing or untrusted) and its etag (None if missing)."""
        try:
            data, etag = self.store.get(self.key, max_bytes=_MAX_BYTES)
        except NotFound:
            return None, None
        except TooLarge:
            return None, self._etag_of_oversized()
        return ScalerLease.from_bytes(data), etag

    def _etag_of_oversized(self) -> str | None:
        for info in self.store.list(self.key):
            if info.key == self.key:
                return info.etag
        return None

    def take(self, held: Held | None) -> tuple[Held | None, ScalerLease | None]:
        """Renew ``held``, or take the lease if it is free, expired or untrusted.

        Returns the lease now held (None: another scaler holds it, or a race was lost) and
        the lease as last seen, to say who holds it.
        """
        now = self.clock()
        if held is not None:
            renewed = self._write(held.lease.launched_at, now, if_match(held.etag))
            if renewed is not None:
                return renewed, renewed.lease
        current, etag = self.read()
        if etag is None:
            mine = self._write(None, now, CREATE)
            return mine, mine.lease if mine else None
        if current is not None and current.owner != self.owner and not self._expired(current, now):
            return None, current  # someone else's, and live
        # free, expired, untrusted, or our own whose etag a failed round lost: one CAS on
        # the etag just read decides
        launched = current.launched_at if current is not None else None
        mine = self._write(launched, now, if_match(etag))
        return mine, mine.lease if mine else current

    def _expired(self, lease: ScalerLease, now: float) -> bool:
        # the slack: a scaler whose estimate of the store clock runs ahead writes a lease
        # that looks a little longer than MAX_LEASE_S to others; that is still no forgery
        return lease.expires_at <= now or lease.expires_at > now + MAX_LEASE_S + _CLOCK_SLACK_S

    def mark_launch(self, held: Held) -> Held | None:
        """Record a launch now in the lease (the cool-down outlives this scaler); None when
        the lease was lost meanwhile."""
        now = self.clock()
        return self._write(now, now, if_match(held.etag))

    def release(self, held: Held) -> None:
        """Give the lease back (a ``--once`` run, a scaler stopping), keeping the time of the
        last launch for the next scaler; nothing happens if it was lost already."""
        lease = ScalerLease(self.owner, 0.0, held.lease.launched_at, secrets.token_hex(6))
        with contextlib.suppress(Conflict):
            self.store.put(self.key, lease.to_bytes(), if_match(held.etag))

    def _write(self, launched_at: float | None, now: float, mode: PutMode) -> Held | None:
        if launched_at is not None:  # after the store clock stepped back: no endless cool-down
            launched_at = min(launched_at, now)
        lease = ScalerLease(self.owner, now + self.lease_s, launched_at, secrets.token_hex(6))
        try:
            etag = self.store.put(self.key, lease.to_bytes(), mode)
        except Conflict:
            return None
        return Held(lease, etag)
