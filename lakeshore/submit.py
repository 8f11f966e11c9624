"""Submitting: from a call to a published invocation record.

The steps, in order: validate options and bind the call to the function's signature (the
input hash), encode the arguments, look at the idempotency key, pass admission (slots and
rate tokens), take the key (create-only), upload the producer's pending files, then publish:
spilled arguments, id index, ready hint, record (create-only). Anything that fails after
admission gives its slot and token back. A key whose first submitter died between the key
object and the record is repaired by the next submit with that key, once the first had
``KEY_REPAIR_GRACE_S`` to finish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from inspect import Parameter
from typing import TYPE_CHECKING, Any

from lakeshore import codec
from lakeshore.admission import admit, give_back_rate
from lakeshore.errors import Conflict, InvalidArgument, LakeshoreError, NotFound
from lakeshore.keys import DEFAULT_QUEUE, band, id_index, new_id
from lakeshore.protocol import QueueOps
from lakeshore.record import Blob, Record
from lakeshore.run import flush
from lakeshore.scope import current_prefix
from lakeshore.store.base import CREATE
from lakeshore.udf import Udf

if TYPE_CHECKING:
    from lakeshore.dispatch import Dispatch

__all__ = ["KEY_REPAIR_GRACE_S", "KeyReused", "submit_call"]

# A key whose record is missing is repaired only once its first submitter had this long to
# finish: a younger one is probably still being written by a concurrent submit.
KEY_REPAIR_GRACE_S = 30.0


class KeyReused(LakeshoreError):
    """An idempotency key was used before with different arguments (strict mode)."""


def submit_call(
    plane: Dispatch,
    udf: Udf[Any, Any],
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
) -> str:
    """Enqueue ``udf(*args, **kwargs)``; see :meth:`Udf.submit`.

    Raises:
        InvalidArgument: unsendable arguments or a bad option.
        KeyReused: strict idempotency and the key names different arguments.
        QueueFull: admission refused the submit (or no room came within
            ``submit_timeout`` seconds on a blocking queue).
    """
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
        attempts < 1
        or (tmo is not None and tmo <= 0)
        or (deadline_s is not None and deadline_s <= 0)
    ):
        raise InvalidArgument(
            f"submit {udf.ref}",
            "max_attempts, timeout_s or deadline_s out of range",
            "use _max_attempts >= 1 and positive _timeout_s / _deadline_s",
        )
    if key is not None and (not isinstance(key, str) or not key):
        raise InvalidArgument(
            f"submit {udf.ref}", f"_key must be a non-empty str, got {key!r}", "pass a str"
        )
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
        input_hash=_input_hash(udf, args, kwargs, prefix),
        prefix=prefix,
        priority=prio,
        max_attempts=attempts,
        timeout_s=tmo,
        retry_backoff_s=next(
            b for b in (conf.retry_backoff_s, plane.retry_backoff_s) if b is not None
        ),
        lease_s=conf.lease_s or plane.lease_s,
    )
    ops = plane.ops(udf.queue)
    inv = new_id()
    limited = conf.max_depth is not None or conf.rate_limit is not None
    if key is not None:
        # An existing key returns its invocation, never refused by admission; on a limited
        # queue only look (admission comes before the key is taken).
        found = _claim_key(plane, ops, key, inv, draft.input_hash, strict_key, create=not limited)
        if found is not None and found[0] != inv:
            return _existing(plane, ops, found, draft, payload, deadline_s)
    slot, token = None, None
    if limited:
        slot, token = admit(
            ops, inv, conf.max_depth, conf.rate, conf.on_full, submit_timeout, plane.store.now
        )
        draft = dataclasses.replace(
            draft, slot=slot.n if slot else None, slot_etag=slot.etag if slot else None
        )
    try:
        if key is not None and limited:
            found = _claim_key(plane, ops, key, inv, draft.input_hash, strict_key, create=True)
            if found is not None and found[0] != inv:  # a concurrent submit took the key
                _undo_admission(plane, ops, inv, draft, token)
                return _existing(plane, ops, found, draft, payload, deadline_s)
        flush()  # the files this producer wrote for the job exist before the job does
        _publish(plane, ops, inv, draft, payload, deadline_s)
    except Conflict:
        if key is None:
            _undo_admission(plane, ops, inv, draft, token)
            raise
        # Only a key repair can have created our record first: the invocation exists.
    except BaseException:
        _undo_admission(plane, ops, inv, draft, token)
        raise
    return inv


def _existing(
    plane: Dispatch,
    ops: QueueOps,
    found: tuple[str, float],
    draft: Record,
    payload: bytes,
    deadline_s: float | None,
) -> str:
    existing, since = found
    if since > KEY_REPAIR_GRACE_S:
        try:
            ops.read(existing)
        except NotFound:
            # The first submitter died after the key object, before the record: write the
            # record now (create-only, so a slow original still wins).
            with contextlib.suppress(Conflict):
                _publish(plane, ops, existing, draft, payload, deadline_s)
    return existing


def _undo_admission(
    plane: Dispatch, ops: QueueOps, inv: str, draft: Record, token: tuple[str, str] | None
) -> None:
    """A submit that was admitted but did not happen gives its slot and token back (the
    slot only if the record really is not there)."""
    try:
        ops.read(inv)
        return
    except NotFound:
        pass
    except LakeshoreError:
        return  # cannot tell: keep the slot (a leak is repaired later; excess never is)
    ops.settle(dataclasses.replace(draft, id=inv, state="killed"))
    give_back_rate(ops, token)


def _publish(
    plane: Dispatch,
    ops: QueueOps,
    inv: str,
    draft: Record,
    payload: bytes,
    deadline_s: float | None,
) -> None:
    now = plane.store.now()
    rec = dataclasses.replace(
        draft,
        id=inv,
        args=ops.put_blob(ops.keys.args(inv), payload, plane.spill_bytes),
        deadline_at=now + deadline_s if deadline_s is not None else None,
        submitted_at=now,
    )
    if rec.queue != DEFAULT_QUEUE:
        _index(plane, inv, rec.queue)
    ops.submit(rec)
    plane._where[inv] = rec.queue


def _claim_key(
    plane: Dispatch, ops: QueueOps, key: str, inv: str, input_hash: str, strict: bool, create: bool
) -> tuple[str, float] | None:
    """Create the key object for ``inv`` (or only look, with ``create=False``). Returns the
    id the key names (``inv`` if we created it) and the seconds since the key was created;
    None when only looking and the key is free."""
    now = plane.store.now()
    if create:
        body = codec.encode({"id": inv, "input_hash": input_hash, "at": now})
        try:
            plane.store.put(ops.keys.idem(key), body, CREATE)
            return inv, 0.0
        except Conflict:
            pass
    try:
        held = codec.decode(plane.store.get(ops.keys.idem(key))[0], "idempotency key")
    except NotFound:
        return None
    if strict and held["input_hash"] != input_hash:
        raise KeyReused(
            f"submit _key={key!r}",
            f"the key already names invocation {held['id']} with different arguments",
            "use a new key, or drop _strict_key to get the existing id back",
            id=held["id"],
        )
    return str(held["id"]), now - float(held.get("at", 0.0))


def _index(plane: Dispatch, inv: str, queue: str) -> None:
    with contextlib.suppress(Conflict):
        plane.store.put(id_index(plane.ns, inv), queue.encode(), CREATE)


VAR_KEYWORD = Parameter.VAR_KEYWORD


def _input_hash(
    udf: Udf[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any], prefix: str = ""
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
