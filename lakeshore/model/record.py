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
import hashlib
import math
import operator
import random
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from lakeshore.codec import pack_plain, unpack_plain
from lakeshore.errors import InvalidArgument, NewerRecord, RecordError
from lakeshore.keys import MAX_PRIORITY, MIN_PRIORITY, check_name
from lakeshore.model.dependencies import AFTER_FAILURES, AFTER_PASSES, MAX_AFTER
from lakeshore.model.retry import DEFAULT_BACKOFF_CAP_S, MAX_NAMES, name_problem, number_problem
from lakeshore.model.trace_context import checked_trace

__all__ = [
    "LIMITS",
    "LIVE",
    "MAX_COUNT",
    "MAX_HISTORY",
    "MAX_INLINE_BYTES",
    "OUTCOMES",
    "PAYLOAD_FN",
    "SCHEMA_VERSION",
    "STATES",
    "TERMINAL",
    "Blob",
    "Lease",
    "Record",
    "State",
    "Turn",
    "check_fields",
    "check_key_arg",
    "check_text",
    "clip_error",
]

SCHEMA_VERSION = 2
# Fields added after schema 1. Each is left out of the bytes while it holds its default, so a
# record that uses none of them is stored exactly as 0.4 stored it (``v = 1``); a record that
# sets one is written as ``v = 2``, which a 0.4 worker leaves alone (``NewerRecord``) rather
# than run it without the field's meaning (a child before its parents, say). A field
# registers here with its default: ``{name: default}``.
SINCE_V2: dict[str, Any] = {}
# the retry rule (docs/retries.md): exception type names, and the backoff's cap and jitter
SINCE_V2.update(
    retry_for=(), no_retry_for=(), retry_backoff_cap_s=DEFAULT_BACKOFF_CAP_S, retry_jitter=0.0
)
# dependencies (docs/dependencies.md): the parents' ids, what a failed parent does, how
# many parents (in order) were seen done, and what a fan-in hands its body first
SINCE_V2.update(after=(), after_failure="kill", after_done=0, after_pass="")
# a delayed submit (docs/queue.md#delayed-submits): the time it asked to start at. Besides
# showing it, the field makes the record v2: a 0.4 worker would fail a record due more than
# a day ahead as implausible, and leaves a v2 record alone instead
SINCE_V2.update(scheduled_at=None)
# the producer's W3C trace context (docs/tracing.md), which the attempt's spans continue.
# Diagnostics only: a 0.4 worker that ignores them runs the invocation as it should, so they
# are left out at their default like the others but do not make the record v2
SINCE_V2.update(traceparent="", tracestate="")
QUIET_SINCE_V2 = frozenset({"traceparent", "tracestate"})


