"""The invocation record: one msgpack object per invocation, the single source of truth.

Every field is documented in ``docs/record.md``. The codec here is pure (no store): a record
round-trips through :meth:`Record.to_bytes` / :meth:`Record.from_bytes`, and a record written by
a newer lakeshore (higher ``v``) is refused with a clear error instead of being misread.

Two fields exist for the store's sake: ``rev`` counts writes and ``wid`` is a fresh random id
per write. Together they make every write's bytes unique, so an S3 ETag (a content hash) can
never come back to an earlier value (ABA), and a writer that meets an ambiguous 412 can read
the record back and recognise its own write by its ``wid``.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

import msgpack

from lakeshore.errors import StoreError

__all__ = [
    "LIVE",
    "SCHEMA_VERSION",
    "STATES",
    "TERMINAL",
    "Blob",
    "Lease",
    "NewerRecord",
    "Record",
    "RecordError",
]

SCHEMA_VERSION = 1
LIVE = ("queued", "running")
TERMINAL = ("succeeded", "failed", "killed", "timeout")
STATES = LIVE + TERMINAL


class RecordError(StoreError):
    """A record object that cannot be used: corrupt, truncated, or of a newer schema."""


class NewerRecord(RecordError):
    """A record written by a newer lakeshore: left alone, never overwritten."""


def write_id() -> str:
    """64 random bits as hex: unique per write, not secret (an os.urandom call per write
    costs more than the rest of a transition; ``random`` is reseeded in forked children)."""
    return f"{random.getrandbits(64):016x}"


@dataclass(frozen=True)
class Blob:
    """A value carried by a record: inline msgpack bytes, or a reference to a spilled object.

    Exactly one of ``inline`` and ``ref`` is set. Spilled objects are checked on read against
    ``size`` and ``sha256``.
    """

    inline: bytes | None = None
    ref: str | None = None
    size: int = 0
    sha256: str = ""

    def to_obj(self) -> dict[str, Any]:
        if self.ref is None:
            return {"inline": self.inline}
        return {"ref": self.ref, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_obj(cls, obj: dict[str, Any] | None) -> Blob | None:
        if obj is None:
            return None
        if "ref" in obj:
            return cls(ref=obj["ref"], size=int(obj["size"]), sha256=str(obj["sha256"]))
        return cls(inline=bytes(obj["inline"]))


@dataclass(frozen=True)
class Lease:
    """Who runs an attempt, and until when (in the store's clock)."""

    worker: str
    token: str
    expires_at: float


@dataclass(frozen=True)
class Record:
    """One invocation. Frozen: transitions return a new record (see ``lifecycle``)."""

    id: str
    ns: str
    queue: str
    fn: str  # "module:qualname"
    args: Blob
    state: str = "queued"
    fn_pickle: bytes | None = None  # only when submitter and worker both opted in
    key: str | None = None
    input_hash: str = ""
    prefix: str = ""
    priority: int = 5
    attempt: int = 0
    max_attempts: int = 3
    timeout_s: float | None = None
    deadline_at: float | None = None
    not_before: float = 0.0
    lease: Lease | None = None
    submitted_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    result: Blob | None = None
    error: dict[str, str] | None = None  # type, message, traceback: text, never unpickled
    journal: dict[str, Any] | None = None  # attempt, frames, ended (streaming bodies)
    retry_backoff_s: float = 1.0
    lease_s: float = 30.0
    released: int = 0  # attempts handed back by a stopping worker: they do not count
    slot: int | None = None  # admission slot held while live (queues with max_depth)
    slot_etag: str | None = None
    rev: int = 0
    wid: str = field(default_factory=lambda: write_id())
    v: int = SCHEMA_VERSION

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def next_write(self, **changes: Any) -> Record:
        """This record with ``changes`` applied, ``rev`` + 1 and a fresh ``wid``."""
        return dataclasses.replace(self, **changes, rev=self.rev + 1, wid=write_id())

    def to_bytes(self) -> bytes:
        # shallow on purpose: dataclasses.asdict deep-copies, which costs more than the write
        obj = {name: getattr(self, name) for name in _FIELD_NAMES}
        obj["args"] = self.args.to_obj()
        obj["result"] = self.result.to_obj() if self.result else None
        lease = self.lease
        obj["lease"] = (
            {"worker": lease.worker, "token": lease.token, "expires_at": lease.expires_at}
            if lease
            else None
        )
        return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "record") -> Record:
        """Decode a record.

        Raises:
            RecordError: the bytes are not a record, or the record's schema is newer.
        """
        try:
            obj = msgpack.unpackb(data, raw=False)
        except Exception as e:
            raise RecordError(
                f"read {where}",
                f"not a valid record ({type(e).__name__})",
                "the object is corrupt or truncated; inspect or delete it with the store's tools",
            ) from None
        if not isinstance(obj, dict):
            raise RecordError(f"read {where}", "not a record (no field map)", "inspect it")
        v = obj.get("v")
        if not isinstance(v, int):
            raise RecordError(f"read {where}", "the record has no schema version", "inspect it")
        if v > SCHEMA_VERSION:
            raise NewerRecord(
                f"read {where}",
                f"record schema v{v} is newer than this lakeshore understands (v{SCHEMA_VERSION})",
                "upgrade lakeshore on this machine",
                version=v,
            )
        try:
            lease = obj.get("lease")
            fields = {k: val for k, val in obj.items() if k in _FIELD_SET}
            fields["args"] = Blob.from_obj(obj["args"])
            fields["result"] = Blob.from_obj(obj.get("result"))
            fields["lease"] = Lease(**lease) if lease else None
            rec = cls(**fields)
        except (KeyError, TypeError, ValueError) as e:
            raise RecordError(
                f"read {where}",
                f"record is missing or mangles a field ({type(e).__name__}: {e})",
                "the object is corrupt; cancel or delete the invocation",
            ) from None
        if rec.state not in STATES:
            raise RecordError(f"read {where}", f"unknown state {rec.state!r}", "upgrade lakeshore")
        return rec


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Record))
_FIELD_SET = frozenset(_FIELD_NAMES)
