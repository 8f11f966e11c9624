"""Traces (docs/tracing.md), read with the OpenTelemetry SDK's in-memory exporter: a
producer's trace continues in the worker's spans (one Dispatch, and a Dispatch per side),
the run span's attributes, error status on a failing body, nothing written without a
current span or without a tracer provider, a hostile ``traceparent`` in a record ignored,
and nothing of OpenTelemetry imported by lakeshore when a program does not use it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags

import lakeshore as dls
from lakeshore import keys, tracing
from lakeshore.codec import unpack_plain
from lakeshore.store import Store
from tests import jobs
from tests.handmade import handmade, put_by_hand
from tests.tiers import make_plane

ROOT = Path(__file__).resolve().parents[2]
ALLOW = ["tests.jobs:*", "tests.queue.test_tracing:*"]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A tracer provider of the SDK, set for this test only, its spans kept in memory.
    (``set_tracer_provider`` takes once a process: the global is set the way the SDK's
    own tests set it, and put back after the test.)"""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in exporter.get_finished_spans():
        out.setdefault(s.name, []).append(s)
    return out


def _raw(q: Any, inv: str) -> dict[str, Any]:
    ops = q.plane.ops("default")
    obj: dict[str, Any] = unpack_plain(q.store.get(ops.keys.ticket_of_id(inv) or "")[0])
    return obj


def _continues(worker_span: ReadableSpan, submit: ReadableSpan) -> bool:
    parent, ctx = worker_span.parent, submit.context
    assert parent is not None and ctx is not None and worker_span.context is not None
    return (
        parent.span_id == ctx.span_id
        and parent.is_remote  # restored from the record, not inherited in this thread
        and worker_span.context.trace_id == ctx.trace_id
    )


def test_a_producers_trace_continues_in_the_workers_spans(
    atomic_store: Store, spans: InMemorySpanExporter
) -> None:
    q = make_plane(atomic_store)
    f = q.udf(jobs.add_one)
    with trace.get_tracer("test").start_as_current_span("request") as request:
        inv = f.submit(41)
    raw = _raw(q, inv)
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    assert q.result(inv, timeout=5) == 42
    got = _by_name(spans)
    (submit,) = got["lakeshore.submit"]
    assert submit.parent is not None and submit.parent.span_id == request.get_span_context().span_id
    assert submit.attributes is not None and submit.attributes["lakeshore.invocation.id"] == inv
    assert raw["v"] == 1 and raw["traceparent"].split("-")[2] == f"{submit.context.span_id:016x}"
    for name in ("lakeshore.claim", "lakeshore.run", "lakeshore.finish"):
        (span,) = got[name]
        assert _continues(span, submit), name
    (run,) = got["lakeshore.run"]
    assert dict(run.attributes or {}) == {
        "lakeshore.invocation.id": inv,
        "lakeshore.queue": "default",
        "lakeshore.function": "tests.jobs:add_one",
        "lakeshore.attempt": 1,
    }
    assert run.status.status_code is StatusCode.UNSET
    (claim,) = got["lakeshore.claim"]
    (finish,) = got["lakeshore.finish"]
    assert claim.end_time <= run.start_time and run.end_time <= finish.start_time  # type: ignore[operator]
    assert (finish.attributes or {})["lakeshore.state"] == "succeeded"


def test_the_trace_crosses_from_a_producers_dispatch_to_a_workers(
    atomic_store: Store, spans: InMemorySpanExporter
) -> None:
    """Two Dispatch objects on one store, as a Lambda producer and a SLURM worker hold."""
    producer, worker = make_plane(atomic_store), make_plane(atomic_store)
    with trace.get_tracer("test").start_as_current_span("lambda handler"):
        inv = producer.udf(jobs.add_one).submit(1)
    assert dls.run_worker(worker, once=True, isolation="thread", allow=ALLOW) == 1
    assert producer.result(inv, timeout=5) == 2
    got = _by_name(spans)
    (submit,) = got["lakeshore.submit"]
    (run,) = got["lakeshore.run"]
    assert _continues(run, submit)


