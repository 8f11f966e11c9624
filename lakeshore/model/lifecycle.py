"""Pure state transitions of an invocation record. No I/O: each function takes a record and
the facts it needs (the store's clock, a lease token) and returns the next record, or raises
:class:`IllegalTransition` when the move is not allowed from the record's current state.

::

    submit -> queued -(claim)-> running -> succeeded | failed | killed | timeout
                 ^                  |
                 +------------------+   lease lost / retryable failure while attempts remain

The caller writes the returned record with one conditional PUT (``if_match`` the etag it read);
a lost race is a clean miss. Every returned record has ``rev`` + 1 and a fresh ``wid``.
"""

from __future__ import annotations

from typing import Any

from lakeshore.errors import IllegalTransition
from lakeshore.keys import id_time
from lakeshore.model.record import MAX_HISTORY, Lease, Record, State, Turn
from lakeshore.model.retry import MAX_BACKOFF_CAP_S

__all__ = [
    "CLOCK_SLACK_S",
    "MAX_BACKOFF_S",
    "MAX_DELAY_S",
    "backoff_s",
    "cancel",
    "claim",
    "expire",
    "fail",
    "heartbeat",
    "holds",
    "implausible",
    "parent_broke",
    "parents_seen",
    "past_deadline",
    "refuse",
    "release",
    "rerun",
    "succeed",
    "time_out",
]

# The longest wait before a retry: a record's retry_backoff_cap_s is at most this (its
# default is 300 s). Readers bound a queued record's not_before by it (implausible), and a
# draining worker waits for a retry it read no longer than this.
MAX_BACKOFF_S = MAX_BACKOFF_CAP_S
# The longest delay a submit may ask for (``_delay_s``, ``_not_before``): a year and a day.
# Further than that is a schedule's job, and a record claiming more is refused as implausible.
MAX_DELAY_S = 366 * 86_400.0
# How far ahead of the reader's store clock a time another process wrote may lie. Every
# writer takes its times from the store's clock, so honest ones differ by seconds; but a
# reader's clock may lag for a while (a machine that resumed from a suspend, an S3 clock
# whose samples are still old), and a refusal is final. A day is far past any honest lag and
# still short of what would park a record for good.
CLOCK_SLACK_S = 86_400.0


def _illegal(rec: Record, move: str) -> IllegalTransition:
    return IllegalTransition(
        f"{move} {rec.id}",
        f"not allowed from state {rec.state!r} (attempt {rec.attempt})",
        "re-read the record; another process moved it first",
        state=rec.state,
    )


def _began(rec: Record, worker: str, now: float) -> tuple[Turn, ...]:
    """The history with the attempt a claim starts (the oldest entries make room)."""
    return (*rec.history, Turn(rec.attempt + 1, worker, now))[-MAX_HISTORY:]


def _ended(rec: Record, now: float, outcome: str) -> tuple[Turn, ...]:
    """The history with the running attempt's entry closed (unchanged for a record that
    runs no attempt, or whose entry is missing: written before the history existed)."""
    last = rec.history[-1] if rec.history else None
    if rec.state != State.RUNNING or last is None or last.attempt != rec.attempt or last.outcome:
        return rec.history
    return (*rec.history[:-1], Turn(last.attempt, last.worker, last.started_at, now, outcome))


def holds(rec: Record, token: str) -> bool:
    """True when ``token`` is the lease of the record's current running attempt."""
    return rec.state == State.RUNNING and rec.lease is not None and rec.lease.token == token


def backoff_s(rec: Record, draw: float = 0.0) -> float:
    """Delay before the next attempt after attempt ``rec.attempt`` failed: exponential
    from ``retry_backoff_s``, capped at ``retry_backoff_cap_s``, less a random part of it
    up to ``retry_jitter``: ``draw`` is the caller's random number in [0, 1) (0: none), so
    the wait lies in ``[b * (1 - retry_jitter), b]`` for the capped backoff ``b``."""
    # the exponent is capped: a record from the store may claim any attempt number, and a
    # huge power would hold the interpreter (every thread of the worker) for minutes
    exponent = min(max(0, rec.attempt - 1), 32)
    cap = min(rec.retry_backoff_cap_s, MAX_BACKOFF_S)
    full = min(cap, rec.retry_backoff_s * 2**exponent)
    return float(full * (1.0 - rec.retry_jitter * min(max(draw, 0.0), 1.0)))


def past_deadline(rec: Record, now: float) -> bool:
    return rec.state == State.QUEUED and rec.deadline_at is not None and now > rec.deadline_at