class State(StrEnum):
    """An invocation's state. A ``str``: stored as its value, so records read and write the
    bytes they always did, and ``rec.state == "queued"`` holds."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    TIMEOUT = "timeout"

    def __repr__(self) -> str:
        # as the string it replaced: a dict of states prints as it always did
        return repr(self.value)


LIVE = (State.QUEUED, State.RUNNING)
TERMINAL = (State.SUCCEEDED, State.FAILED, State.KILLED, State.TIMEOUT)
STATES = LIVE + TERMINAL
_STATE_OF = {s.value: s for s in State}
# The ``fn`` of a payload invocation (a work queue's: no function, a consumer acks it). A
# function's ref always has a colon, so no function can be named this.
PAYLOAD_FN = "payload"


# Size caps of the record's free-form fields, in bytes of UTF-8 (or of the bytes field).
# Every heartbeat and transition rewrites the whole record, so a field's size is paid on
# each write: the caps keep a record small whoever writes it. Submit refuses an oversize
# field, a worker's error text is clipped, and a reader refuses a record that breaks one.
MAX_INLINE_BYTES = 1 << 20  # an inline args or result blob; larger values are spilled
MAX_HISTORY = 16  # attempts the record remembers (the newest), for people looking at it
# how an attempt ended, in its history entry (None while it runs)
OUTCOMES = ("succeeded", "failed", "retried", "released", "expired", "killed", "timeout")
MAX_ERROR_TEXT = 64 * 1024  # each text of the error map (message, traceback, ...)
MAX_ERROR_ENTRIES = 8  # entries of the error map
LIMITS: dict[str, int] = {
    "fn": 1024,
    "fn_pickle": 1 << 20,
    "key": 1024,
    "input_hash": 128,
    "prefix": 1024,
    "wid": 64,
    "slot_etag": 256,
    "lease.worker": 256,
    "lease.token": 64,
    "blob.ref": 1024,
    "blob.inline": MAX_INLINE_BYTES,
    "error.key": 64,
    "error.value": MAX_ERROR_TEXT,
}
_ERROR_KEY = LIMITS["error.key"]


def _size(value: str | bytes, cap: int) -> int:
    """Bytes of a str (UTF-8) or bytes value, exact wherever it could be over ``cap``: a str
    too short to exceed it (4 bytes a character at most) is not encoded at all."""
    n = len(value)
    if type(value) is bytes or n * 4 <= cap:
        return n
    assert isinstance(value, str)
    return len(value.encode("utf-8", "surrogatepass"))


def _has_control(text: str) -> bool:
    # C0, DEL and C1: terminals act on them, and a key is an identifier, not a layout
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)


def check_text(value: str | bytes, limit: str, op: str) -> None:
    """Refuse a field value larger than its cap in :data:`LIMITS`.

    Raises:
        InvalidArgument: the value is over the cap; the message names the limit.
    """
    cap = LIMITS[limit]
    n = _size(value, cap)
    if n > cap:
        raise InvalidArgument(
            op,
            f"{limit} is {n} bytes, over the limit of {cap} bytes",
            f"keep {limit} at most {cap} bytes (see docs/record.md, 'Size caps')",
            field=limit,
            size=n,
            limit=cap,
        )


def check_key_arg(key: object, op: str) -> str | None:
    """Validate a submit's ``_key``: None, or a non-empty str of at most 1024 bytes of
    UTF-8 without control characters.

    Raises:
        InvalidArgument: any other value.
    """
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise InvalidArgument(op, f"_key must be a non-empty str, got {_show(key)}", "pass a str")
    check_text(key, "key", op)
    if _has_control(key):
        raise InvalidArgument(
            op,
            f"_key {_show(key)} contains a control character",
            "use printable text for keys (hash binary data first)",
        )
    return key


def check_fields(rec: Record, op: str) -> None:
    """Refuse a record about to be written whose user-supplied fields break their caps.

    Raises:
        InvalidArgument: the first field over its cap (or a bad ``_key``).
    """
    check_text(rec.fn, "fn", op)
    if rec.fn_pickle is not None:
        check_text(rec.fn_pickle, "fn_pickle", op)
    check_key_arg(rec.key, op)
    check_text(rec.prefix, "prefix", op)
    check_text(rec.input_hash, "input_hash", op)


def _clip(text: str, cap: int) -> str:
    """``text`` cut to at most ``cap`` bytes, keeping its head and its tail (the last lines
    of a traceback say the most) around a marker saying how much went. Under a small cap
    (an error map's keys) the head is kept with a digest of the whole, so that two long
    keys stay two entries."""
    if _size(text, cap) <= cap:
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if cap < 256:
        digest = hashlib.blake2b(raw, digest_size=4).hexdigest()
        return f"{raw[: cap - 9].decode('utf-8', 'ignore')}~{digest}"
    keep = (cap - 64) // 2  # 64 bytes leave room for the marker
    head = raw[:keep].decode("utf-8", "ignore")
    tail = raw[len(raw) - keep :].decode("utf-8", "ignore")
    return f"{head}\n[... {len(raw) - 2 * keep} bytes cut ...]\n{tail}"


def clip_error(error: dict[str, str] | None) -> dict[str, str] | None:
    """An error map within the caps: at most 8 entries, keys of 64 bytes, each text clipped
    to 64 KiB (head and tail kept). Errors are diagnostics: a long traceback must not fail
    the write that reports it, nor make every later write of the record expensive."""
    if error is None:
        return None
    if len(error) <= MAX_ERROR_ENTRIES and all(
        _size(k, _ERROR_KEY) <= _ERROR_KEY and _size(v, MAX_ERROR_TEXT) <= MAX_ERROR_TEXT
        for k, v in error.items()
    ):
        return error
    out: dict[str, str] = {}
    for k, v in list(error.items())[:MAX_ERROR_ENTRIES]:
        out[_clip(k, LIMITS["error.key"])] = _clip(v, MAX_ERROR_TEXT)
    return out


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


class Turn(NamedTuple):
    """One attempt as the record's ``history`` remembers it (stored as a 5-item array)."""

    attempt: int
    worker: str
    started_at: float
    ended_at: float | None = None
    outcome: str | None = None  # one of OUTCOMES once it ended


@dataclass(frozen=True)
class Record:
    """One invocation. Frozen: transitions return a new record (see ``lifecycle``)."""

    id: str
    ns: str
    queue: str
    fn: str  # "module:qualname"
    args: Blob
    state: State = State.QUEUED
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
    reruns: int = 0  # times q.retry queued it again: names its ticket (see keys.ticket)
    slot: int | None = None  # admission slot held while live (queues with max_depth)
    slot_etag: str | None = None
    history: tuple[Turn, ...] = ()  # the newest MAX_HISTORY attempts: who ran them, when
    # the retry rule (v2): exception type names matched against the raised one's classes
    retry_for: tuple[str, ...] = ()
    no_retry_for: tuple[str, ...] = ()
    retry_backoff_cap_s: float = DEFAULT_BACKOFF_CAP_S
    retry_jitter: float = 0.0  # fraction of the backoff drawn off at random, 0 to 1
    after: tuple[str, ...] = ()  # parents' ids: claimable once each is done (v2)
    after_failure: str = "kill"  # a parent that ended badly: "kill" the child, or "run" (v2)
    after_done: int = 0  # parents, in order, seen done: a later look starts past them (v2)
    after_pass: str = ""  # a fan-in's first argument: "ids" or "results" of the parents (v2)
    scheduled_at: float | None = None  # a delayed submit's due time, as it asked (v2)
    traceparent: str = ""  # the submit's W3C trace context, "" untraced (v2)
    tracestate: str = ""
    rev: int = 0
    wid: str = field(default_factory=lambda: write_id())
    v: int = 1  # the oldest schema that holds it: to_bytes raises it when a later field is set

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def is_payload(self) -> bool:
        """A work queue's invocation: a payload for a consumer, no function to run."""
        return self.fn == PAYLOAD_FN

    def next_write(self, **changes: Any) -> Record:
        """This record with ``changes`` applied, ``rev`` + 1 and a fresh ``wid``; an error
        map among the changes is clipped to its caps (:func:`clip_error`)."""
        if "error" in changes:
            changes["error"] = clip_error(changes["error"])
        if not changes.keys() <= _FIELD_SET:
            raise TypeError(f"Record has no field {sorted(changes.keys() - _FIELD_SET)[0]!r}")
        # dataclasses.replace, without its per-field walk through __init__ (it cost more than
        # the rest of a transition): the fields are copied as they are, then changed
        new = object.__new__(type(self))
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        fields["rev"] = self.rev + 1
        fields["wid"] = write_id()
        return new

    def to_bytes(self) -> bytes:
        # shallow on purpose: dataclasses.asdict deep-copies, which costs more than the write;
        # the fields in their declared order, read from the instance's dict in one C call
        obj = dict(zip(_FIELD_NAMES, _FIELD_VALUES(self.__dict__), strict=True))
        obj["args"] = self.args.to_obj()
        obj["result"] = self.result.to_obj() if self.result else None
        obj["history"] = [list(t) for t in self.history]
        lease = self.lease
        obj["lease"] = (
            {"worker": lease.worker, "token": lease.token, "expires_at": lease.expires_at}
            if lease
            else None
        )
        later = False
        for name, default in SINCE_V2.items():
            if obj[name] == default:
                del obj[name]
            elif name not in QUIET_SINCE_V2:
                later = True
        if later and obj["v"] < 2:
            obj["v"] = 2
        return pack_plain(obj)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "record") -> Record:
        """Decode and validate a record: every field must have its type and range (see
        ``docs/record.md``); anything else is refused, whoever wrote it.

        Raises:
            RecordError: the bytes are not a record, a field is missing, mistyped or out of
                range (``NewerRecord``: the record's schema is newer).
        """
        try:
            obj = unpack_plain(data)  # bounded per byte, as every decoder
        except Exception as e:
            raise RecordError(
                f"read {where}",
                f"not a valid record ({type(e).__name__})",
                "the object is corrupt or truncated; inspect or delete it with the store's tools",
            ) from None
        if not isinstance(obj, dict):
            raise RecordError(f"read {where}", "not a record (no field map)", "inspect it")
        v = obj.get("v")
        if type(v) is not int:
            raise RecordError(f"read {where}", "the record has no schema version", "inspect it")
        if v > SCHEMA_VERSION:
            raise NewerRecord(
                f"read {where}",
                f"record schema v{v} is newer than this lakeshore understands (v{SCHEMA_VERSION})",
                "upgrade lakeshore on this machine",
                version=v,
            )
        try:
            fields = _checked_fields(obj)
        except _Bad as e:
            raise RecordError(
                f"read {where}",
                f"record is missing or mangles a field: {e.field} {e.problem}",
                "the object is corrupt or was written by another program; "
                "cancel or delete the invocation",
                field=e.field,
            ) from None
        # every field is there and checked: the frozen dataclass's __init__ (a setattr per
        # field) would cost as much as the checks
        rec = object.__new__(cls)
        rec.__dict__.update(fields)
        return rec


