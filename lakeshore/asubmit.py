"""Async producers: ``await f.asubmit(...)`` and ``await f.amap(...)`` for code in an event
loop (FastAPI, an async Lambda handler), with the writes of :mod:`lakeshore.submit`.

A submit is prepared in the loop exactly as ``f.submit`` prepares it (options checked, the
call bound and encoded: no request, once the queue's settings are cached; reading them runs
in a thread, once per cache period). Its writes then go through the store's async verbs
(:mod:`lakeshore.protocol.apublish`), in the same order and with the same conditions: on S3
through obstore that is obstore's async client, no thread per call; memory, a local
directory and boto3 run each write in a thread (the store contract's fallback). A submit
that takes an idempotency key or passes admission (``max_depth``, ``rate_limit``) publishes
with the blocking code in one thread: those steps read, wait and retry, and stay one
implementation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from typing import Any

from lakeshore import tracing
from lakeshore.batch import Batch, batch_result, prepare_batch
from lakeshore.files.context import flush, pending
from lakeshore.plane import Plane
from lakeshore.protocol.apublish import apublish
from lakeshore.running.bodies import Declared
from lakeshore.submit import (
    Prepared,
    abandoned,
    check_options,
    prepare_call,
    publish_prepared,
)

__all__ = ["amap_calls", "apublish_prepared", "asubmit_call"]

Call = tuple[tuple[Any, ...], dict[str, Any]]


async def asubmit_call(
    plane: Plane, udf: Declared, args: tuple[Any, ...], kwargs: dict[str, Any], **options: Any
) -> str:
    """:func:`lakeshore.submit.submit_call`, awaited.

    Raises:
        as :func:`lakeshore.submit.submit_call`.
    """
    check_options(options, f"submit {udf.ref}")
    await _warm(plane, udf, options)
    prep = prepare_call(plane, udf, args, kwargs, **options)
    await _flush()
    return await apublish_prepared(prep)


async def apublish_prepared(prep: Prepared) -> str:
    """:func:`lakeshore.submit.publish_prepared`, awaited: through the store's async verbs
    when the submit needs neither a key nor admission, else the blocking code in a thread.

    Raises:
        KeyReused, QueueFull, Conflict, StoreError: as :func:`lakeshore.submit.submit_call`.
    """
    if prep.draft.key is not None or prep.limited:
        return await asyncio.to_thread(publish_prepared, prep)  # traced there, as a submit
    # the span is current in this task only: a task's context is its own copy
    with tracing.submitting(prep.draft.queue, prep.draft.fn) as traced:
        inv = await _apublish(prep.traced(traced.traceparent, traced.tracestate))
        traced.identify(inv)
        return inv


async def _apublish(prep: Prepared) -> str:
    inv = prep.new_id()
    published = await apublish(
        prep.ops,
        dataclasses.replace(prep.draft, id=inv),
        prep.payload,
        prep.plane.spill_bytes,
        prep.deadline_s,
    )
    if published is None:  # a tombstone at our id: judged dead before the ticket landed
        raise abandoned(prep.draft.fn, inv)
    prep.plane.remember(inv, published.queue)
    return inv


async def amap_calls(
    plane: Plane,
    udf: Declared,
    calls: list[Call],
    *,
    keys: Any = None,
    concurrency: int | None = None,
    **options: Any,
) -> list[str]:
    """:func:`lakeshore.batch.submit_many`, awaited: every call prepared before anything is
    written, then up to ``concurrency`` published at once in this event loop.

    Raises:
        InvalidArgument, KeyReused, MapFailed: as :func:`lakeshore.batch.submit_many`.
    """
    await _warm(plane, udf, options)
    batch: Batch = prepare_batch(plane, udf, calls, keys, concurrency, False, options)
    await _flush()
    ids: dict[int, str] = {}
    errors: dict[int, Exception] = {}
    todo = iter(batch.todo)  # shared by the publishers: one loop, so no lock

    async def publisher() -> None:
        # a few publishers that take the next call, not a task per call: a batch of a
        # million calls holds `concurrency` tasks, not a million
        for i in todo:
            try:
                ids[i] = await apublish_prepared(batch.preps[i])
            except Exception as e:  # every call is attempted; failures are reported together
                errors[i] = e

    await asyncio.gather(*(publisher() for _ in range(min(batch.workers, len(batch.todo)))))
    return batch_result(udf.ref, batch, ids, errors)


async def _warm(plane: Plane, udf: Declared, options: dict[str, Any]) -> None:
    """Make the reads ``prepare_call`` does hit caches, so it runs in the loop without
    blocking: the queue's settings (a thread, once per cache period) and, for a delayed
    submit, the store's clock (a thread only when a clock probe is due)."""
    if plane.settings.cached(udf.queue) is None:
        await asyncio.to_thread(plane.settings.get, udf.queue)
    if options.get("delay_s") is not None or isinstance(
        options.get("not_before"), datetime.datetime
    ):
        await plane.store.anow()


async def _flush() -> None:
    """The producer's written files, uploaded before the record names them (in a thread,
    and only when there are some)."""
    if pending():
        await asyncio.to_thread(flush)  # to_thread carries the block's context
