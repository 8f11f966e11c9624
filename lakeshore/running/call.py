"""Running one body, and stopping it when told to.

Two isolations. ``thread``: the body is called in place in its slot's own thread
(:func:`run_inline`; a hand-off to another thread and back cost two wake-ups per attempt,
more than a short body). Stopping is cooperative: an async body is cancelled at its next
``await``, a generator closed at its next ``yield``; a plain function cannot be stopped, and
the worker's watchdog abandons it (:mod:`lakeshore.running.attempt`). ``process``: the body
runs in the slot's child (:mod:`lakeshore.running.child`), which is killed to stop it, so a
crash of the body cannot take the worker down. :func:`call_local` calls a declared function
directly, with no queue, under the same files contract.

Either way the body's files are published only after a fence (:mod:`lakeshore.files.context`)
proves the attempt still holds its lease; a run whose lease is gone publishes nothing. Results
come back as encoded bytes (``codec.encode``), errors as text (type, message, traceback),
never as pickled exceptions. See docs/protocol.md#execution-and-isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, assert_never

from lakeshore import codec
from lakeshore.errors import (
    Fenced,
    InvalidArgument,
    LakeshoreError,
    Permanent,
    Stopped,
    Unsendable,
)
from lakeshore.files.context import RunContext, active
from lakeshore.files.root import DataRoot, Fence
from lakeshore.running.bodies import BodyKind
from lakeshore.running.failure import kinds_of, type_name
from lakeshore.running.logs import Sink, capture
from lakeshore.scope import at, current_prefix
from lakeshore.streams.journal import check_frame

__all__ = [
    "Outcome",
    "RunSpec",
    "Verdict",
    "body_error",
    "call_body",
    "call_local",
    "error_of",
    "result_bytes",
    "run_inline",
    "unpickle",
    "unsendable_error",
]

POLL_S = 0.02  # how often an async body's watcher looks at the stop flag


class Verdict(StrEnum):
    """How an attempt's body ended, as the worker saw it."""

    OK = "ok"  # returned (``Outcome.value``; None for a streaming body)
    ERROR = "error"  # raised (``Outcome.error``)
    STOPPED = "stopped"  # the stop event fired first: nothing to report
    # the worker lost sight of the body through no fault of the body's (its process was
    # killed with the fork server): handed back, the attempt not counted
    RELEASE = "release"


@dataclass
class Outcome:
    """How an attempt ended: its :class:`Verdict`, and the value or the error. ``final``: an
    error that would repeat on every attempt (an unsendable value, a body the worker cannot
    load, a nack without retry, ``lakeshore.Permanent``), so the invocation fails at once.
    ``kinds``: the names of the classes of the exception the body raised (most derived
    first), which the record's retry rule is matched against; empty for a failure that is
    not the body's own (retried as before)."""

    verdict: Verdict
    value: bytes | None = None
    error: dict[str, str] | None = None
    final: bool = False
    kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.verdict = Verdict(self.verdict)  # "ok" from a caller is Verdict.OK: `is` holds


def error_of(e: BaseException) -> dict[str, str]:
    return {
        "type": f"{type(e).__module__}.{type(e).__qualname__}".removeprefix("builtins."),
        "message": str(e),
        "traceback": "".join(traceback.format_exception(e)),
    }


# Whose frames come above a body's in its traceback: lakeshore's own (the call that ran it)
# and asyncio's (the loop of an async body).
_CALLERS = tuple(
    os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep for m in (codec, asyncio)
)


