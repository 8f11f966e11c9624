"""``lakeshore doctor``: is lakeshore safe on this store?

Not every "S3-compatible" server implements conditional writes, and some check the condition
and then write without a lock in between. lakeshore's guarantees rest on those writes, so the
doctor probes a store the way the queue uses it (read after write, create-only, if-match,
delete-if-match, races of many threads on one key, list after write and order, the store
clock) and gives a verdict: SAFE only when every required check passed. A race can prove a
store unsafe, never safe. Optional checks (list order, store clock, an emulated conditional
delete) warn and never change the verdict. ``quick`` skips the two races (all but a few dozen
of the requests, and nearly all the time on a server whose contended writes wait): its
verdict covers one writer at a time only.

All probe objects live under ``lakeshore-doctor/<ulid>/`` (or, given a namespace,
``lakeshore/<ns>/_doctor/<ulid>/``, which a worker's policy covers) and are removed
afterwards; they are the only keys this module writes. Each check: docs/doctor.md#checks.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ulid import ULID

from lakeshore import keys
from lakeshore.errors import Conflict, LakeshoreError, NotFound
from lakeshore.store.base import CREATE, OVERWRITE, Store, if_match

__all__ = ["Check", "Report", "diagnose", "race"]


@dataclass
class Check:
    """One probe: its name, whether it passed, and what was seen."""

    name: str
    ok: bool
    detail: str
    required: bool = True  # a failed optional check is reported but does not make it unsafe

    def line(self, width: int = 16) -> str:
        """One table row: mark, name, what was seen."""
        mark = "ok  " if self.ok else ("FAIL" if self.required else "warn")
        return f"  {mark}  {self.name:<{width}}  {self.detail}"


@dataclass
class Report:
    """The doctor's findings for one store."""

    url: str
    checks: list[Check] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # probes not run (``quick``)

    @property
    def safe(self) -> bool:
        """True when every required check passed."""
        return all(c.ok for c in self.checks if c.required)

    def render(self) -> str:
        """A plain-text table and a verdict line."""
        lines = [f"lakeshore doctor: {self.url}", ""]
        lines += [c.line() for c in self.checks]
        lines.append("")
        if self.safe and self.skipped:
            lines.append(
                f"verdict: SAFE FOR ONE WRITER — every conditional write held; --quick skipped "
                f"{' and '.join(self.skipped)}, so races were not probed: run lakeshore doctor "
                "without --quick once before trusting a new server."
            )
        elif self.safe:
            lines.append(
                "verdict: SAFE — every conditional write held, under races too; lakeshore can "
                "run on this store. (A race probe can prove a store unsafe, never prove it safe: "
                "rerun with more --rounds for more confidence.)"
            )
        else:
            failed = ", ".join(c.name for c in self.checks if c.required and not c.ok)
            lines.append(
                f"verdict: UNSAFE — {failed} failed; do not run lakeshore on this store "
                "(invocations could run twice or be lost). Use AWS S3, SeaweedFS or a local "
                "directory."
            )
        return "\n".join(lines)


def diagnose(
    store: Store,
    *,
    threads: int = 8,
    rounds: int = 20,
    on_check: Callable[[Check], None] | None = None,
    ns: str | None = None,
    quick: bool = False,
) -> Report:
    """Probe ``store`` and return a :class:`Report`; never raises for a misbehaving store.
    ``on_check`` is called with each check as it completes (progress for slow stores).
    With ``ns``, the probes live inside that namespace, where a worker's policy may write.
    With ``quick``, the races (``threads`` × ``rounds`` writes each) are skipped and named
    in the report's ``skipped``.

    Raises:
        LakeshoreError: only when the store cannot be reached at all (the first write fails
            for a reason other than a lost condition).
    """
    base = f"{keys.doctor_prefix(ns)}{ULID()}"
    store.probe_within(f"{base}/")  # the clock's first LIST stays where a role may list
    report = Report(store.url)
    store.put(f"{base}/hello", b"hello", OVERWRITE)  # unreachable stores fail here, loudly
    probes: list[tuple[str, Callable[[Store, str], str]]] = [
        ("read after write", _read_after_write),
        ("create-only", _create_only),
        ("if-match", _if_match),
        ("delete-if-match", _delete_if_match),
        ("create race", lambda s, b: _race_create(s, b, threads, rounds)),
        ("if-match race", lambda s, b: _race_if_match(s, b, threads, rounds)),
        ("list after write", _list_after_write),
        ("list order", _list_order),
    ]
    if quick:
        report.skipped = [name for name, _ in probes if name in _RACES]
        probes = [(name, probe) for name, probe in probes if name not in _RACES]

    def add(check: Check) -> None:
        report.checks.append(check)
        if on_check:
            on_check(check)

    client = getattr(store, "client_info", "")
    if client:  # which HTTP client an S3 store sends its requests with
        add(Check("S3 client", True, client, False))
    try:
        for name, probe in probes:
            required = name not in _OPTIONAL
            try:
                check = Check(name, True, probe(store, f"{base}/{_slug(name)}"), required)
            except _Failed as e:
                check = Check(name, False, str(e), required)
            except LakeshoreError as e:
                check = Check(name, False, f"error: {e}", required)
            add(check)
            finding = _conditional_delete(store) if name == "delete-if-match" else None
            if finding:
                add(finding)  # right after the probe that made the store find out
        add(_clock(store))
    finally:
        _cleanup(store, base)
    return report


