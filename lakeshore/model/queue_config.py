"""The queue record: a queue's settings and its admission block, validated and versioned.

Stored as msgpack at ``lakeshore/<ns>/<queue>/_queue`` and changed by compare-and-swap, so two
operators changing different fields at the same time both keep their change. Pure: no store
here (the plane reads and writes it).
"""

from __future__ import annotations

import dataclasses
import math
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from lakeshore.codec import pack_plain, unpack_plain
from lakeshore.errors import InvalidArgument, RecordError
from lakeshore.model.provider import ProviderConfig

__all__ = ["ON_FULL", "QueueConfig", "parse_rate"]

ON_FULL = ("reject", "block")
_RATE = re.compile(r"\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*\Z")
_PERIODS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}
_PERIODS |= {"h": 3600, "hour": 3600}
_NUMBERS = ("deadline_cutoff_s", "timeout_s", "lease_s", "retry_backoff_s", "result_retention_s")


def parse_rate(rate: str) -> tuple[int, int]:
    """``"20/s"`` → ``(20, 1)``; ``"600/min"`` → ``(600, 60)``: (count, window seconds).

    Raises:
        InvalidArgument: not ``<positive int>/<s|min|h>``.
    """
    m = _RATE.match(rate) if isinstance(rate, str) else None
    if not m or int(m.group(1)) < 1:
        raise InvalidArgument(
            "rate_limit",
            f"{rate!r} is not a rate",
            "write it as <count>/<unit> with a positive count, e.g. '10/s', '600/min', '5000/h'",
        )
    return int(m.group(1)), _PERIODS[m.group(2)]


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class QueueConfig:
    """Settings of one queue. ``None`` means "no limit" / "use the plane's default".

    Admission (enforced at submit, for every producer together):
        max_depth: most invocations that may be live (queued or running) at once.
        on_full: ``"reject"`` (raise QueueFull at once) or ``"block"`` (wait for room).
        rate_limit: accepted submits per window, e.g. ``"20/s"``, ``"600/min"``.
        deadline_cutoff_s: an invocation still queued this long after submission never starts.
    Defaults for invocations: timeout_s, max_attempts, lease_s, retry_backoff_s.
    Other: provider (None: workers are attached by hand; else who supplies them, see
    :class:`~lakeshore.model.provider.ProviderConfig`), result_retention_s (kept for the
    garbage collector).
    """

    max_depth: int | None = None
    on_full: str = "reject"
    rate_limit: str | None = None
    deadline_cutoff_s: float | None = None
    provider: ProviderConfig | None = None
    timeout_s: float | None = None
    max_attempts: int | None = None
    lease_s: float | None = None
    retry_backoff_s: float | None = None
    result_retention_s: float | None = None
    rev: int = 0
    wid: str = field(default_factory=lambda: secrets.token_hex(8))
    v: int = 1

    def __post_init__(self) -> None:
        problems = []
        if self.max_depth is not None and (
            not isinstance(self.max_depth, int)
            or isinstance(self.max_depth, bool)
            or self.max_depth < 1
        ):
            problems.append(f"max_depth must be an integer >= 1 or None, got {self.max_depth!r}")
        if self.on_full not in ON_FULL:
            problems.append(f"on_full must be one of {ON_FULL}, got {self.on_full!r}")
        if self.rate_limit is not None:
            parse_rate(self.rate_limit)
        # nan compares false with everything and inf overflows the arithmetic of gc, leases
        # and deadlines: every number must be finite (and not a bool, which is an int)
        for name in ("deadline_cutoff_s", "timeout_s", "lease_s", "result_retention_s"):
            value = getattr(self, name)
            if value is not None and (not _finite(value) or value <= 0):
                problems.append(f"{name} must be a finite positive number or None, got {value!r}")
        if self.retry_backoff_s is not None and (
            not _finite(self.retry_backoff_s) or self.retry_backoff_s < 0
        ):
            problems.append(
                "retry_backoff_s must be a finite number >= 0 or None, "
                f"got {self.retry_backoff_s!r}"
            )
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int) or self.max_attempts < 1
        ):
            problems.append(f"max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        # a kind name or a map becomes the block itself (its own InvalidArgument if bad)
        object.__setattr__(self, "provider", ProviderConfig.from_value(self.provider))
        if problems:
            raise InvalidArgument(
                "queue config", "; ".join(problems), "fix the setting(s) and try again"
            )

    @property
    def rate(self) -> tuple[int, int] | None:
        return parse_rate(self.rate_limit) if self.rate_limit else None

    def with_changes(self, **changes: Any) -> QueueConfig:
        """A validated copy with ``changes`` applied, ``rev`` + 1 and a fresh ``wid``.

        Raises:
            InvalidArgument: an unknown field or an invalid value.
        """
        known = {f.name for f in dataclasses.fields(self)} - {"rev", "wid", "v"}
        changes = self._provider_fields(changes)
        unknown = set(changes) - known
        if unknown:
            raise InvalidArgument(
                "queue config",
                f"unknown setting(s) {sorted(unknown)}",
                f"known settings: {sorted(known)}",
            )
        return dataclasses.replace(self, **changes, rev=self.rev + 1, wid=secrets.token_hex(8))

    def _provider_fields(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Fold ``provider.NAME=VALUE`` changes into one ``provider`` change, applied to the
        block named in the same call or else the current one (read in the same CAS round, so
        a field someone else changed meanwhile is kept)."""
        fields = {k: v for k, v in changes.items() if k.startswith("provider.")}
        if not fields:
            return changes
        rest = {k: v for k, v in changes.items() if k not in fields}
        block = ProviderConfig.from_value(rest.get("provider", self.provider))
        if block is None:
            raise InvalidArgument(
                "queue config",
                f"{sorted(fields)} set, but the queue has no provider",
                "name its kind in the same change: provider=local|slurm|command",
            )
        for name, value in fields.items():
            block = block.with_field(name.removeprefix("provider."), value)
        return {**rest, "provider": block}

    def public(self) -> dict[str, Any]:
        """The settings as a plain dict (without rev/wid/v); the provider block as a dict of
        the fields it sets."""
        d = dataclasses.asdict(self)
        for k in ("rev", "wid", "v"):
            d.pop(k)
        d["provider"] = self.provider.public() if self.provider else None
        return d

    def to_bytes(self) -> bytes:
        return pack_plain(dataclasses.asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "queue record") -> QueueConfig:
        """Decode and validate a queue record (every field of its type and range).

        Raises:
            RecordError: a corrupt, mistyped or newer queue record.
        """
        try:
            obj = unpack_plain(data)
            if type(obj) is not dict:
                raise ValueError("not a map")
            v = obj.get("v", 1)
            if type(v) is not int:
                raise ValueError(f"v must be an integer, got a {type(v).__name__}")
            if v > 1:
                raise RecordError(
                    f"read {where}",
                    f"queue record schema v{v} is newer than this lakeshore",
                    "upgrade lakeshore",
                )
            rev, wid = obj.get("rev", 0), obj.get("wid", "")
            if type(rev) is not int or rev < 0 or type(wid) is not str:
                raise ValueError("rev must be an integer >= 0 and wid a str")
            for name in ("max_depth", "max_attempts"):  # bool passes isinstance(int) checks
                if type(obj.get(name)) is bool:
                    raise ValueError(f"{name} must be an integer or None, got a bool")
            for name in _NUMBERS:
                x = obj.get(name)
                if x is not None and (type(x) not in (int, float) or not math.isfinite(x)):
                    raise ValueError(f"{name} must be a finite number or None")
            known = {f.name for f in dataclasses.fields(cls)}
            fields = {k: v for k, v in obj.items() if k in known}
            block = fields.get("provider")
            if type(block) is dict:  # a newer lakeshore's provider fields: left for it
                names = {f.name for f in dataclasses.fields(ProviderConfig)}
                fields["provider"] = {k: v for k, v in block.items() if k in names}
            return cls(**fields)
        except RecordError:
            raise
        except Exception as e:
            raise RecordError(
                f"read {where}",
                f"not a valid queue record ({type(e).__name__}: {e})",
                "rewrite it with `lakeshore queue set` or q.configure()",
            ) from None