def claim(rec: Record, worker: str, token: str, now: float, lease_s: float | None = None) -> Record:
    """queued -> running: the next attempt, leased to ``worker`` until ``now + lease_s``
    (the worker's lease length when it sets one, else the invocation's; the record keeps
    the one in force, which heartbeats use)."""
    if (
        rec.state != State.QUEUED
        or rec.not_before > now
        or past_deadline(rec, now)
        or rec.after_done < len(rec.after)  # a parent not seen done yet
    ):
        raise _illegal(rec, "claim")
    lease_s = lease_s or rec.lease_s
    return rec.next_write(
        state=State.RUNNING,
        attempt=rec.attempt + 1,
        lease_s=lease_s,
        lease=Lease(worker, token, now + lease_s),
        started_at=now,
        journal=None,
        history=_began(rec, worker, now),
    )


def heartbeat(rec: Record, token: str, now: float) -> Record:
    """running -> running with the lease pushed out to ``now + lease_s``."""
    if not holds(rec, token) or rec.lease is None:
        raise _illegal(rec, "heartbeat")
    return rec.next_write(lease=Lease(rec.lease.worker, token, now + rec.lease_s))


def succeed(
    rec: Record, token: str, result: object, now: float, journal: dict[str, Any] | None = None
) -> Record:
    """running -> succeeded, with the result blob (None for a streaming body, whose result
    is its journal)."""
    if not holds(rec, token):
        raise _illegal(rec, "complete")
    return rec.next_write(
        state=State.SUCCEEDED,
        result=result,
        error=None,
        finished_at=now,
        lease=None,
        journal=journal,
        history=_ended(rec, now, "succeeded"),
    )


def fail(
    rec: Record,
    token: str | None,
    error: dict[str, str],
    now: float,
    retry: bool = True,
    journal: dict[str, Any] | None = None,
    draw: float = 0.0,
) -> Record:
    """running -> queued for another attempt (after a backoff) while attempts remain and the
    failure is retryable; else running -> failed. ``token=None`` is the reaper's form: the
    lease must have expired instead. ``draw`` is the random number of the backoff's jitter
    (see :func:`backoff_s`)."""
    if token is None:
        if rec.state != State.RUNNING or rec.lease is None or rec.lease.expires_at >= now:
            raise _illegal(rec, "expire")
    elif not holds(rec, token):
        raise _illegal(rec, "fail")
    lost = "expired" if token is None else None
    if retry and rec.attempt - rec.released < rec.max_attempts:
        return rec.next_write(
            state=State.QUEUED,
            lease=None,
            error=error,
            not_before=now + backoff_s(rec, draw),
            journal=journal,
            history=_ended(rec, now, lost or "retried"),
        )
    return rec.next_write(
        state=State.FAILED,
        lease=None,
        error=error,
        finished_at=now,
        journal=journal,
        history=_ended(rec, now, lost or "failed"),
    )


def release(rec: Record, token: str, now: float) -> Record:
    """running -> queued at once, by the lease holder that is shutting down (a preempted
    scheduler's job): the attempt is handed back and does not count against ``max_attempts``."""
    if not holds(rec, token):
        raise _illegal(rec, "release")
    return rec.next_write(
        state=State.QUEUED,
        lease=None,
        not_before=now,
        released=rec.released + 1,
        journal=None,
        history=_ended(rec, now, "released"),
    )


def rerun(rec: Record, now: float) -> Record:
    """terminal -> queued: run a finished invocation again, as its next attempt (one more is
    allowed even if its attempts were used up). The id, arguments and key stay the same."""
    if not rec.terminal:
        raise _illegal(rec, "retry")
    return rec.next_write(
        state=State.QUEUED,
        reruns=rec.reruns + 1,
        max_attempts=max(rec.max_attempts, rec.attempt - rec.released + 1),
        not_before=now,
        deadline_at=None,
        lease=None,
        result=None,
        error=None,
        finished_at=None,
        journal=None,
    )


def parents_seen(rec: Record, done: int) -> Record:
    """queued -> queued: ``done`` of the child's parents, in order, were seen done (a
    progress mark, so a later look starts past them; it never goes back)."""
    if rec.state != State.QUEUED or not rec.after_done < done <= len(rec.after):
        raise _illegal(rec, "note parents of")
    return rec.next_write(after_done=done)


def parent_broke(rec: Record, now: float, done: int, why: str) -> Record:
    """queued -> killed: the child's parents before index ``done`` were seen done, and the
    one at ``done`` ended badly (``why``: "failed", "was killed", "timed out", "was not
    found ..."): the child does not run without it. The count is kept, so a rerun of the
    child after one of its parent starts at that parent."""
    if rec.state != State.QUEUED or not rec.after_done <= done < len(rec.after):
        raise _illegal(rec, "end child")
    parent = rec.after[done]
    message = f"parent {parent} {why}: this invocation depends on it and will not run"
    error = {"type": "ParentFailed", "message": message, "traceback": ""}
    return _stopped(rec, now, State.KILLED, error, after_done=done)