class _Bad(Exception):
    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem


def _show(value: Any) -> str:
    """A short, safe description of a hostile value (never a deep repr)."""
    if value is None or type(value) in (bool, int, float):
        return repr(value)[:40]
    if type(value) in (str, bytes):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def _is_int(v: Any) -> bool:
    return type(v) is int  # bool is not an int here


def _is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}\Z")  # canonical (upper case) Crockford base32


MAX_COUNT = 2**31 - 1  # attempts, max_attempts, released


def _int(obj: dict[str, Any], name: str, low: int, high: float = math.inf) -> None:
    v = obj[name]
    if not _is_int(v) or v < low or v > high:
        span = f"from {low} to {high}" if high != math.inf else f">= {low}"
        raise _Bad(name, f"must be an integer {span}, got {_show(v)}")


def _number(
    obj: dict[str, Any],
    name: str,
    *,
    optional: bool = False,
    low: float = -math.inf,
    positive: bool = False,
) -> None:
    v = obj[name]
    if v is None and optional:
        return
    if not _is_number(v) or v < low or (positive and v <= 0):
        want = (
            "a positive number"
            if positive
            else f"a number >= {low}"
            if low > -math.inf
            else "a number"
        )
        raise _Bad(name, f"must be {want}{' or None' if optional else ''}, got {_show(v)}")


