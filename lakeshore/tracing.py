"""Traces: a producer's trace continued by the worker that runs its invocation.

With OpenTelemetry's API installed (the ``otel`` extra) and a tracer provider set by the
program, a submit made inside a span gets a ``lakeshore.submit`` span, whose W3C trace
context is stored in the record (``traceparent``, ``tracestate``). The worker's attempt
takes that context as the parent of its spans: ``lakeshore.claim`` (the claim that took
it), ``lakeshore.run`` (around the body) and ``lakeshore.finish`` (the outcome's write), so
one trace reads from the producer's request to the worker's result (docs/tracing.md).

This is the only module that imports ``opentelemetry``, and never by itself: tracing is on
when the program has imported it and set a tracer provider (looked up on every use, a
dictionary lookup while it has not), so a program without it pays nothing and loads
nothing. :func:`require` is the explicit ask, which names the extra when it is missing.
A span is a view of the queue's work, never part of it: a broken setup (the provider's
lookup raising) reads as tracing off, OpenTelemetry's API does not raise by design, and
what a record says about its trace was checked on read (``lakeshore.model.trace_context``).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from lakeshore.errors import InvalidArgument
from lakeshore.model.record import Record
from lakeshore.model.trace_context import checked_trace

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

__all__ = ["INSTALL_HINT", "active", "continued", "current", "require"]

INSTALL_HINT = "pip install 'lakeshore-queue[otel]'"
_API = "opentelemetry.trace"
_api_missing = False  # its import failed once in this process (see _api_importable)
_DESCRIPTION = 256  # characters of an error's type and message on a span's status
_cached: tuple[object, Tracer] | None = None  # (provider, its tracer)
log = logging.getLogger("lakeshore.tracing")
_warned = False


def _broken(what: str, e: Exception) -> None:
    """A call into the tracer raised: say so (a warning once a process, then at debug
    level) and go on without that span; the submit or the attempt goes on as untraced."""
    global _warned
    level, _warned = (logging.DEBUG if _warned else logging.WARNING), True
    log.log(level, "tracing: %s failed, going on without it: %s: %s", what, type(e).__name__, e)


def require(op: str = "trace") -> None:
    """Ask for tracing explicitly: import OpenTelemetry's API, or say how to install it.
    Spans are made once the program sets a tracer provider (:func:`active`).

    Raises:
        InvalidArgument: ``opentelemetry-api`` is not installed.
    """
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        raise InvalidArgument(
            op, "OpenTelemetry's API is not installed", f"install the extra: {INSTALL_HINT}"
        ) from None


def active() -> bool:
    """Whether lakeshore makes spans in this process: OpenTelemetry's API was imported
    and a tracer provider set (not its default proxy, not a no-op one)."""
    return _tracer() is not None


def _tracer() -> Tracer | None:
    global _cached
    if _API not in sys.modules:  # nobody imported it: no provider can have been set
        return None
    try:
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None
        cached = _cached
        if cached is not None and cached[0] is provider:
            return cached[1]
        tracer = provider.get_tracer("lakeshore")
        _cached = (provider, tracer)
        return tracer
    except Exception:  # a broken setup: no spans, never a failed submit or attempt
        return None


def _attributes(rec: Record) -> dict[str, Any]:
    return {
        "lakeshore.invocation.id": rec.id,
        "lakeshore.queue": rec.queue,
        "lakeshore.function": rec.fn,
        "lakeshore.attempt": rec.attempt,
    }


def _parent(rec: Record) -> Context | None:
    """The producer's context a record carries (checked when the record was read), or None:
    then the worker's spans start a trace of their own."""
    if not rec.traceparent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": rec.traceparent}
    if rec.tracestate:
        carrier["tracestate"] = rec.tracestate
    return TraceContextTextMapPropagator().extract(carrier)


def _failed(span: Span, kind: str, message: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}"[:_DESCRIPTION]))
    span.add_event("exception", {"exception.type": kind, "exception.message": message})


class _Off:
    """What the context managers below give while tracing is off: nothing, at no cost."""

    traceparent = ""  # a submit's trace context for its record, "" for none
    tracestate = ""

    def __enter__(self) -> _Off:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def identify(self, inv: str) -> None:
        """Name the invocation a submit published (nothing while tracing is off)."""

    def ended(self, error: Mapping[str, str] | None = None, halt: str = "") -> None:
        """How the body or the write ended (nothing while tracing is off)."""


_OFF = _Off()


class _Traced(_Off):
    """One span, current in this thread between enter and exit, ended on exit; an
    exception that leaves the block marks it failed."""

    def __init__(
        self, tracer: Tracer, name: str, kind: Any, parent: Context | None, attributes: Any
    ) -> None:
        self._start = (tracer, name, kind, parent, attributes)
        self._token: object = None
        self.span: Span | None = None

    def __enter__(self) -> _Traced:
        from opentelemetry import context, trace

        tracer, name, kind, parent, attributes = self._start
        try:
            span = tracer.start_span(name, parent, kind, attributes)
        except Exception as e:  # a broken tracer (its sampler, a processor): no span
            _broken(f"the start of {name}", e)
            return self
        self.span = span
        self._token = context.attach(trace.set_span_in_context(span, parent))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        from opentelemetry import context

        span = self.span
        if span is None:
            return
        try:
            try:
                context.detach(self._token)  # type: ignore[arg-type]
                if kind is not None:
                    what = f"{kind.__module__}.{kind.__qualname__}"
                    _failed(span, what, str(e)[:_DESCRIPTION])
            finally:
                span.end()
        except Exception as problem:  # e.g. a span processor's on_end raised
            _broken(f"the end of {self._start[1]}", problem)


