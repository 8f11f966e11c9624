"""Submitting: from a call to a published invocation record.

The steps, in order: validate options and bind the call to the function's signature (the
input hash), encode the arguments, upload the producer's pending files, look at the
idempotency key, pass admission (slots and rate tokens), take the key (create-only), then
publish: spilled arguments, id index, then the ticket, which holds the record (create-only,
the one write that makes the invocation exist). Anything that fails after admission gives
its slot and token back.

A keyed submit takes its key first (:mod:`lakeshore.protocol.idempotency`: the key object,
its repair after a dead submitter, the fence of the old id). A submit that finds a tombstone
at its own id (it was too slow and judged dead) never returns that id: it raises, or, with a
key, starts over.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
from collections.abc import Iterable
from inspect import Parameter
from typing import TYPE_CHECKING, Any

from lakeshore import codec, tracing
from lakeshore.errors import (
    Conflict,
    InvalidArgument,
    KeyReused,
    LakeshoreError,
    NotFound,
)
from lakeshore.files.context import flush
from lakeshore.keys import band, new_id
from lakeshore.model.dependencies import check_after
from lakeshore.model.lifecycle import MAX_DELAY_S
from lakeshore.model.record import MAX_COUNT, Blob, Record, State, check_fields, check_key_arg
from lakeshore.model.retry import DEFAULT_BACKOFF_CAP_S
from lakeshore.plane import HasPlane, Plane, plane_of
from lakeshore.protocol.admission import admit, give_back_rate
from lakeshore.protocol.idempotency import HeldKey, move_key, needs_new_id, take_or_read
from lakeshore.protocol.steps import QueueOps
from lakeshore.running.bodies import Declared
from lakeshore.running.child import refuse_script_rerun
from lakeshore.running.failure import RetryOptions
from lakeshore.scope import current_prefix

if TYPE_CHECKING:
    from lakeshore.model.queue_config import QueueConfig

__all__ = [
    "OPTIONS",
    "Prepared",
    "abandoned",
    "check_options",
    "prepare_call",
    "publish_prepared",
    "submit_call",
]

# the options of a submit (``Udf.submit`` spells them with a leading underscore)
OPTIONS = frozenset(
    {
        "key",
        "priority",
        "max_attempts",
        "timeout_s",
        "deadline_s",
        "strict_key",
        "submit_timeout",
        "delay_s",
        "not_before",
        "after",
        "after_failure",
        "retry_for",
        "no_retry_for",
        "retry_backoff_s",
        "retry_backoff_cap_s",
        "retry_jitter",
    }
)


def check_options(
    options: dict[str, Any], op: str, allowed: frozenset[str] = OPTIONS, also: str = ""
) -> None:
    """Refuse options not in ``allowed``, naming the valid ones (a mistyped ``_prio=``
    must not pass as an argument of the function, nor fail as a bare TypeError).

    Raises:
        InvalidArgument: an unknown option.
    """
    unknown = sorted(f"_{k}" for k in options if k not in allowed)
    if unknown:
        valid = ", ".join(sorted(f"_{k}" for k in allowed))
        raise InvalidArgument(
            op,
            f"unknown option(s) {', '.join(unknown)}",
            f"the options are {valid}{also} (a parameter of the function whose name starts "
            "with _ is passed by position)",
        )


def submit_call(
    plane: Plane | HasPlane,
    udf: Declared,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    **options: Any,
) -> str:
    """Enqueue ``udf(*args, **kwargs)`` on ``plane`` (a ``Dispatch`` or its ``Plane``); see
    :meth:`Udf.submit`.

    Raises:
        InvalidArgument: unsendable arguments or a bad option.
        KeyReused: strict idempotency and the key names different arguments.
        QueueFull: admission refused the submit (or no room came within
            ``submit_timeout`` seconds on a blocking queue).
        Conflict: the submit stalled so long that it was judged dead and fenced out
            (nothing was submitted; submit again), or a key kept changing under it.
        StoreError: the key's object in the store is not one lakeshore wrote, or the
            store failed.
    """
    check_options(options, f"submit {udf.ref}")
    prep = prepare_call(plane_of(plane), udf, args, kwargs, **options)
    flush()  # uploads first: a slot or key held through slow uploads would look abandoned
    return publish_prepared(prep)


def prepare_call(
    plane: Plane,
    udf: Declared,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    key: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    deadline_s: float | None = None,
    strict_key: bool = False,
    submit_timeout: float = 60.0,
    delay_s: float | None = None,
    not_before: datetime.datetime | None = None,
    retry_for: Any = None,
    no_retry_for: Any = None,
    retry_backoff_s: float | None = None,
    retry_backoff_cap_s: float | None = None,
    retry_jitter: float | None = None,
    after: Iterable[str] | None = None,
    after_failure: str = "kill",
    after_pass: str = "",
) -> Prepared:
    """Everything a submit settles without writing: options checked, the call bound to the
    signature, the arguments encoded. Reads only the queue's (cached) settings, and the
    scope of the calling thread, so a batch prepares every call before it writes any.

    Raises:
        InvalidArgument: unsendable arguments or a bad option.
        RecordError: the queue record is corrupt.
    """
    refuse_script_rerun(f"submit {udf.ref}")
    udf.check_reachable(plane.in_process)
    conf = plane.settings.get(udf.queue)
    prio = priority if priority is not None else (udf.priority if udf.priority is not None else 5)
    band(prio)  # validates the priority before anything is written
    attempts = next(
        a
        for a in (max_attempts, udf.max_attempts, conf.max_attempts, plane.max_attempts)
        if a is not None
    )
    tmo = next((t for t in (timeout_s, udf.timeout_s, conf.timeout_s) if t is not None), None)
    if deadline_s is None:
        deadline_s = conf.deadline_cutoff_s
    if (
        not 1 <= attempts <= MAX_COUNT
        or (tmo is not None and not (math.isfinite(tmo) and tmo > 0))
        or (deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0))
    ):
        raise InvalidArgument(
            f"submit {udf.ref}",
            "max_attempts, timeout_s or deadline_s out of range",
            f"use 1 <= _max_attempts <= {MAX_COUNT} and finite positive _timeout_s / _deadline_s",
        )
    check_key_arg(key, f"submit {udf.ref}")
    due = _due(plane, f"submit {udf.ref}", delay_s, not_before)
    rule = RetryOptions.given(
        f"submit {udf.ref}",
        retry_for,
        no_retry_for,
        retry_backoff_s,
        retry_backoff_cap_s,
        retry_jitter,
    ).over(udf.retry)
    parents, after_failure = check_after(after, after_failure, f"submit {udf.ref}")
    # a fan-in's body gets its parents first (docs/dependencies.md): bound as their ids
    bound = (list(parents), *args) if after_pass else tuple(args)
    payload = codec.encode((tuple(args), kwargs), f"arguments of {udf.ref}")
    if len(payload) > plane.max_payload_bytes:
        raise InvalidArgument(
            f"submit {udf.ref}",
            f"the arguments are {len(payload)} bytes, over max_payload_bytes="
            f"{plane.max_payload_bytes}",
            "write large inputs with dls.run.write under q.scope(...) and pass their keys",
        )
    prefix = current_prefix()
    draft = Record(
        id="",
        ns=plane.ns,
        queue=udf.queue,
        fn=udf.ref,
        fn_pickle=udf.pickled(),
        args=Blob(inline=b""),
        key=key,
        input_hash=_input_hash(udf, bound, kwargs, prefix),
        prefix=prefix,
        priority=prio,
        max_attempts=attempts,
        timeout_s=tmo,
        retry_backoff_s=next(
            b
            for b in (rule.backoff_s, conf.retry_backoff_s, plane.retry_backoff_s)
            if b is not None
        ),
        lease_s=conf.lease_s or plane.lease_s,
        not_before=due,
        scheduled_at=due or None,
        retry_for=rule.retry_for or (),
        no_retry_for=rule.no_retry_for or (),
        retry_backoff_cap_s=(
            rule.backoff_cap_s if rule.backoff_cap_s is not None else DEFAULT_BACKOFF_CAP_S
        ),
        retry_jitter=rule.jitter or 0.0,
        after=parents,
        after_failure=after_failure,
        after_pass=after_pass,
    )
    check_fields(draft, f"submit {udf.ref}")  # size caps, before anything is written
    return Prepared(
        plane, plane.ops(udf.queue), conf, draft, payload, deadline_s, submit_timeout, strict_key
    )


def publish_prepared(prep: Prepared) -> str:
    """Write a prepared submit (admission, key, objects, record); returns its id. Safe to
    call from many threads at once, one prepared submit each.

    Raises:
        KeyReused, QueueFull, Conflict, StoreError: as :func:`submit_call`.
    """
    with tracing.submitting(prep.draft.queue, prep.draft.fn) as traced:
        inv = _publish_one(prep.traced(traced.traceparent, traced.tracestate))
        traced.identify(inv)
        return inv


def _publish_one(prep: Prepared) -> str:
    ref, key = prep.draft.fn, prep.draft.key
    if key is None:
        inv = prep.new_id()
        admitted, token = prep.admit(inv)
        if not _publish_admitted(prep, inv, admitted, token):
            raise abandoned(ref, inv)
        return inv
    return _submit_keyed(prep, ref, key, prep.strict_key)


@dataclasses.dataclass
class Prepared:
    """One submit's settled inputs: what prepare_call hands to publish_prepared."""

    plane: Plane
    ops: QueueOps
    conf: QueueConfig
    draft: Record
    payload: bytes
    deadline_s: float | None
    wait_s: float
    strict_key: bool = False

    def traced(self, traceparent: str, tracestate: str) -> Prepared:
        """This submit with the trace context its record carries on (none: itself)."""
        if not traceparent:  # outside a producer's span, or tracing is off
            return self
        draft = dataclasses.replace(self.draft, traceparent=traceparent, tracestate=tracestate)
        return dataclasses.replace(self, draft=draft)

    def new_id(self) -> str:
        """An id for this submit: a delayed one carries its due time, so its ticket sorts
        behind the work due before it."""
        return new_id(self.draft.priority, self.draft.not_before or None)

    @property
    def limited(self) -> bool:
        return self.conf.max_depth is not None or self.conf.rate_limit is not None

    def admit(self, inv: str) -> tuple[Record, tuple[str, str] | None]:
        """Take a slot and a rate token for ``inv`` (on a limited queue): the draft carrying
        the slot, and the token.

        Raises:
            QueueFull: admission refused.
        """
        conf = self.conf
        if not self.limited:
            return self.draft, None
        slot, token = admit(
            self.ops,
            inv,
            conf.max_depth,
            conf.rate,
            conf.on_full,
            self.wait_s,
            self.plane.store.now,
        )
        draft = dataclasses.replace(
            self.draft, slot=slot.n if slot else None, slot_etag=slot.etag if slot else None
        )
        return draft, token


