"""Every object key lakeshore writes, built in one place.

No other module spells a key: queue records, records, spilled values, journals, logs,
tickets, idempotency keys, admission slots and rate tokens, topic posts, the id index, signs
of life, the scaler's lease, schedules and the doctor's probes all come from here, relative to the
store's root (the Dispatch URL's prefix).

Keys sort correctly by construction, also on servers that list by walking directories
(SeaweedFS): within every folder the queue lists, all names have the same length and alphabet
(ULIDs, one-digit bands, zero-padded numbers, sha256 digests), so none is a sibling's prefix
and byte order is the order we mean. Names of namespaces and queues are validated and ids must
parse as ULIDs, before any request, so no caller-supplied text can climb out of its folder.

The layout, key by key: docs/protocol.md#key-layout; the order:
docs/protocol.md#why-the-keys-sort-correctly.
"""

from __future__ import annotations

import hashlib
import re

from ulid import ULID

from lakeshore.errors import InvalidArgument

__all__ = [
    "DEFAULT_QUEUE",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "QueueKeys",
    "band_of_id",
    "check_id",
    "check_name",
    "id_index",
    "id_time",
    "is_name",
    "namespace_prefix",
    "namespaces_prefix",
    "new_id",
    "past_folder",
    "probe_prefix",
    "topic_prefix",
    "topic_seq_key",
    "worker_key",
    "workers_prefix",
]

ROOT = "lakeshore"
DEFAULT_QUEUE = "default"
MIN_PRIORITY, MAX_PRIORITY = 0, 9
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}\Z")
_SEQ_WIDTH = 12  # 10^12 frames per attempt or topic: more than any stream will hold
_ATTEMPT_WIDTH = 4
_RANDOM_MASK = (1 << 80) - 1  # a ULID is a 48-bit millisecond time and 80 random bits