def test_an_async_submit_is_traced_as_a_blocking_one(
    atomic_store: Store, spans: InMemorySpanExporter
) -> None:
    """asubmit and amap, unkeyed (the store's async verbs) and keyed (a thread): each
    submit gets its span and its record the trace, which the worker continues."""
    q = make_plane(atomic_store)
    f = q.udf(jobs.add_one)

    async def produce() -> list[str]:
        with trace.get_tracer("test").start_as_current_span("request"):
            one = await f.asubmit(1)
            many = await f.amap([2, 3])
            keyed = await f.asubmit(4, _key="k")  # type: ignore[call-arg]
        return [one, *many, keyed]

    ids = asyncio.run(produce())
    got = _by_name(spans)
    (request,) = got["request"]
    submits = {(s.attributes or {})["lakeshore.invocation.id"]: s for s in got["lakeshore.submit"]}
    assert sorted(submits) == sorted(ids)
    for inv in ids:
        submit = submits[inv]
        assert submit.parent is not None and submit.parent.span_id == request.context.span_id
        assert _raw(q, inv)["traceparent"].split("-")[2] == f"{submit.context.span_id:016x}"
    assert dls.run_worker(q, isolation="thread", max_jobs=4, idle_exit=5) == 4
    ran = _by_name(spans)["lakeshore.run"]
    runs = {(s.attributes or {})["lakeshore.invocation.id"]: s for s in ran}
    assert all(_continues(runs[inv], submits[inv]) for inv in ids)


def traced_body(x: int) -> str:
    """A body that makes a span of its own: it nests inside lakeshore.run."""
    with trace.get_tracer("body").start_as_current_span("inside the body") as span:
        return f"{span.get_span_context().trace_id:032x}"


def test_a_body_in_the_slots_thread_makes_its_spans_inside_the_run_span(
    atomic_store: Store, spans: InMemorySpanExporter
) -> None:
    q = make_plane(atomic_store)
    with trace.get_tracer("test").start_as_current_span("request") as request:
        inv = q.udf(traced_body).submit(1)
    dls.run_worker(q, once=True, isolation="thread")
    assert q.result(inv, timeout=5) == f"{request.get_span_context().trace_id:032x}"
    got = _by_name(spans)
    (inner,) = got["inside the body"]
    (run,) = got["lakeshore.run"]
    assert inner.parent is not None and inner.parent.span_id == run.context.span_id


def test_a_body_in_a_process_is_timed_by_the_run_span_of_its_slot(
    local_plane: Any, spans: InMemorySpanExporter
) -> None:
    q = local_plane
    with trace.get_tracer("test").start_as_current_span("request"):
        inv = q.udf(jobs.add_one).submit(1)
    assert dls.run_worker(q, once=True, isolation="process") == 1
    assert q.result(inv, timeout=5) == 2
    got = _by_name(spans)
    assert _continues(got["lakeshore.run"][0], got["lakeshore.submit"][0])


def body_in_a_process(x: int) -> list[str]:
    """A body run in a body process, with a tracer provider of its own (the worker's is
    not there): its span's trace id and parent span id, as hex."""
    from opentelemetry.sdk.trace import TracerProvider as Provider

    with Provider().get_tracer("body").start_as_current_span("in the child") as span:
        parent = getattr(span, "parent", None)
        return [
            f"{span.get_span_context().trace_id:032x}",
            f"{parent.span_id:016x}" if parent is not None else "",
        ]


def test_a_body_in_a_process_makes_its_spans_inside_the_run_span(
    local_plane: Any, spans: InMemorySpanExporter
) -> None:
    q = local_plane
    with trace.get_tracer("test").start_as_current_span("request") as request:
        inv = q.udf(body_in_a_process).submit(1)
    assert dls.run_worker(q, once=True, isolation="process") == 1
    trace_id, parent = q.result(inv, timeout=5)
    (run,) = _by_name(spans)["lakeshore.run"]
    assert trace_id == f"{request.get_span_context().trace_id:032x}"
    assert parent == f"{run.context.span_id:016x}"


@pytest.fixture
def local_plane(tmp_path: Path) -> Any:
    from lakeshore.store import LocalStore

    return make_plane(LocalStore(tmp_path / "plane"))


def test_a_failing_body_marks_the_run_span_as_an_error(
    atomic_store: Store, spans: InMemorySpanExporter
) -> None:
    q = make_plane(atomic_store)
    with trace.get_tracer("test").start_as_current_span("request"):
        inv = q.udf(jobs.fail_always).submit("boom", _max_attempts=1)
    dls.run_worker(q, once=True, isolation="thread")
    assert q.status(inv) == "failed"
    got = _by_name(spans)
    (run,) = got["lakeshore.run"]
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description is not None and "boom" in run.status.description
    (event,) = run.events
    assert event.name == "exception" and "boom" in str((event.attributes or {}).values())
    (finish,) = got["lakeshore.finish"]
    assert (finish.attributes or {})["lakeshore.state"] == "failed"
    assert finish.status.status_code is StatusCode.UNSET  # the write itself went well