_KEY_ROUNDS = 8  # a key that changes under us this often is being fought over: give up


def _submit_keyed(prep: Prepared, ref: str, key: str, strict: bool) -> str:
    """A submit with ``_key``: return the id the key names, or make the key name a new
    invocation. The key moves to a new id (compare-and-swap on its etag) only once its old
    id is fenced: a tombstone record, so the old submit can never become live after all.
    An invocation is never published under an id whose key was taken by someone else."""
    fenced: set[str] = set()  # ids this call saw fenced: the key must move off them
    for _ in range(_KEY_ROUNDS):
        inv = prep.new_id()
        # on a limited queue only look: admission comes before the key is taken
        held = take_or_read(prep.ops, key, inv, prep.draft.input_hash, create=not prep.limited)
        if held is None and not prep.limited:
            continue  # taken and removed (gc) between our create and our read: again
        move: HeldKey | None = None
        if held is not None and not held.mine:
            if strict and held.input_hash != prep.draft.input_hash:
                raise KeyReused(
                    f"submit _key={key!r}",
                    f"the key already names invocation {held.id} with different arguments",
                    "use a new key, or drop _strict_key to get the existing id back",
                    id=held.id,
                )
            if held.id not in fenced and not needs_new_id(prep.ops, held):
                return held.id
            move = held
        mine = held is not None and held.mine
        draft, token = (prep.draft, None) if mine else prep.admit(inv)
        try:
            wrote = mine or move_key(prep.ops, key, inv, prep.draft.input_hash, move)
        except BaseException:
            _undo_admission(prep.ops, inv, draft, token)
            raise
        if not wrote:
            _undo_admission(prep.ops, inv, draft, token)
            continue  # the key changed under us: look again
        if _publish_admitted(prep, inv, draft, token):
            return inv
        fenced.add(inv)  # too slow, fenced out (its admission was given back)
    raise Conflict(
        f"submit _key={key!r}",
        f"the key changed under this submit {_KEY_ROUNDS} times in a row",
        "other producers are racing on this key; submit again",
    )