class _Submit(_Traced):
    def __enter__(self) -> _Submit:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        super().__enter__()
        if self.span is None:  # no span: the record is written untraced
            return self
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)  # the lakeshore.submit span's
        checked = checked_trace(carrier.get("traceparent"), carrier.get("tracestate", ""))
        self.traceparent, self.tracestate = checked
        return self

    def identify(self, inv: str) -> None:
        if self.span is not None:
            self.span.set_attribute("lakeshore.invocation.id", inv)


class _Run(_Traced):
    def ended(self, error: Mapping[str, str] | None = None, halt: str = "") -> None:
        if self.span is None:
            return
        if error is not None:
            message = error.get("message", "")[:_DESCRIPTION]
            _failed(self.span, error.get("type", "error"), message)
        elif halt in ("timeout", "killed", "lost"):  # stopped by the worker, not by the body
            _failed(self.span, f"lakeshore.{halt}", f"the worker stopped the body: {halt}")
        if halt:
            self.span.set_attribute("lakeshore.halt", halt)


class _Finish(_Traced):
    def ended(self, error: Mapping[str, str] | None = None, halt: str = "") -> None:
        if self.span is not None:
            self.span.set_attribute("lakeshore.state", halt)  # what the write left it in


def submitting(queue: str, fn: str) -> _Off:
    """The ``lakeshore.submit`` span around one submit's writes, made only inside a span of
    the producer's: its ``fields`` are the record's ``traceparent`` and ``tracestate``
    (empty while tracing is off, or outside any span: the record is written untraced)."""
    tracer = _tracer()
    if tracer is None:
        return _OFF
    from opentelemetry import trace

    try:
        if not trace.get_current_span().get_span_context().is_valid:
            return _OFF
    except Exception:
        return _OFF
    attributes = {"lakeshore.queue": queue, "lakeshore.function": fn}
    return _Submit(tracer, "lakeshore.submit", trace.SpanKind.PRODUCER, None, attributes)


def clock() -> int:
    """Now in nanoseconds when tracing is on (when a claim starts), else 0."""
    return time.time_ns() if _tracer() is not None else 0


def claimed(rec: Record, started_ns: int) -> None:
    """The ``lakeshore.claim`` span of the claim that took ``rec``, from ``started_ns``
    (:func:`clock`) to now. Made once the claim succeeded, as the record names its parent:
    a worker's idle polls make no spans."""
    tracer = _tracer() if started_ns else None
    if tracer is None:
        return
    from opentelemetry import trace

    kind, parent = trace.SpanKind.CONSUMER, _parent(rec)
    try:
        name, attributes = "lakeshore.claim", _attributes(rec)
        tracer.start_span(name, parent, kind, attributes, None, started_ns).end()
    except Exception as e:  # a broken tracer: the claim holds, with no span
        _broken("the lakeshore.claim span", e)


def running(rec: Record) -> _Off:
    """The ``lakeshore.run`` span around an attempt's body, current in the slot's thread
    (a body run there makes its own spans inside it); ``ended`` marks a body that raised
    or that the worker stopped."""
    tracer = _tracer()
    if tracer is None:
        return _OFF
    from opentelemetry import trace

    return _Run(tracer, "lakeshore.run", trace.SpanKind.CONSUMER, _parent(rec), _attributes(rec))


def carried(prelude: Callable[[], object] | None) -> Callable[[], object] | None:
    """``prelude`` (run first in a body's fresh ``contextvars`` context), preceded by making
    the span current in this thread (``lakeshore.run``) current there too: the body's own
    spans are its children. ``prelude`` itself while tracing is off."""
    if _tracer() is None:
        return prelude
    from opentelemetry import context

    current = context.get_current()

    def first() -> object:
        context.attach(current)  # detached with the body's context, which is dropped after
        return prelude() if prelude is not None else None

    return first


def current() -> tuple[str, str]:
    """The current span's W3C trace context as ``(traceparent, tracestate)``, ``("", "")``
    while tracing is off or no span is current: what a body process continues."""
    if _tracer() is None:
        return "", ""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return checked_trace(carrier.get("traceparent"), carrier.get("tracestate", ""))


def _api_importable() -> bool:
    """OpenTelemetry's API, imported if it is installed (a failed import is not tried
    again in this process: a search of the path per attempt is no small cost)."""
    global _api_missing
    if _API in sys.modules:
        return True
    if _api_missing:
        return False
    try:
        importlib.import_module(_API)
    except ImportError:
        _api_missing = True
        return False
    return True


@contextlib.contextmanager
def continued(traceparent: str, tracestate: str) -> Iterator[None]:
    """In a body process: the worker's ``lakeshore.run`` span (its :func:`current` context,
    sent with the body) current around the body, so that the spans the body makes are its
    children. Nothing without a context. With one, the worker traced this attempt, so the
    API is imported here if it is installed (once a process): a body that imports
    OpenTelemetry only when it runs must still find its parent current."""
    if not traceparent or not _api_importable():
        yield
        return
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    token = context.attach(TraceContextTextMapPropagator().extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


def finishing(rec: Record) -> _Off:
    """The ``lakeshore.finish`` span around an attempt's outcome write; ``ended`` names the
    state it left the invocation in. An error of the write marks it failed."""
    tracer = _tracer()
    if tracer is None:
        return _OFF
    from opentelemetry import trace

    kind = trace.SpanKind.INTERNAL
    return _Finish(tracer, "lakeshore.finish", kind, _parent(rec), _attributes(rec))