def test_no_field_is_written_without_a_current_span(
    atomic_store: Store, spans: InMemorySpanExporter
) -> None:
    q = make_plane(atomic_store)
    inv = q.udf(jobs.add_one).submit(1)
    raw = _raw(q, inv)
    assert raw["v"] == 1 and "traceparent" not in raw
    dls.run_worker(q, once=True, isolation="thread")
    got = _by_name(spans)
    assert "lakeshore.submit" not in got
    (run,) = got["lakeshore.run"]
    assert run.parent is None  # the worker's spans start a trace of their own


class BrokenSampler(Sampler):
    """A sampler with a bug: every span's start raises."""

    def should_sample(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("sampler bug")

    def get_description(self) -> str:
        return "broken"


class BrokenProcessor(SpanProcessor):
    """A span processor with a bug: every span's end raises."""

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("processor bug")


@pytest.mark.parametrize("broken", ["start", "end"])
def test_a_broken_tracer_neither_fails_a_submit_nor_stops_a_worker(
    atomic_store: Store, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """A span is a view of the work: a tracer that raises reads as tracing off."""
    if broken == "start":
        provider = TracerProvider(sampler=BrokenSampler())
    else:
        provider = TracerProvider()
        provider.add_span_processor(BrokenProcessor())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    q = make_plane(atomic_store)
    f = q.udf(jobs.add_one)
    with trace.use_span(NonRecordingSpan(remote)):
        inv = f.submit(1)
        other = asyncio.run(f.asubmit(2))
    assert dls.run_worker(q, isolation="thread", max_jobs=2, idle_exit=5) == 2
    assert q.result(inv, timeout=5) == 2 and q.result(other, timeout=5) == 3


def test_without_a_tracer_provider_nothing_is_written_nor_traced(atomic_store: Store) -> None:
    """OpenTelemetry imported, a valid span current (as extracted from a request), but no
    provider set: lakeshore makes no span and writes no field."""
    assert not tracing.active()
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1))
    q = make_plane(atomic_store)
    with trace.use_span(NonRecordingSpan(remote)):
        inv = q.udf(jobs.add_one).submit(1)
    raw = _raw(q, inv)
    assert raw["v"] == 1 and "traceparent" not in raw
    assert dls.run_worker(q, once=True, isolation="thread") == 1


@pytest.mark.parametrize(
    "hostile", ["00-zz-yy-01", "0" * 10_000, 7, ["x"], "00-" + "0" * 32 + "-b7ad6b7169203331-01"]
)
def test_a_hostile_traceparent_is_ignored_and_the_invocation_runs(
    atomic_store: Store, spans: InMemorySpanExporter, hostile: Any
) -> None:
    q = make_plane(atomic_store)
    q.udf(jobs.add_one)
    inv = keys.new_id()
    obj = handmade(q, inv, v=2, traceparent=hostile, tracestate="a=b")
    put_by_hand(q, inv, msgpack.packb(obj, use_bin_type=True))
    assert dls.run_worker(q, once=True, isolation="thread") == 1
    assert q.result(inv, timeout=5) == 2
    (run,) = _by_name(spans)["lakeshore.run"]
    assert run.parent is None


_BLOCKED = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"{name} is blocked (as if not installed)")
        return None

sys.meta_path.insert(0, Block())
"""

_WORK = """
import sys
import lakeshore as dls
from lakeshore import tracing
from tests import jobs

q = dls.Dispatch(":memory:")
inv = q.udf(jobs.add_one).submit(1)
assert dls.run_worker(q, once=True, isolation="thread") == 1
assert q.result(inv, timeout=5) == 2
assert not tracing.active()
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
assert not loaded, loaded
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_program_that_does_not_trace_imports_nothing_of_opentelemetry() -> None:
    done = _python(_WORK)  # installed here, but never asked for
    assert done.returncode == 0, done.stderr


def test_without_the_extra_lakeshore_runs_and_an_explicit_ask_names_it() -> None:
    code = (
        _BLOCKED
        + _WORK
        + """
from lakeshore.errors import InvalidArgument
try:
    tracing.require()
except InvalidArgument as e:
    assert "lakeshore-queue[otel]" in str(e), e
else:
    raise AssertionError("require() passed without opentelemetry")
"""
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr


def test_a_body_that_imports_opentelemetry_itself_still_continues_the_trace(
    local_plane: Any, spans: InMemorySpanExporter
) -> None:
    q = local_plane
    with trace.get_tracer("test").start_as_current_span("request") as request:
        inv = q.udf(jobs.span_ids_lazily).submit()
    assert dls.run_worker(q, once=True, isolation="process") == 1
    trace_id, parent, _ = q.result(inv, timeout=5)
    (run,) = _by_name(spans)["lakeshore.run"]
    assert trace_id == f"{request.get_span_context().trace_id:032x}"
    assert parent == f"{run.context.span_id:016x}"