def _due(
    plane: Plane, op: str, delay_s: float | None, not_before: datetime.datetime | None
) -> float:
    """The store time a delayed submit comes due (0.0: at once), from ``_delay_s`` (counted
    on the store's clock, which is the one claims are judged by) or ``_not_before``.

    Raises:
        InvalidArgument: both given, a delay that is not a number from 0 to
            ``MAX_DELAY_S``, or a ``_not_before`` that is not an aware datetime (or too far).
    """
    if delay_s is None and not_before is None:
        return 0.0
    if delay_s is not None and not_before is not None:
        raise InvalidArgument(op, "both _delay_s and _not_before given", "pass one of them")
    now = plane.store.now()
    if delay_s is not None:
        if (
            isinstance(delay_s, bool)
            or not isinstance(delay_s, (int, float))
            or not (math.isfinite(delay_s) and 0 <= delay_s <= MAX_DELAY_S)
        ):
            raise InvalidArgument(
                op,
                f"_delay_s={delay_s!r}",
                f"pass seconds from 0 to {MAX_DELAY_S:.0f} (a year and a day); "
                "for later or repeated runs use a schedule",
            )
        due = now + float(delay_s)
    else:
        if not isinstance(not_before, datetime.datetime) or not_before.utcoffset() is None:
            raise InvalidArgument(
                op,
                f"_not_before={not_before!r} is not a datetime with a time zone",
                "pass an aware datetime, e.g. datetime.now(timezone.utc) + timedelta(hours=1)",
            )
        due = not_before.timestamp()
        if due > now + MAX_DELAY_S:
            raise InvalidArgument(
                op,
                f"_not_before={not_before.isoformat()} is more than a year and a day away",
                "use a schedule for runs that far ahead",
            )
    return due if due > now else 0.0  # a time already past: due at once, like no delay