def _of_type(obj: dict[str, Any], name: str, expected: type, *, optional: bool = False) -> None:
    v = obj[name]
    if (v is None and optional) or type(v) is expected:
        return
    raise _Bad(
        name, f"must be a {expected.__name__}{' or None' if optional else ''}, got {_show(v)}"
    )


def _capped(value: Any, name: str, limit: str | None = None) -> None:
    """Refuse a str or bytes field over its cap (the type was checked before)."""
    if value is None:
        return
    cap = LIMITS[limit or name]
    n = _size(value, cap)
    if n > cap:
        raise _Bad(name, f"is {n} bytes, over the limit of {cap} bytes")


def _blob(obj: dict[str, Any], name: str) -> Blob:
    b: Any = obj[name]
    if type(b) is not dict:
        raise _Bad(name, f"must be a map, got {_show(b)}")
    if b.get("ref") is not None:
        ref: Any = b.get("ref")
        size: Any = b.get("size")
        sha: Any = b.get("sha256")
        if type(ref) is not str or not ref:
            raise _Bad(f"{name}.ref", f"must be an object key, got {_show(ref)}")
        _capped(ref, f"{name}.ref", "blob.ref")
        if not _is_int(size) or size < 0:
            raise _Bad(f"{name}.size", f"must be an integer >= 0, got {_show(size)}")
        if type(sha) is not str or not _HEX64.match(sha):
            raise _Bad(f"{name}.sha256", f"must be 64 hex digits, got {_show(sha)}")
        return Blob(ref=ref, size=size, sha256=sha)
    inline = b.get("inline")
    if type(inline) is not bytes:
        raise _Bad(f"{name}.inline", f"must be bytes, got {_show(inline)}")
    # Not capped on read: 0.3.0 kept values up to `spill_bytes` inline, and the record's own
    # read bound (MAX_RECORD_BYTES) already bounds what an inline value costs.
    return Blob(inline=inline)