def expire(rec: Record, now: float, draw: float = 0.0) -> Record:
    """A running attempt whose lease ran out (worker crashed or cut off): retried or failed."""
    worker = rec.lease.worker if rec.lease else "?"
    error = {
        "type": "LeaseExpired",
        "message": f"attempt {rec.attempt} on worker {worker} stopped renewing its lease",
        "traceback": "",
    }
    return fail(rec, None, error, now, draw=draw)


def cancel(rec: Record, now: float, reason: str = "cancelled") -> Record:
    """queued | running -> killed. The running worker notices at its next heartbeat."""
    if rec.terminal:
        raise _illegal(rec, "cancel")
    return _stopped(rec, now, State.KILLED, {"type": "Killed", "message": reason, "traceback": ""})


def time_out(rec: Record, now: float, token: str | None = None) -> Record:
    """running (past ``timeout_s``, by its lease holder) or queued (past ``deadline_at``)
    -> timeout. Not retried: a body that ran out of time would run out again."""
    if token is not None and holds(rec, token):
        message = f"attempt {rec.attempt} ran longer than timeout_s={rec.timeout_s}"
    elif token is None and past_deadline(rec, now):
        waited = (rec.deadline_at or 0.0) - rec.submitted_at
        message = (
            f"never started: still queued at its deadline, {waited:g} s after submission "
            "(the queue's deadline_cutoff_s or the submit's _deadline_s)"
        )
    else:
        raise _illegal(rec, "timeout")
    return _stopped(
        rec, now, State.TIMEOUT, {"type": "Timeout", "message": message, "traceback": ""}
    )


def implausible(rec: Record, now: float) -> str | None:
    """Why a live record's times cannot be true at store time ``now``, or None. A record
    comes from the store, where anyone who may write can put any number: a ``not_before``
    years away would keep its ticket at the head of the queue for ever, a lease that ends
    in a year would hold the invocation as long. So no time may lie further ahead than
    its writer could have put it honestly: ``CLOCK_SLACK_S`` past ``now`` for the times
    something happened (``submitted_at``, ``started_at``, ``finished_at``), a backoff
    more for ``not_before`` (up to ``MAX_DELAY_S`` for a delayed submit, whose id sorts its
    ticket by its due time), a lease more for the lease's end. ``deadline_at`` is a
    promise, not an event, and may lie as far ahead as the submitter likes; the id's time
    comes from the submitter's own clock, which may be off, and an id from the future only
    sorts its ticket last."""
    ahead = now + CLOCK_SLACK_S
    events = {
        "submitted_at": rec.submitted_at,
        "started_at": rec.started_at,
        "finished_at": rec.finished_at,
    }
    for name, t in events.items():
        if t is not None and t > ahead:
            return f"{name} lies {t - now:.0f} s ahead of the store's clock"
    if rec.not_before > ahead + MAX_BACKOFF_S and (
        rec.not_before > ahead + MAX_DELAY_S or not _sorts_when_due(rec)
    ):
        return (
            f"not_before lies {rec.not_before - now:.0f} s ahead of the store's clock, "
            f"more than any backoff ({MAX_BACKOFF_S:g} s) and not a delayed submit's"
        )
    if rec.lease is not None and rec.lease.expires_at > ahead + rec.lease_s:
        return (
            f"the lease ends {rec.lease.expires_at - now:.0f} s after the store's clock, "
            f"more than its lease_s ({rec.lease_s:g} s)"
        )
    return None


def _sorts_when_due(rec: Record) -> bool:
    """A delayed submit's id carries its due time (``keys.new_id(at=)``), so its ticket sorts
    behind the work due before it: such a record harms no one by waiting. The id's time is
    the submitter's reading of the store clock, the same one ``not_before`` came from."""
    try:
        return id_time(rec.id) >= rec.not_before - 1.0
    except ValueError:
        return False


def refuse(rec: Record, now: float, why: str) -> Record:
    """queued | running -> failed, not retried: a record whose times are
    :func:`implausible`. Its ticket can then be dropped and gc collects it like any other."""
    if rec.terminal:
        raise _illegal(rec, "refuse")
    error = {
        "type": "ImplausibleRecord",
        "message": f"{why}: no worker will wait for it; submit it again if it was meant",
        "traceback": "",
    }
    return _stopped(rec, now, State.FAILED, error)


def _stopped(
    rec: Record, now: float, state: State, error: dict[str, Any], **changes: Any
) -> Record:
    """``rec`` ended by someone other than its body (a cancel, a timeout, a refusal, a
    parent), with ``changes`` besides."""
    return rec.next_write(
        state=state,
        lease=None,
        error=error,
        finished_at=now,
        history=_ended(rec, now, state),
        **changes,
    )