def abandoned(ref: str, inv: str) -> Conflict:
    """The error of a submit fenced out before its ticket landed (nothing was submitted)."""
    return Conflict(
        f"submit {ref}",
        f"the submit of {inv} was too slow to write its record and was abandoned (its "
        "admission slot was freed, or gc swept its folder): nothing was submitted",
        "submit again; upload large inputs before submitting, not inside a stalled process",
        id=inv,
    )


def _publish_admitted(
    prep: Prepared, inv: str, draft: Record, token: tuple[str, str] | None
) -> bool:
    """Publish ``inv``; False when it was fenced out meanwhile (a tombstone holds its id):
    its slot and rate token are then given back. Other failures give them back too."""
    try:
        if _publish(prep, inv, draft):
            return True
    except BaseException:
        _undo_admission(prep.ops, inv, draft, token)
        raise
    prep.ops.free_slot(dataclasses.replace(draft, id=inv, state=State.KILLED))
    give_back_rate(prep.ops, token)
    return False


def _undo_admission(ops: QueueOps, inv: str, draft: Record, token: tuple[str, str] | None) -> None:
    """A submit that was admitted but did not happen gives its slot and token back (the
    slot only if the record really is not there)."""
    try:
        ops.read(inv)
        return
    except NotFound:
        pass
    except LakeshoreError:
        return  # cannot tell: keep the slot (a leak is repaired later; excess never is)
    ops.free_slot(dataclasses.replace(draft, id=inv, state=State.KILLED))
    give_back_rate(ops, token)


def _publish(prep: Prepared, inv: str, draft: Record) -> bool:
    """Publish ``inv`` (:meth:`QueueOps.publish`); False when a record was at ``inv`` already
    (a tombstone: this submit was fenced out)."""
    published = prep.ops.publish(
        dataclasses.replace(draft, id=inv), prep.payload, prep.plane.spill_bytes, prep.deadline_s
    )
    if published is None:
        return False
    prep.plane.remember(inv, published.queue)
    return True


VAR_KEYWORD = Parameter.VAR_KEYWORD


def _input_hash(
    udf: Declared, args: tuple[Any, ...], kwargs: dict[str, Any], prefix: str = ""
) -> str:
    """A digest of the call that does not depend on how it was spelled: arguments are bound to
    the function's signature (positional or keyword, any order, defaults filled in). The
    scope is part of the call: the same keys under another scope are other files.

    Raises:
        InvalidArgument: the arguments do not fit the function's signature.
    """
    sig = udf.signature
    canonical: Any = (args, sorted(kwargs.items()))  # no signature: the call as spelled
    if sig is not None:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise InvalidArgument(
                f"submit {udf.ref}", f"the arguments do not fit the function: {e}", "fix the call"
            ) from None
        bound.apply_defaults()
        canonical = [
            (name, sorted(value.items()) if sig.parameters[name].kind is VAR_KEYWORD else value)
            for name, value in sorted(bound.arguments.items())
        ]
    data = codec.encode(canonical, f"arguments of {udf.ref}")
    scoped = f"\0scope={prefix}".encode() if prefix else b""
    return hashlib.sha256(udf.ref.encode() + b"\0" + data + scoped).hexdigest()