class _Failed(Exception):
    pass


# Reported, never part of the verdict: lakeshore's key layout does not depend on list order,
# and claims and completions rest on conditional PUTs, not on conditional deletes.
_OPTIONAL = {"list order", "conditional delete"}
_RACES = ("create race", "if-match race")  # what ``quick`` skips


def _conditional_delete(s: Store) -> Check | None:
    """A warning when the store emulates conditional deletes (only ``S3Store`` can, after a
    501 from the server); ``None`` when the server or the store itself checks the etag."""
    if getattr(s, "conditional_delete", "server") != "emulated":
        return None
    return Check(
        "conditional delete",
        False,
        "emulated: the server answers DELETE with If-Match with 501 NotImplemented, so the "
        "store compares the etag with a HEAD, then deletes; not atomic (a write landing in "
        "between is deleted too); prefer a server that implements conditional deletes",
        required=False,
    )


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise _Failed(what)


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def _read_after_write(s: Store, b: str) -> str:
    e1 = s.put(f"{b}/k", b"one")
    _expect(s.get(f"{b}/k") == (b"one", e1), "get did not return the bytes and etag just written")
    e2 = s.put(f"{b}/k", b"two")
    _expect(e2 != e1, "etag did not change when the bytes changed")
    _expect(s.get(f"{b}/k")[0] == b"two", "overwrite not visible to the next get")
    try:
        s.get(f"{b}/absent")
        raise _Failed("get of a missing key did not report not-found")
    except NotFound:
        pass
    return "get sees every write; etags change with content"


def _create_only(s: Store, b: str) -> str:
    s.put(f"{b}/k", b"first", CREATE)
    _expect(
        not _try(lambda: s.put(f"{b}/k", b"second", CREATE)), "a second create-only write succeeded"
    )
    _expect(s.get(f"{b}/k")[0] == b"first", "the refused create changed the object")
    return "If-None-Match: * refuses an existing key"


def _if_match(s: Store, b: str) -> str:
    e1 = s.put(f"{b}/k", b"v1")
    e2 = s.put(f"{b}/k", b"v2", if_match(e1))
    _expect(
        not _try(lambda: s.put(f"{b}/k", b"v3", if_match(e1))), "a stale If-Match write succeeded"
    )
    _expect(s.get(f"{b}/k") == (b"v2", e2), "the refused write changed the object")
    _expect(
        not _try(lambda: s.put(f"{b}/missing", b"x", if_match(e2))),
        "If-Match on a missing key created it",
    )
    return "current etag accepted; stale etag and missing key refused"


def _delete_if_match(s: Store, b: str) -> str:
    e1 = s.put(f"{b}/k", b"v1")
    e2 = s.put(f"{b}/k", b"v2")
    _expect(not _try(lambda: s.delete(f"{b}/k", if_match=e1)), "delete with a stale etag succeeded")
    _expect(s.get(f"{b}/k")[0] == b"v2", "the refused delete removed the object")
    s.delete(f"{b}/k", if_match=e2)
    try:
        s.get(f"{b}/k")
        raise _Failed("delete with the current etag left the object in place")
    except NotFound:
        pass
    return "stale etag refused; current etag deletes"