def _lease(v: Any) -> Lease | None:
    if v is None:
        return None
    if type(v) is not dict:
        raise _Bad("lease", f"must be a map or None, got {_show(v)}")
    worker: Any = v.get("worker")
    token: Any = v.get("token")
    expires: Any = v.get("expires_at")
    if type(worker) is not str or type(token) is not str:
        raise _Bad("lease", "must have a str worker and a str token")
    if len(worker) * 4 > _LEASE_WORKER:  # possibly over: _capped measures it exactly
        _capped(worker, "lease.worker")
    if len(token) * 4 > _LEASE_TOKEN:
        _capped(token, "lease.token")
    if not _is_number(expires):
        raise _Bad("lease.expires_at", f"must be a number, got {_show(expires)}")
    return Lease(worker, token, float(expires))


def _error(v: Any) -> None:
    if v is None:
        return
    if type(v) is not dict or not all(type(k) is str and type(x) is str for k, x in v.items()):
        raise _Bad("error", "must be a map of str to str (type, message, traceback) or None")
    # Over its caps, an error map is clipped on read (see _checked_fields), not refused: it
    # is diagnostics, and 0.3.0 wrote whole error texts, even into records queued again for
    # a retry -- refusing them would fail those invocations as corrupt and hide failed ones' errors.


def _history(v: Any) -> tuple[Turn, ...]:
    """The well-formed entries of a stored history, the newest ``MAX_HISTORY`` (anything
    else is dropped, not refused: the history is for people, nothing decides by it, and a
    newer version may word an outcome this one does not know)."""
    if type(v) is not list:
        return ()
    turns = []
    for item in v[-MAX_HISTORY:]:
        if type(item) is not list or len(item) != 5:
            continue
        attempt, worker, started, ended, outcome = item
        if (
            _is_int(attempt)
            and 1 <= attempt <= MAX_COUNT
            and type(worker) is str
            and _size(worker, LIMITS["lease.worker"]) <= LIMITS["lease.worker"]
            and _is_number(started)
            and (ended is None or _is_number(ended))
            and (outcome is None or (type(outcome) is str and outcome in OUTCOMES))
        ):
            ended = None if ended is None else float(ended)
            turns.append(Turn(attempt, worker, float(started), ended, outcome))
    return tuple(turns)


def _journal(v: Any) -> None:
    if v is None:
        return
    if type(v) is not dict or len(v) > 8:
        raise _Bad("journal", f"must be a map of at most 8 entries or None, got {_show(v)}")
    attempt: Any = v.get("attempt")
    frames: Any = v.get("frames")
    ended: Any = v.get("ended")
    if not (_is_int(attempt) and attempt >= 0 and _is_int(frames) and frames >= 0):
        raise _Bad("journal", "must have an integer attempt >= 0 and frames >= 0")
    if type(ended) is not bool:
        raise _Bad("journal.ended", f"must be true or false, got {_show(ended)}")