def check_name(name: str, what: str) -> str:
    """Validate a namespace, queue or topic name.

    Raises:
        InvalidArgument: the name is not 1-63 characters of ``[a-z0-9._-]`` starting with a
            letter or digit.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgument(
            f"{what} name",
            f"{name!r} is not a valid {what} name",
            "use 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit",
            name=name,
        )
    return name


def is_name(name: object) -> bool:
    """Whether ``name`` is a valid namespace, queue or topic name (anyone's text may not be)."""
    return type(name) is str and _NAME.match(name) is not None


def check_id(inv: str) -> str:
    """Validate an invocation id (a ULID string) and return it in canonical form.

    Raises:
        InvalidArgument: ``inv`` is not a ULID string.
    """
    try:
        return str(ULID.from_str(inv))
    except (ValueError, TypeError, AttributeError):
        raise InvalidArgument(
            "invocation id",
            f"{inv!r} is not an invocation id",
            "pass the ULID string submit() returned, e.g. '01JD2K7Q...'",
            id=inv,
        ) from None


def new_id(priority: int = 5, at: float | None = None) -> str:
    """A fresh invocation id: a ULID, so ids sort by submission time, whose last character
    is its ticket's band (``9 - priority``), so the ticket of any id can be found without a
    listing. ``at`` (epoch seconds) gives the id another time than now: a delayed submit's
    id carries its due time, so its ticket sorts behind the work that is due before it.

    Raises:
        InvalidArgument: ``priority`` is not an integer from 0 to 9, or ``at`` is outside
            what a ULID can hold.
    """
    if at is None:
        value = int(ULID())
    else:
        if not 0 <= at < 2**48 / 1000:
            raise InvalidArgument("invocation id", f"time {at!r} is out of range", "use epoch s")
        value = int(ULID.from_timestamp(at))
    # The random part moves up 5 bits to make room for the band (the last base32 digit is the
    # low 5 bits). The library counts it up by one for ids of the same millisecond, so they
    # stay distinct and in order; masking the low bits instead would make them collide.
    rand = ((value << 5) | int(band(priority))) & _RANDOM_MASK
    return str(ULID.from_int((value & ~_RANDOM_MASK) | rand))


def id_time(inv: str) -> float:
    """The time (seconds since the epoch) an id carries: when it was submitted, or, for a
    delayed submit, when it comes due.

    Raises:
        ValueError: ``inv`` is not a ULID.
    """
    return float(ULID.from_str(inv).timestamp)


def band_of_id(inv: str) -> str | None:
    """The band an id was made for (its last character), or None for an id made without one
    (before 0.4: such ids have their record from the start)."""
    last = inv[-1:]
    return last if "0" <= last <= "9" else None


def seq_name(seq: int) -> str:
    """A sequence number as a fixed-width name."""
    if not 0 <= seq < 10**_SEQ_WIDTH:
        raise InvalidArgument("sequence", f"{seq} is out of range", "use 0 <= seq < 10^12")
    return f"{seq:0{_SEQ_WIDTH}d}"


def band(priority: int) -> str:
    """Priority -> ticket band; higher priority lists first."""
    if not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidArgument(
            "priority",
            f"{priority!r} is not a priority",
            f"use an integer from {MIN_PRIORITY} (lowest) to {MAX_PRIORITY} (highest)",
        )
    return str(MAX_PRIORITY - priority)


class QueueKeys:
    """The keys of one queue in one namespace."""

    def __init__(self, ns: str, queue: str) -> None:
        self.ns = check_name(ns, "namespace")
        self.queue = check_name(queue, "queue")
        self.base = f"{ROOT}/{self.ns}/{self.queue}"
        self.tickets_prefix = f"{self.base}/_tickets/"
        self.slots_prefix = f"{self.base}/_slots/"
        self.rate_prefix = f"{self.base}/_rate/"

    @property
    def queue_record(self) -> str:
        return f"{self.base}/_queue"

    @property
    def scaler_lease(self) -> str:
        return f"{self.base}/_scaler"

    @property
    def schedules_prefix(self) -> str:
        return f"{self.base}/_schedules/"

    def schedule(self, name: str) -> str:
        """A schedule object of this queue (the name is checked like a queue's).

        Raises:
            InvalidArgument: a bad schedule name.
        """
        return f"{self.schedules_prefix}{check_name(name, 'schedule')}"

    def record(self, inv: str) -> str:
        return f"{self.base}/{inv}/record"

    def args(self, inv: str) -> str:
        return f"{self.base}/{inv}/args"

    def result(self, inv: str, attempt: int) -> str:
        return f"{self.base}/{inv}/result-{attempt:0{_ATTEMPT_WIDTH}d}"

    def journal_prefix(self, inv: str, attempt: int) -> str:
        return f"{self.base}/{inv}/journal/{attempt:0{_ATTEMPT_WIDTH}d}/"

    def journal(self, inv: str, attempt: int, seq: int) -> str:
        return self.journal_prefix(inv, attempt) + seq_name(seq)

    def logs_prefix(self, inv: str, attempt: int | None = None) -> str:
        base = f"{self.base}/{inv}/logs/"
        return base if attempt is None else f"{base}{attempt:0{_ATTEMPT_WIDTH}d}/"

    def logs(self, inv: str, attempt: int, seq: int) -> str:
        return self.logs_prefix(inv, attempt) + seq_name(seq)

    def invocation_prefix(self, inv: str) -> str:
        """Every object of one invocation lives under this prefix (tickets and keys do not)."""
        return f"{self.base}/{inv}/"

    @property
    def ids_prefix(self) -> str:
        """Invocation folders sort before the ``_`` folders: ULIDs are 0-9 and A-Z."""
        return f"{self.base}/"

    def ticket(self, priority: int, inv: str, reruns: int = 0) -> str:
        """The ticket of ``inv`` in its ``reruns``-th life: each rerun has a key of its own,
        so a late delete of an earlier life's ticket can never remove the live one. The
        suffix sorts right after the id (``.`` sorts before every id character)."""
        suffix = f".{reruns}" if reruns else ""
        return f"{self.tickets_prefix}{band(priority)}/{inv}{suffix}"

    def ticket_of_id(self, inv: str) -> str | None:
        """The ticket key of an id made by :func:`new_id` (None for an older id)."""
        b = band_of_id(inv)
        return None if b is None else f"{self.tickets_prefix}{b}/{inv}"

    def slot(self, n: int) -> str:
        return f"{self.slots_prefix}{n:07d}"

    def rate_window_prefix(self, window: int) -> str:
        return f"{self.rate_prefix}{window:012d}/"

    def rate_token(self, window: int, n: int) -> str:
        return f"{self.rate_window_prefix(window)}{n:07d}"

    def idem(self, key: str) -> str:
        """The create-only object that makes ``_key`` idempotent per namespace + queue."""
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return f"{self.base}/_keys/{digest}"

    @staticmethod
    def id_of(ticket_key: str) -> str:
        """The invocation id at the end of a ticket key."""
        return ticket_key.rsplit("/", 1)[1].split(".", 1)[0]

    @staticmethod
    def reruns_of(ticket_key: str) -> int | None:
        """The life a ticket key names (0 without a suffix); None for a malformed suffix."""
        name = ticket_key.rsplit("/", 1)[1]
        if "." not in name:
            return 0
        n = name.split(".", 1)[1]
        return int(n) if n.isdigit() and n[0] != "0" and len(n) <= 9 else None

    @staticmethod
    def priority_of(ticket_key: str) -> int:
        return MAX_PRIORITY - int(ticket_key.rsplit("/", 2)[1])


def topic_prefix(ns: str, name: str) -> str:
    return f"{ROOT}/{check_name(ns, 'namespace')}/_topics/{check_name(name, 'topic')}/"


def topic_seq_key(ns: str, name: str, seq: int) -> str:
    return topic_prefix(ns, name) + seq_name(seq)


def worker_key(ns: str, worker: str) -> str:
    """A worker's sign-of-life object; the worker name is reduced to safe characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", worker)[:200] or "worker"
    return f"{ROOT}/{check_name(ns, 'namespace')}/_workers/{safe}"


def workers_prefix(ns: str) -> str:
    return f"{ROOT}/{check_name(ns, 'namespace')}/_workers/"


def probe_prefix(ns: str) -> str:
    """An empty folder of the namespace: where a store lists to read its clock (a role's
    policy grants listing there, and nothing is ever written under it)."""
    return f"{ROOT}/{check_name(ns, 'namespace')}/_clock/"


def id_index(ns: str, inv: str) -> str:
    """Where a reader that knows only the id finds the queue of a non-default-queue invocation."""
    return f"{ROOT}/{check_name(ns, 'namespace')}/_ids/{inv}"


def doctor_prefix(ns: str | None) -> str:
    """Where ``lakeshore doctor`` puts its probe objects: inside a namespace (whose worker
    policy may write there), or, without one, a folder beside the namespaces."""
    if ns is None:
        return "lakeshore-doctor/"
    return f"{ROOT}/{check_name(ns, 'namespace')}/_doctor/"


def namespaces_prefix() -> str:
    """Every namespace's folder is under here."""
    return f"{ROOT}/"


def past_folder(prefix: str, name: str) -> str:
    """The listing position just after every key lakeshore writes in the folder
    ``<prefix><name>/`` (the largest code point after its ``/``). Not ``<name>0``, the next
    name in byte order: a server that lists by walking directories (SeaweedFS) puts ``a/``
    before ``a-b/``, and would skip ``a-b`` from there."""
    return f"{prefix}{name}/\U0010ffff"


def namespace_prefix(ns: str) -> str:
    """Everything of one namespace: its queue folders and its ``_`` folders."""
    return f"{ROOT}/{check_name(ns, 'namespace')}/"