def race(threads: int, rounds: int, attempt: Callable[[int, int], bool]) -> list[int]:
    """Run ``attempt(round, thread)`` on ``threads`` threads released together for each round;
    return the number of winners (attempts that returned True) per round.

    Raises:
        BaseException: the first exception any racer raised (never swallowed).
    """
    winners: list[int] = []
    for r in range(rounds):
        barrier = threading.Barrier(threads)
        wins = [False] * threads
        errors: list[BaseException] = []

        def run(
            t: int,
            r: int = r,
            barrier: threading.Barrier = barrier,
            wins: list[bool] = wins,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                barrier.wait()
                wins[t] = attempt(r, t)
            except BaseException as e:
                errors.append(e)

        pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        if errors:
            raise errors[0]
        winners.append(sum(wins))
    return winners


def _try(fn: Callable[[], object]) -> bool:
    """False when ``fn`` raised Conflict (its condition was refused), else True."""
    try:
        fn()
    except Conflict:
        return False
    return True


def _timed_race(threads: int, rounds: int, write: Callable[[int, int], object]) -> str:
    slowest = [0.0]

    def attempt(r: int, t: int) -> bool:
        t0 = time.monotonic()
        try:
            return _try(lambda: write(r, t))
        finally:
            slowest[0] = max(slowest[0], time.monotonic() - t0)  # a race on max is harmless

    winners = race(threads, rounds, attempt)
    bad = [w for w in winners if w != 1]
    _expect(
        not bad,
        f"{len(bad)} of {rounds} rounds had {sorted(set(bad))} winners instead of 1 "
        f"({threads} threads)",
    )
    return (
        f"{rounds} rounds × {threads} threads: exactly one winner each; "
        f"slowest writer {slowest[0]:.2f} s"
    )


def _race_create(s: Store, b: str, threads: int, rounds: int) -> str:
    return _timed_race(threads, rounds, lambda r, t: s.put(f"{b}/{r:04d}", f"{t}".encode(), CREATE))


def _race_if_match(s: Store, b: str, threads: int, rounds: int) -> str:
    etags = [s.put(f"{b}/{r:04d}", b"start") for r in range(rounds)]
    return _timed_race(
        threads, rounds, lambda r, t: s.put(f"{b}/{r:04d}", f"{t}".encode(), if_match(etags[r]))
    )


def _list_after_write(s: Store, b: str) -> str:
    keys = [f"{b}/{i:03d}" for i in range(12)]
    for k in reversed(keys):
        s.put(k, b"x")
    listed = [o.key for o in s.list(f"{b}/")]
    _expect(
        listed == keys, f"LIST right after the writes showed {len(listed)} of {len(keys)} in order"
    )
    after = [o.key for o in s.list(f"{b}/", start_after=keys[5])]
    _expect(after == keys[6:], "start_after did not resume right after the given key")
    s.delete(keys[0])
    _expect(keys[0] not in [o.key for o in s.list(f"{b}/")], "a deleted key still listed")
    return "writes and deletes visible to the next LIST, in key order"


def _list_order(s: Store, b: str) -> str:
    # '-' sorts before '/', so byte order puts "a-b" first; a server that walks directories
    # lists everything under "a/" first.
    keys = [f"{b}/a-b", f"{b}/a/x"]
    for k in keys:
        s.put(k, b"x")
    listed = [o.key for o in s.list(f"{b}/")]
    _expect(
        listed == keys,
        "LIST walks directories ('a/x' before 'a-b'), not byte order; harmless for lakeshore, "
        "whose keys never put such siblings side by side",
    )
    return "strict byte order, as AWS S3 lists"


def _clock(s: Store) -> Check:
    try:
        skew = round(s.now() - time.time(), 1) + 0.0  # + 0.0 turns -0.0 into 0.0
    except LakeshoreError as e:
        return Check("store clock", False, f"cannot read: {e}", False)
    note = "" if abs(skew) < 5 else " — local clock is off; leases use the store's clock anyway"
    source = getattr(s, "clock_source", "")
    source = f" ({source})" if source else ""
    return Check(
        "store clock", True, f"local clock is {skew:+.1f} s from the store's{source}{note}", False
    )


def _cleanup(s: Store, base: str) -> None:
    # Best effort: the prefix is named for the doctor and can be removed by hand.
    with contextlib.suppress(LakeshoreError):
        for obj in list(s.list(f"{base}/")):
            s.delete(obj.key)