def _checked_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """Every field of the record in ``obj``, checked; a field the writer left out has its
    default. Each check is inline and cheap; the helpers only run to word a refusal.

    Raises:
        _Bad: a required field is missing, or a field has the wrong type or range.
    """
    for name in _REQUIRED:
        if name not in obj:
            raise _Bad(name, "is missing")
    if obj.keys() <= _FIELD_SET:  # as written by lakeshore: nothing to leave out
        full = {**_DEFAULTS, **obj}
    else:  # a field of a newer minor version, or junk: ignored
        full = {**_DEFAULTS, **{k: v for k, v in obj.items() if k in _FIELD_SET}}
    if "wid" not in obj:
        full["wid"] = write_id()  # as a record made without one would have
    inv = full["id"]
    if type(inv) is not str:
        _of_type(full, "id", str)
    if not _ULID.match(inv):
        raise _Bad("id", f"must be a 26-character ULID, got {_show(inv)}")
    for name in ("ns", "queue"):
        _of_type(full, name, str)
        try:
            check_name(full[name], name)
        except InvalidArgument:
            raise _Bad(name, f"is not a valid name, got {_show(full[name])}") from None
    for name, cap in _TEXT:
        v = full[name]
        if type(v) is not str:
            _of_type(full, name, str)
        if len(v) * 4 > cap:
            _capped(v, name)
    for name, expected, cap in _OPTIONAL_TEXT:
        v = full[name]
        if v is not None:
            if type(v) is not expected:
                _of_type(full, name, expected, optional=True)
            if len(v) * 4 > cap:  # possibly over: _capped measures it exactly
                _capped(v, name)
    state = full["state"]  # a str read from the store, or the default
    state = _STATE_OF.get(state) if type(state) is str or type(state) is State else None
    if state is None:
        raise _Bad("state", f"must be one of {', '.join(STATES)}, got {_show(full['state'])}")
    full["state"] = state
    for name, low, high in _INTS:
        v = full[name]
        if type(v) is not int or v < low or v > high:
            _int(full, name, low, high)
    if full["slot"] is not None:
        _int(full, "slot", 0)
    for name in _OPTIONAL_NUMBERS:
        v = full[name]
        if v is not None and not _is_number(v):
            _number(full, name, optional=True)
    for name in ("not_before", "submitted_at"):
        if not _is_number(full[name]):
            _number(full, name)
    v = full["retry_backoff_s"]
    if not ((type(v) is int or type(v) is float) and math.isfinite(v) and v >= 0):
        _number(full, "retry_backoff_s", low=0)
    v = full["lease_s"]
    if not ((type(v) is int or type(v) is float) and math.isfinite(v) and v > 0):
        _number(full, "lease_s", positive=True)
    if full["timeout_s"] is not None and full["timeout_s"] <= 0:
        raise _Bad(
            "timeout_s", f"must be a positive number or None, got {_show(full['timeout_s'])}"
        )
    _error(full["error"])
    full["error"] = clip_error(full["error"])
    _journal(full["journal"])
    full["args"] = _blob(full, "args")
    full["result"] = None if full["result"] is None else _blob(full, "result")
    full["lease"] = _lease(full["lease"])
    full["history"] = _history(full["history"])
    # a child's fields (a record without parents skips this: four lookups, on every decode)
    if "after" in obj or "after_done" in obj or "after_failure" in obj or "after_pass" in obj:
        full["after"] = _after(full)
    _retry_rule(full)
    if "traceparent" in obj or "tracestate" in obj:  # dropped when malformed, never refused
        trace = checked_trace(obj.get("traceparent"), obj.get("tracestate"))
        full["traceparent"], full["tracestate"] = trace
    return full


