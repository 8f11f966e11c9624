"""Examining a listed ticket: read the record behind it and settle what needs no claim.

On its way to a claim, a claim scheduler drops a stale ticket, requeues (or fails) an
expired lease, times out a missed deadline, fails a corrupt or implausible record and
remembers what is not due. What it found is one of :class:`Seen` (nothing to claim now), or a
:class:`Claimable` record. Which case a record read behind a ticket is in is a
:class:`Situation` (:func:`standing`); :meth:`Examiner.examine` reads and dispatches, one
handler per case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import math
import random
from dataclasses import dataclass
from typing import assert_never

from lakeshore.errors import Conflict, NewerRecord, NotFound, RecordError
from lakeshore.keys import QueueKeys
from lakeshore.model import lifecycle
from lakeshore.model.record import Record, State
from lakeshore.protocol.claim_memory import SLACK_S, TicketMemory
from lakeshore.protocol.claim_order import Picker
from lakeshore.protocol.dependencies import Parents
from lakeshore.protocol.steps import (
    CLAIM_FENCE_S,
    MARKER_MAX,
    ORPHAN_GRACE_S,
    QueueOps,
    decode_ticket,
    elapsed,
    unclaimed,
    unclaimed_etag,
)
from lakeshore.store.base import ObjectInfo
from lakeshore.text import inert

__all__ = ["Claimable", "Examined", "Examiner", "Read", "Seen", "Situation", "standing"]

log = logging.getLogger("lakeshore.worker")

_RERUN_GRACE_S = 30.0  # a ticket of a life the record has not reached: a rerun until this old
_OTHER_SIDE_S = 300.0  # a payload seen by a function worker (or the reverse): passed over
# an invocation another process ended this recently: its own batch delete of the ticket is
# due within a second or so; a delete from every process that lists it meanwhile would cost
# a request each. After this, whoever meets the ticket deletes it (its holder may have died)
_TIDY_GRACE_S = 10.0
# a marker this fresh beside a record still running may be a move back to queued in flight
# (its writer rewrites the ticket first, then the record): looked at again this soon, not at
# the lease end (docs/protocol.md#retry-and-lease-expiry)
_FRESH_MARKER_S = 5.0
_FRESH_LOOK_S = 1.0
_TIDIED = (
    State.SUCCEEDED,
    State.FAILED,
)  # the outcomes whose worker deletes the ticket (a cancel's
# producer does not: a claimer drops that ticket when it meets it)


@dataclass(frozen=True)
class Read:
    """A record read behind a listed ticket: the record, its etag (:func:`unclaimed` when
    it is the ticket's content: no ``<id>/record`` yet) and the ticket's etag."""

    record: Record
    etag: str
    ticket_etag: str


class Seen(enum.StrEnum):
    """What an examination found, when there is nothing to claim now."""

    LEFT = "left"  # settled or remembered; nothing said of another process
    # another process holds it, or it is over: what tells of its lane's owner at work (a
    # retry backing off, a lease this process ended or a record being written does not)
    TAKEN = "taken"
    MOVED = "moved"  # this process ended an expired lease on the way (requeued or failed)


@dataclass(frozen=True)
class Claimable:
    """What an examination found claimable now; ``moved``: after ending an expired lease
    (requeued, due at once)."""

    read: Read
    moved: bool = False


Examined = Seen | Claimable  # the result of examining a ticket


class Situation(enum.StrEnum):
    """Where a record read behind a ticket stands, by the checks of :func:`standing` in
    their order: the first that holds decides."""

    TOMBSTONE = "tombstone"  # the ticket holds a terminal record: a submit fenced out
    EARLIER_LIFE = "earlier life"  # a ticket of an earlier life (or not one we write)
    LATER_LIFE = "later life"  # a ticket of a life the record has not reached
    IMPLAUSIBLE = "implausible"  # live, with a time no honest writer puts there
    LEASED = "leased"  # running, and its lease holds
    EXPIRED = "expired"  # running, and its lease ran out
    OVER = "over"  # terminal in this ticket's life
    PAST_DEADLINE = "past deadline"  # queued past its deadline_at
    BACKING_OFF = "backing off"  # queued, before its not_before
    OTHER_SIDE = "other side"  # a payload for a function worker, or the reverse
    WAITING = "waiting"  # queued and due, a parent not seen done yet (docs/dependencies.md)
    DUE = "due"  # queued and due: claimable


def standing(read: Read, key: str, now: float, payloads: bool) -> Situation:
    """Where the record ``read`` behind the ticket ``key`` stands at store time ``now``, for
    a function worker or a consumer (``payloads``)."""
    rec = read.record
    if unclaimed(read.etag) and rec.terminal:
        return Situation.TOMBSTONE
    life = QueueKeys.reruns_of(key)
    if life is None or rec.reruns > life:
        return Situation.EARLIER_LIFE
    if rec.reruns < life:
        return Situation.LATER_LIFE
    if not rec.terminal and lifecycle.implausible(rec, now) is not None:
        return Situation.IMPLAUSIBLE
    return by_state(rec, now, payloads)


def by_state(rec: Record, now: float, payloads: bool) -> Situation:
    """Where ``rec``, of this ticket's life and plausible, stands by its state."""
    match rec.state:
        case State.RUNNING:
            expires = rec.lease.expires_at if rec.lease is not None else now
            return Situation.LEASED if expires >= now else Situation.EXPIRED
        case State.SUCCEEDED | State.FAILED | State.KILLED | State.TIMEOUT:
            return Situation.OVER
        case State.QUEUED:
            if lifecycle.past_deadline(rec, now):
                return Situation.PAST_DEADLINE
            if rec.not_before > now:
                return Situation.BACKING_OFF
            if rec.is_payload != payloads:
                return Situation.OTHER_SIDE
            if rec.after_done < len(rec.after):
                return Situation.WAITING
            return Situation.DUE
        case _ as unreachable:
            assert_never(unreachable)


def _settled(moved: bool) -> Seen:
    """Nothing to claim now, and nothing said of another process."""
    return Seen.MOVED if moved else Seen.LEFT


def _ticket(info: ObjectInfo, etag: str) -> ObjectInfo:
    """The listed ticket ``info`` as of ``etag`` (what is remembered of it)."""
    return ObjectInfo(info.key, etag, 0, 0.0)


class Examiner:
    """Examines the tickets of ``ops``'s queue for the claimer of worker ``worker`` (a
    function worker, or a consumer: ``payloads``), which remembers in ``memory`` and picks
    by ``order`` (which take the claimer's lock: the examiner keeps no state of its own)."""

    def __init__(
        self,
        ops: QueueOps,
        worker: str,
        memory: TicketMemory,
        order: Picker,
        *,
        payloads: bool = False,
    ) -> None:
        self._ops = ops
        self._worker = worker  # its own leases are no collision
        self._memory = memory
        self._order = order
        self._payloads = payloads
        self._parents = Parents(ops)  # a waiting child's, found by id in any queue
        # the queues this claimer's worker serves (Claimer.serving): a parent queued in one
        # of them will run here, so a draining worker stays for its child
        self.serves = frozenset({ops.keys.queue})

    def _remember(self, info: ObjectInfo, until: float) -> None:
        self._memory.remember(info.key, info.etag, until)

    def _drop(self, info: ObjectInfo, if_match: str | None = None) -> None:
        self._memory.forget(info.key)
        self._ops.drop_ticket(info, if_match)

    # -- the dispatcher ------------------------------------------------------------------------

    def examine(self, info: ObjectInfo, now: float, record_first: bool = False) -> Examined:
        """Read the record behind a ticket and settle what needs no claim: drop a stale
        ticket, requeue an expired lease, time out a missed deadline, remember what is not
        due. The record, its etag and the ticket's etag when it is claimable now; else
        whether an expired lease was ended (``MOVED``), or whether another process holds it
        or it is over (``TAKEN``)."""
        inv = QueueKeys.id_of(info.key)
        try:
            got = self._read_listed(info, inv, record_first)
        except NotFound:
            return self._missing(info, now)
        except NewerRecord:
            self._remember(info, now + ORPHAN_GRACE_S)  # for a newer lakeshore's workers
            return Seen.LEFT
        except RecordError as e:
            if self._ops.fail_corrupt(inv, e, now):
                self._drop(info)  # the record is failed now: its ticket is stale
            return Seen.LEFT
        if got is None:
            return Seen.LEFT
        self._memory.found(info.key)
        return self._settle(info, got, standing(got, info.key, now, self._payloads), now)

    def _settle(
        self, info: ObjectInfo, got: Read, where: Situation, now: float, moved: bool = False
    ) -> Examined:
        """What to do with the record ``got`` behind ``info``, standing ``where``; ``moved``:
        this examination ended its expired lease."""
        match where:
            case Situation.TOMBSTONE:
                return self._tombstone(info, got)
            case Situation.EARLIER_LIFE:
                return self._earlier_life(info)
            case Situation.LATER_LIFE:
                return self._later_life(info, got, now)
            case Situation.IMPLAUSIBLE:
                return self._implausible(info, got, now)
            case Situation.LEASED:
                return self._leased(info, got, now)
            case Situation.EXPIRED:
                return self._expired(info, got, now)
            case Situation.OVER:
                return self._over(info, got, now, moved)
            case Situation.PAST_DEADLINE:
                return self._past_deadline(info, got, now, moved)
            case Situation.BACKING_OFF:
                return self._backing_off(info, got, now, moved)
            case Situation.OTHER_SIDE:
                return self._other_side(info, got, now, moved)
            case Situation.WAITING:
                return self._waiting(info, got, now, moved)
            case Situation.DUE:
                return Claimable(got, moved)
            case _ as unreachable:
                assert_never(unreachable)

    # -- one handler per case ------------------------------------------------------------------

    def _missing(self, info: ObjectInfo, now: float) -> Seen:
        if info.last_modified < now - ORPHAN_GRACE_S:
            self._drop(info)  # a marker whose record is gone (gc, by hand)
        else:  # a record being written or deleted: look again soon, then less and less
            # often, so a young one is picked up at once and an orphan costs a dozen
            # GETs until it can be dropped. (Not from the ticket's age: listings give
            # last-modified times in whole seconds.)
            misses = self._memory.missed(info.key)
            wait = min(0.005 * 2 ** min(misses, 12), 5.0)
            self._remember(info, min(now + wait, info.last_modified + ORPHAN_GRACE_S))
        return Seen.LEFT

    def _tombstone(self, info: ObjectInfo, got: Read) -> Seen:
        # a tombstone (a submit fenced out): it stays, so the late submit cannot land;
        # gc removes it with the finished invocations
        self._remember(_ticket(info, got.ticket_etag), math.inf)
        return Seen.LEFT

    def _earlier_life(self, info: ObjectInfo) -> Seen:
        self._drop(info)  # a ticket of an earlier life (or not one we write)
        return Seen.LEFT

    def _later_life(self, info: ObjectInfo, got: Read, now: float) -> Seen:
        # a rerun between its ticket and its record write, or a ticket nobody should
        # have written: look again once it is older than a rerun takes
        if info.last_modified > now - _RERUN_GRACE_S:
            self._remember(info, info.last_modified + _RERUN_GRACE_S)
        else:  # unless a rerun rewrote it since it was read (its record may be queued now)
            self._drop(info, if_match=got.ticket_etag)
        return Seen.LEFT

    def _implausible(self, info: ObjectInfo, got: Read, now: float) -> Seen:
        why = lifecycle.implausible(got.record, now)
        assert why is not None  # as standing() found
        # a time no honest writer puts there: waiting for it would park the ticket at
        # the head of the queue for good, so the record is failed and the ticket dropped
        refused = lifecycle.refuse(got.record, now, why)
        try:
            self._ops.cas(refused, got.etag)
        except Conflict:
            self._memory.lost_create(info.key, got.etag)
            return Seen.LEFT
        inv = QueueKeys.id_of(info.key)
        log.warning("claim on %s: failed %s: %s", self._ops.keys.queue, inv, inert(why))
        self._ops.free_slot(refused)
        self._drop(info)
        return Seen.LEFT

    def _leased(self, info: ObjectInfo, got: Read, now: float) -> Seen:
        rec = got.record
        expires = rec.lease.expires_at if rec.lease is not None else now
        if info.size <= MARKER_MAX and info.last_modified > now - _FRESH_MARKER_S:
            expires = min(expires, now + _FRESH_LOOK_S)  # a retry or release in flight?
        self._remember(info, expires)  # its worker holds it: look again at expiry
        holder = rec.lease.worker if rec.lease is not None else self._worker
        if holder == self._worker:
            return Seen.LEFT
        # taken by another process since we listed it: spread out as after a
        # lost race, or this process keeps walking just behind the other
        self._order.collided(True, info.key, raced=False)
        self._order.seen_another(info.key)
        return Seen.TAKEN

    def _expired(self, info: ObjectInfo, got: Read, now: float) -> Examined:
        nxt = lifecycle.expire(got.record, now, random.random())  # the backoff's jitter
        ticket_etag = got.ticket_etag
        if nxt.state == State.QUEUED:
            ticket_etag = self._ops.put_marker(nxt)  # before the record says queued
        try:
            etag = self._ops.cas(nxt, got.etag)
        except Conflict:
            return Seen.TAKEN  # the holder renewed or someone else reaped
        self._ops.free_slot(nxt)
        moved = Read(nxt, etag, ticket_etag)
        return self._settle(info, moved, by_state(nxt, now, self._payloads), now, moved=True)

    def _over(self, info: ObjectInfo, got: Read, now: float, moved: bool) -> Seen:
        # in this ticket's life: it is over (a rerun writes its own ticket)
        rec = got.record
        over = rec.finished_at or 0.0
        # (a time ahead of a clock's slack is a skewed or forged one: not waited for)
        if not moved and rec.state in _TIDIED and now - _TIDY_GRACE_S < over <= now + SLACK_S:
            # a worker ended it just now: its batch delete is on the way
            self._remember(_ticket(info, got.ticket_etag), over + _TIDY_GRACE_S)
            return Seen.TAKEN
        # its holder may have died between the terminal write and its tidying: the
        # admission slot goes first (producers no longer repair slots), then the ticket
        self._ops.free_slot(rec)
        self._drop(info)
        return Seen.MOVED if moved else Seen.TAKEN

    def _past_deadline(self, info: ObjectInfo, got: Read, now: float, moved: bool) -> Seen:
        ended = lifecycle.time_out(got.record, now)
        try:
            self._ops.cas(ended, got.etag)
        except Conflict:
            self._memory.lost_create(info.key, got.etag)
            return _settled(moved)
        self._ops.free_slot(ended)
        self._drop(info)
        return _settled(moved)

    def _backing_off(self, info: ObjectInfo, got: Read, now: float, moved: bool) -> Seen:
        # backing off before a retry, or delayed by its submitter; the ticket stays
        due = got.record.not_before
        self._remember(_ticket(info, got.ticket_etag), due)
        if got.record.attempt > 0:
            # a retry: a draining worker waits for it; a delayed first run is not yet work
            self._memory.backing_off(due, now)
        return _settled(moved)

    def _other_side(self, info: ObjectInfo, got: Read, now: float, moved: bool) -> Seen:
        # the other side's (a queue both use): look again only if the ticket changes
        self._remember(_ticket(info, got.ticket_etag), now + _OTHER_SIDE_S)
        return _settled(moved)

    def _waiting(self, info: ObjectInfo, got: Read, now: float, moved: bool) -> Examined:
        # a child: its parents from the first not seen done, up to the first not done now
        began = elapsed()
        rec = got.record
        judged = self._parents.judge(rec, self.serves, now)
        if judged.why:  # a parent ended badly: the child never runs (docs/dependencies.md)
            ended = lifecycle.parent_broke(rec, now, judged.done, judged.why)
            try:
                self._ops.cas(ended, got.etag)
            except Conflict:
                self._memory.lost_create(info.key, got.etag)
                return _settled(moved)
            log.info(
                "claim on %s: killed %s: parent %s %s",
                self._ops.keys.queue,
                rec.id,
                judged.parent,
                judged.why,
            )
            self._ops.free_slot(ended)
            self._drop(info)
            return _settled(moved)
        if judged.done == len(rec.after):  # every parent done: the claim writes the count
            return Claimable(
                Read(dataclasses.replace(rec, after_done=judged.done), got.etag, got.ticket_etag),
                moved,
            )
        advanced = judged.done > rec.after_done
        ticket_etag = got.ticket_etag
        if advanced:  # shared with every claimer: the next look starts past them
            seen = lifecycle.parents_seen(rec, judged.done)
            try:
                etag = self._ops.cas(seen, got.etag)
            except Conflict:
                self._memory.lost_create(info.key, got.etag)
                return _settled(moved)
            if (
                unclaimed(got.etag)
                and elapsed() - began >= CLAIM_FENCE_S
                and self._ops.unclaim_if_stale(info.key, got.ticket_etag, seen, etag)
            ):
                # as for a slow claim: the record this write created may belong to an
                # invocation that ended and was collected meanwhile; it was deleted again
                self._memory.forget(info.key)
                return _settled(moved)
            if unclaimed(got.etag):
                # its record exists now: the ticket becomes a marker, so every claimer
                # reads the record (and its mark) instead of the ticket as submitted
                ticket_etag = self._ops.put_marker(seen)
        wait = self._memory.waiting(info.key, advanced)
        self._remember(_ticket(info, ticket_etag), now + wait)
        if judged.soon:  # a parent at work, or queued here: a draining worker stays for it
            self._memory.backing_off(now + wait, now)
        return _settled(moved)

    # -- reading -------------------------------------------------------------------------------

    def _read_listed(self, info: ObjectInfo, inv: str, record_first: bool = False) -> Read | None:
        """The record behind a listed ticket, its etag and the ticket's etag; None for a
        stray ticket (dropped). A ticket that holds a record is read itself (one GET for a
        fresh submit), unless a create of its record already failed; a marker's record is
        read directly.

        Raises:
            NotFound: a marker (or a ticket whose record existed) and no record.
            RecordError: neither the ticket nor the record can be used.
        """
        full = info.size > MARKER_MAX and not self._memory.promoted(info.key)
        if full and (record_first or self._order.mostly_taken()):
            # Most of this process's recent picks had been claimed by others since its
            # listing: this full ticket's record most likely exists, and it tells so for one
            # GET, where reading the ticket and trying to create the record would be two.
            with contextlib.suppress(NotFound):
                rec, rec_etag = self._ops.read_record(inv)
                return Read(rec, rec_etag, info.etag)
        if full:
            data, etag = self._ops.read_bounded(info.key)  # NotFound: gone since the listing
            if len(data) > MARKER_MAX:
                try:
                    return Read(
                        decode_ticket(data, self._ops.keys, info.key), unclaimed_etag(etag), etag
                    )
                except NewerRecord:
                    raise
                except RecordError as err:
                    if self._ops.keys.ticket_of_id(inv) != info.key:
                        # not where lakeshore puts this id's ticket: no invocation's (yet:
                        # a rerun may overwrite it with its ticket before this delete)
                        self._drop(info, if_match=etag)
                        return None
                    try:  # a record that exists is the truth; its ticket is only a marker
                        rec, rec_etag = self._ops.read_record(inv)
                    except NotFound:
                        raise err from None  # nothing to run: _fail_corrupt records why
                    return Read(rec, rec_etag, etag)
            info = ObjectInfo(info.key, etag, len(data), info.last_modified)
        try:
            rec, rec_etag = self._ops.read_record(inv)
        except NotFound:
            if info.size > MARKER_MAX and self._memory.promoted(info.key):
                # a full ticket whose record was deleted again (a claim undone after it
                # could not prove its ticket): the ticket holds the invocation once more
                self._memory.demote(info.key)
                return self._read_listed(info, inv)
            raise
        return Read(rec, rec_etag, info.etag)