def _from_the_body(e: BaseException) -> str:
    """``e``'s traceback from the first frame that is not lakeshore's or asyncio's on: the
    reader fixes their body, not the worker that called it. A traceback with no such frame
    (the error was lakeshore's own) is kept whole; chained exceptions are kept whole."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_CALLERS):
        tb = tb.tb_next
    if tb is None:
        tb = e.__traceback__
    return "".join(traceback.format_exception(type(e), e, tb))


def body_error(e: BaseException) -> Outcome:
    """The outcome of a body that raised ``e``: its error (its traceback from the body's
    first frame) and its classes' names, final when it is a
    :class:`~lakeshore.errors.Permanent` (whose cause, if any, is named at the end of the
    message: the error's type stays the class the body raised)."""
    error = {**error_of(e), "traceback": _from_the_body(e)}
    if not isinstance(e, Permanent):
        return Outcome(Verdict.ERROR, error=error, kinds=kinds_of(e))
    cause = e.__cause__
    if cause is not None:
        said = str(cause)
        tail = f"{type_name(type(cause))}: {said}" if said else type_name(type(cause))
        error["message"] = f"{error['message']} (from {tail})" if error["message"] else tail
    return Outcome(Verdict.ERROR, error=error, final=True, kinds=kinds_of(e))


def result_bytes(kind: BodyKind, value: Any) -> bytes | None:
    """The encoded return value; None for streaming bodies, whose result is their journal.

    Raises:
        Unsendable: the value cannot be encoded (running the body again would not help).
    """
    if kind.streams:
        return None
    try:
        return codec.encode(value, "result")
    except LakeshoreError as e:
        raise Unsendable(e.op, e.what, e.todo, error_type="UnsendableValue") from None


def unsendable_error(e: Unsendable) -> dict[str, str]:
    """The invocation's error for ``e``, named by its cause (it is final: no retry)."""
    return {**error_of(e), "type": e.details.get("error_type", "UnsendableValue")}


Emit = Callable[[bytes], None]  # takes an encoded frame


def _frame(item: Any) -> bytes:
    try:
        data = codec.encode(item, "yielded value")
        check_frame(data, "stream a value")
        return data
    except InvalidArgument as e:  # refused as it is: a retry would yield it again
        raise Unsendable(e.op, e.what, e.todo, error_type="UnsendableValue") from None


@dataclass(frozen=True)
class RunSpec:
    """The files side of an attempt: the data root, the recorded scope, the name of its
    staging folder. Picklable, so a child process builds its own run context from it."""

    root: DataRoot
    prefix: str = ""
    staging_name: str = "run"


def _files(step: Callable[[Any], None], value: Any) -> None:
    """Publish or finish a body's files; contract errors repeat on a retry, so are final; a
    fenced publish means the attempt is over (its lease is gone, or it was stopped)."""
    try:
        step(value)
    except InvalidArgument as e:
        raise Unsendable(e.op, e.what, e.todo, error_type=type(e).__name__) from None
    except Fenced:
        raise Stopped from None


def call_body(
    fn: Callable[..., Any],
    kind: BodyKind,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    stop: threading.Event,
    emit: Emit,
    spec: RunSpec | None = None,
    in_child: bool = False,
    fence: Fence | None = None,
) -> bytes | None:
    """Run a body of any kind to completion under its run context (scope and files) and
    return its encoded result (None for streaming bodies). Generator bodies hand each
    encoded yield to ``emit`` (the journal) after uploading the files it names; they stop at
    the next yield once ``stop`` is set. Values are encoded before their files are
    published, so an unsendable value never leaves orphaned files behind. ``fence`` is asked
    before each batch of uploads (see :data:`lakeshore.files.root.Fence`); when it says the lease is
    gone, nothing is published and the run ends as stopped."""
    if spec is None:
        return result_bytes(kind, _body(fn, kind, args, kwargs, stop, emit, None))
    ctx = RunContext(
        spec.root,
        "body",
        prefix=spec.prefix,
        staging_name=spec.staging_name,
        in_child=in_child,
        fence=fence,
        stop=stop,
    )
    try:
        with ctx.activate(), at(spec.prefix):
            value = _body(fn, kind, args, kwargs, stop, emit, ctx)
        if stop.is_set():
            raise Stopped  # cancelled or timed out meanwhile: publish nothing
        data = result_bytes(kind, value)
        verb = "yield" if kind.streams else "return"
        _files(lambda v: ctx.finish(v, verb), value)
        return data
    finally:
        ctx.close()


def _body(
    fn: Callable[..., Any],
    kind: BodyKind,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    stop: threading.Event,
    emit: Emit,
    ctx: RunContext | None,
) -> Any:
    def out(item: Any) -> None:
        if stop.is_set():
            raise Stopped  # stopped while it computed this item: publish nothing more
        data = _frame(item)
        if ctx is not None:
            _files(ctx.publish, item)
        emit(data)

    async def watch(awaitable: Any) -> Any:
        task = asyncio.ensure_future(awaitable)
        while not task.done():
            await asyncio.wait({task}, timeout=POLL_S)
            if stop.is_set():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise Stopped
        return task.result()

    async def drain() -> None:
        async for item in fn(*args, **kwargs):
            out(item)

    match kind:
        case BodyKind.SYNC:
            return fn(*args, **kwargs)
        case BodyKind.GENERATOR:
            gen = fn(*args, **kwargs)
            try:
                for item in gen:
                    out(item)
                    if stop.is_set():
                        raise Stopped
            finally:
                gen.close()
            return None
        case BodyKind.ASYNC:
            return asyncio.run(watch(fn(*args, **kwargs)))
        case BodyKind.ASYNCGEN:
            return asyncio.run(watch(drain()))
        case unknown:
            assert_never(unknown)


def run_inline(
    fn: Callable[..., Any],
    kind: BodyKind,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    stop: threading.Event,
    emit: Emit,
    spec: RunSpec | None = None,
    log: Sink | None = None,
    prelude: Callable[[], Any] | None = None,
    fence: Fence | None = None,
) -> Outcome:
    """Run the body in the calling thread, in a fresh ``contextvars`` context (as a new
    thread would have), and return how it ended. Its prints and log records go to ``log``;
    ``prelude`` (the ``before_job`` hook) runs first, in the body's context; ``fence``
    guards the uploads of its files. A body that does not stop when ``stop`` fires keeps
    this thread: whoever runs it must be able to walk away from the thread (the worker's
    watchdog does, see :mod:`lakeshore.running.attempt`)."""
    box: list[Outcome] = []

    def body() -> None:
        try:
            with capture(log):
                if prelude is not None:
                    prelude()
                data = call_body(fn, kind, args, kwargs, stop, emit, spec, fence=fence)
            box.append(Outcome(Verdict.OK, value=data))
        except Stopped:
            box.append(Outcome(Verdict.STOPPED))
        except Unsendable as e:
            box.append(Outcome(Verdict.ERROR, error=unsendable_error(e), final=True))
        except BaseException as e:
            box.append(body_error(e))

    contextvars.Context().run(body)
    return box[0]


def unpickle(data: bytes) -> Any:
    """Load a pickled callable (only ever called where the worker opted in)."""
    import pickle

    return pickle.loads(data)


def call_local(
    fn: Callable[..., Any],
    kind: BodyKind,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    root: Callable[[], DataRoot],
) -> Any:
    """Call a decorated function directly (no queue) under the same files contract as on a
    worker: its writes go to ``root`` (or the enclosing body's root) once it returns or
    yields their keys. Generators and coroutines are wrapped, so the contract applies when
    they are iterated or awaited."""
    outer = active()
    if outer is not None:  # inside a body: its uploads are fenced by the body's lease too
        ctx = outer.local_call(current_prefix())
    else:
        ctx = RunContext(root, "local", prefix=current_prefix())
    match kind:
        case BodyKind.GENERATOR:
            return _local_gen(ctx, fn(*args, **kwargs))
        case BodyKind.ASYNCGEN:
            return _local_agen(ctx, fn(*args, **kwargs))
        case BodyKind.ASYNC:
            return _local_coro(ctx, fn(*args, **kwargs))
        case BodyKind.SYNC:
            try:
                with ctx.activate():
                    value = fn(*args, **kwargs)
                ctx.finish(value)
                return value
            finally:
                ctx.close()
        case unknown:
            assert_never(unknown)


def _local_gen(ctx: RunContext, gen: Any) -> Any:
    try:
        while True:
            # only while the body runs, in the scope it was called in: the caller's code
            # between yields must not see the body's files
            with ctx.activate(), at(ctx.prefix):
                try:
                    item = next(gen)
                except StopIteration:
                    break
            ctx.publish(item)
            yield item
        ctx.finish(None, "yield")
    finally:
        gen.close()
        ctx.close()


async def _local_agen(ctx: RunContext, agen: Any) -> Any:
    try:
        while True:
            with ctx.activate(), at(ctx.prefix):
                try:
                    item = await agen.__anext__()
                except StopAsyncIteration:
                    break
            ctx.publish(item)
            yield item
        ctx.finish(None, "yield")
    finally:
        await agen.aclose()
        ctx.close()


async def _local_coro(ctx: RunContext, coro: Any) -> Any:
    try:
        with ctx.activate(), at(ctx.prefix):
            value = await coro
        ctx.finish(value)
        return value
    finally:
        ctx.close()