def _after(full: dict[str, Any]) -> tuple[str, ...]:
    """The checked dependency fields of ``full``: the parents as a tuple. A child that names
    itself, or a parent twice, could never be judged; a count past the parents would let it
    be claimed before them."""
    after: Any = full["after"]
    if type(after) is not list and type(after) is not tuple:
        raise _Bad("after", f"must be a list of ids, got {_show(after)}")
    if len(after) > MAX_AFTER:
        raise _Bad("after", f"names {len(after)} parents, more than {MAX_AFTER}")
    for inv in after:
        if type(inv) is not str or not _ULID.match(inv):
            raise _Bad("after", f"must hold 26-character ULIDs, got {_show(inv)}")
    if len(set(after)) != len(after) or full["id"] in after:
        raise _Bad("after", "names a parent twice, or the invocation itself")
    done = full["after_done"]
    if not _is_int(done) or not 0 <= done <= len(after):
        raise _Bad("after_done", f"must be an integer from 0 to {len(after)}, got {_show(done)}")
    if type(full["after_failure"]) is not str or full["after_failure"] not in AFTER_FAILURES:
        raise _Bad(
            "after_failure", f"must be one of {AFTER_FAILURES}, got {_show(full['after_failure'])}"
        )
    if type(full["after_pass"]) is not str or full["after_pass"] not in AFTER_PASSES:
        raise _Bad("after_pass", f"must be one of {AFTER_PASSES}, got {_show(full['after_pass'])}")
    return tuple(after)


def _retry_rule(full: dict[str, Any]) -> None:
    """The retry rule's fields (v2): lists of at most 32 type names (read as tuples, as
    they were written), a cap from 0 to an hour and a jitter from 0 to 1."""
    for name in ("retry_for", "no_retry_for"):
        names = full[name]
        if type(names) is tuple and not names:
            continue  # the default: the field was left out
        if type(names) not in (list, tuple) or len(names) > MAX_NAMES:
            want = f"must be a list of at most {MAX_NAMES} type names"
            raise _Bad(name, f"{want}, got {_show(names)}")
        for item in names:
            problem = name_problem(item)
            if problem is not None:
                raise _Bad(name, f"holds a type name that {problem}")
        full[name] = tuple(names)
    for name in ("retry_backoff_cap_s", "retry_jitter"):
        problem = number_problem(name, full[name])
        if problem is not None:
            raise _Bad(name, problem)


_REQUIRED = ("id", "ns", "queue", "fn", "args")
# (field, cap) of the str fields, and (field, type, cap) of those that may be None
_TEXT = tuple((name, LIMITS[name]) for name in ("fn", "input_hash", "prefix", "wid"))
_OPTIONAL_TEXT = (
    ("key", str, LIMITS["key"]),
    ("slot_etag", str, LIMITS["slot_etag"]),
    ("fn_pickle", bytes, LIMITS["fn_pickle"]),
)
# counters are bounded far above any real use: arithmetic on them must stay cheap
_INTS: tuple[tuple[str, int, float], ...] = (
    ("priority", MIN_PRIORITY, MAX_PRIORITY),
    ("attempt", 0, MAX_COUNT),
    ("max_attempts", 1, MAX_COUNT),
    ("released", 0, MAX_COUNT),
    ("reruns", 0, MAX_COUNT),
    ("rev", 0, math.inf),
    ("v", 1, math.inf),
)
_OPTIONAL_NUMBERS = ("timeout_s", "deadline_at", "started_at", "finished_at", "scheduled_at")


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Record))
_FIELD_SET = frozenset(_FIELD_NAMES)
_FIELD_VALUES = operator.itemgetter(*_FIELD_NAMES)
_LEASE_WORKER, _LEASE_TOKEN = LIMITS["lease.worker"], LIMITS["lease.token"]
# what a field the writer left out reads as (checked like any written value)
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(Record) if f.default is not dataclasses.MISSING
}
_DEFAULTS["wid"] = ""
